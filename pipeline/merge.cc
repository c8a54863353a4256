// RunMerge: flatten a point into a new full backup, verify it, then switch
// over through the merge journal.
#include "pipeline/merge.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

#include "blockio/env.h"
#include "blockio/path.h"
#include "formats/digest_table.h"
#include "formats/qcow2_check.h"
#include "pipeline/base_refs.h"
#include "pipeline/chain.h"
#include "pipeline/chain_folder.h"
#include "pipeline/destination_spec.h"
#include "pipeline/endpoints.h"
#include "pipeline/export_lock.h"
#include "pipeline/object_lock.h"
#include "pipeline/staged_file.h"
#include "pipeline/verification_record.h"

namespace barge::pipeline {

namespace {

// A manifest's "compression" ("zstd:2", "zlib:6", "none"), by the one rule
// of formats::ParseCompressionSpec; anything else is Corruption.
Result<std::pair<formats::Compression, int>> ParseManifestCompression(const std::string& text) {
  auto spec = formats::ParseCompressionSpec(text);
  if (!spec.ok()) return Error::Corruption("bad compression in manifest: " + spec.error().message());
  return std::pair{spec->type, spec->level};
}

// Re-reads the staged image on its own (no backing file may exist) and
// checks its structure, every cluster's digest and the image digest.
// A merged point of a chain over a base (docs/formats/backup.md, "Chains
// over a base") re-reads through its base: the backing file it must name,
// the folders it may read in, and the digests every cluster must have.
struct MergeBase {
  std::string backing_file;
  std::vector<std::string> dirs;
  formats::DigestTable effective;  // the base's effective digests under the new table
};

Status VerifyStagedImage(Env& env, const std::string& path, const formats::DigestTable& table,
                         const formats::Digest128& image_digest, formats::ImageDigestAlgorithm algorithm,
                         const CopyOptions& knobs,
                         const MergeBase* base = nullptr) {
  {
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, env.OpenSource(path));
    auto report = formats::qcow2::CheckQcow2(*file);
    if (!report.ok()) return Error(report.error()).set_path(path);
    if (!report->clean()) {
      return Error::Corruption("the merged image fails its structure check").set_path(path);
    }
  }
  formats::OpenOptions options;
  options.format = formats::ImageFormat::kQcow2;
  options.allowed_dirs = {DirName(path)};
  formats::DigestTable expected = table;
  if (base != nullptr) {
    options.allowed_dirs.insert(options.allowed_dirs.end(), base->dirs.begin(), base->dirs.end());
    const formats::DigestTable* layers[] = {&base->effective, &table};
    BARGE_ASSIGN_OR_RETURN(expected, formats::MergeDigestTables(layers));
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<formats::Image> image, OpenImageFile(env, path, options));
  if (base == nullptr && (image->backing() != nullptr || !image->info().backing_file.empty())) {
    return Error::Corruption("the merged image has a backing file").set_path(path);
  }
  if (base != nullptr && image->info().backing_file != base->backing_file) {
    return Error::Corruption("the merged image does not name its base " + base->backing_file).set_path(path);
  }
  const formats::Digest128 zero = formats::ZeroClusterDigest(table.cluster_bytes);
  CopyOptions copy = knobs;
  copy.progress = nullptr;
  copy.compression = formats::Compression::kNone;
  copy.digest_algorithm = algorithm;
  copy.skip_zero_extents = true;
  copy.verify_zero_run = [&expected](uint64_t b, uint64_t e) { return FirstListedData(expected, b, e); };
  copy.verify = [&expected, zero](uint64_t c) -> std::optional<formats::Digest128> {
    if (auto d = FindDigest(expected, c)) return d;
    return zero;
  };
  auto copied = RunCopy(*image, WholeDisk(*image), {}, copy);
  if (!copied.ok()) return Error(copied.error()).Wrap("re-reading the merged image");
  if (copied->image_digest != image_digest) {
    return Error::Corruption("the merged image's digest differs from the point's").set_path(path);
  }
  return OkStatus();
}

// What step 1 staged: the sizes the journal records.
struct Staged {
  uint64_t image_bytes = 0;
  uint64_t digests_bytes = 0;
  uint64_t manifest_bytes = 0;
  formats::BackupManifest manifest;
  uint64_t bytes_read = 0;
};

}  // namespace

Result<bool> HoldsBackups(Env& env, const std::string& dir) {
  auto st = env.Stat(dir);
  if ((st.ok() && !st->is_directory()) || (!st.ok() && st.error().code() == ErrorCode::kNotFound)) {
    return Error::NotFound("no such chain folder (nothing backed up under this name?)").set_path(dir);
  }
  if (!st.ok()) return st.error();
  BARGE_ASSIGN_OR_RETURN(bool journal, MergeJournalExists(env, dir));
  if (journal) return true;
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  return std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return !n.empty() && n[0] != '.' && n.ends_with(".json");
  });
}

namespace {

// The point a merge folds, its layers, and the names its new files are
// staged under (".NAME.merge-new") until the journal renames them.
struct MergePlan {
  MergePlan(const ChainFolder& c, size_t i, std::vector<size_t> l)
      : chain(c),
        index(i),
        layers(std::move(l)),
        pm(c.points[i].manifest),
        manifest_name(BaseName(c.points[i].manifest_path)),
        image_staged(c.PathOf(MergeStagedName(pm.image))),
        digests_staged(c.PathOf(MergeStagedName(pm.digest_table))),
        manifest_staged(c.PathOf(MergeStagedName(manifest_name))) {}
  const ChainFolder& chain;
  size_t index;
  std::vector<size_t> layers;  // oldest (the full) first, the point last
  const formats::BackupManifest& pm;
  std::string manifest_name;
  std::string image_staged, digests_staged, manifest_staged;

  // Before the journal: the folder goes back to what it was.
  void RemoveStaged(Env& env, Error& e) const {
    for (const std::string& p : {image_staged, digests_staged, manifest_staged}) e.Also(env.UnlinkIfExists(p));
  }
  // The ids folded, oldest first, the point's last.
  std::vector<std::string> FoldedIds() const {
    std::vector<std::string> ids;
    for (size_t k = 0; k < layers.size(); ++k) ids.push_back(chain.points[layers[k]].manifest.id);
    return ids;
  }
  // The files of the layers below the point: manifests first.
  std::vector<std::string> RemovedFiles() const {
    std::vector<std::string> files;
    for (size_t k = 0; k + 1 < layers.size(); ++k) files.push_back(BaseName(chain.points[layers[k]].manifest_path));
    for (size_t k = 0; k + 1 < layers.size(); ++k) {
      files.push_back(chain.points[layers[k]].manifest.image);
      files.push_back(chain.points[layers[k]].manifest.digest_table);
      const std::string& strong = chain.points[layers[k]].manifest.strong_digest_table;
      if (!strong.empty()) files.push_back(strong);
    }
    return files;
  }
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Refuses when a point outside this line still builds on a layer we remove.
Status CheckNoOtherDependents(const MergePlan& plan) {
  std::set<std::string> removed_ids;
  for (size_t k = 0; k + 1 < plan.layers.size(); ++k) {
    removed_ids.insert(plan.chain.points[plan.layers[k]].manifest.id);
  }
  for (const auto& p : plan.chain.points) {
    if (removed_ids.count(p.manifest.id) || p.manifest.id == plan.pm.id) continue;
    if (p.manifest.parent && removed_ids.count(p.manifest.parent->id)) {
      return Error::InvalidArgument("backup " + p.manifest.id + " depends on " +
                                    p.manifest.parent->id + ", which the merge would remove")
          .set_path(plan.chain.dir);
    }
  }
  return OkStatus();
}

// Refuses to fold away a point other chains stand on (its base references,
// pipeline/base_refs.h): merging through it keeps it (same image name and
// image digest), merging through a later point would remove it.
Status CheckNoBaseFolded(Env& env, const MergePlan& plan, bool sweep) {
  BARGE_ASSIGN_OR_RETURN(auto live, LiveDependents(env, plan.chain.dir, sweep));
  for (size_t k = 0; k + 1 < plan.layers.size(); ++k) {
    const std::string& id = plan.chain.points[plan.layers[k]].manifest.id;
    auto it = live.find(id);
    if (it == live.end()) continue;
    const size_t n = it->second.size();
    return Error::InvalidArgument("backup " + id + " is the base of " + std::to_string(n) + " chain" +
                                  (n == 1 ? "" : "s") + " (" + it->second.front() + (n > 1 ? ", ..." : "") +
                                  "): merging through " + plan.pm.id + " would remove it; it is kept. Merge through " +
                                  id + " or an earlier point")
        .set_path(plan.chain.dir);
  }
  return OkStatus();
}

// 1. Flattens the point into a staged full image (open the point, make the
// destination, run the copy verified against the chain's digests, commit),
// stages its digest table and manifest, and re-reads the image.
Result<Staged> FlattenPoint(Env& env, ChainWriter& writer, const MergeRequest& req, const MergePlan& plan) {
  const ChainFolder& chain = plan.chain;
  const formats::BackupManifest& pm = plan.pm;
  BARGE_ASSIGN_OR_RETURN(OpenedPoint point, OpenPoint(env, chain, plan.index));
  BARGE_ASSIGN_OR_RETURN(auto compression, ParseManifestCompression(pm.compression));
  formats::DigestTable table;
  table.cluster_bytes = pm.cluster_size;
  table.virtual_size = pm.virtual_size;
  const formats::Digest128 zero = formats::ZeroClusterDigest(pm.cluster_size);
  // A chain over a base stays over it: the merged point stores every
  // cluster a folded layer stores (zero clusters included, masking the
  // base's data) and names the base as backing file, as its first point did.
  const std::optional<formats::ManifestBase>& base_of_chain = chain.points[plan.layers.front()].manifest.base;
  std::optional<MergeBase> base;
  RangeList work = {{0, pm.virtual_size}};
  if (base_of_chain) {
    BARGE_ASSIGN_OR_RETURN(std::optional<BaseLink> link, LoadBaseOf(env, chain, plan.index));
    if (!link) return Error::Corruption("the chain's base is not found").set_path(chain.dir);
    base.emplace();
    base->backing_file = base_of_chain->BackingName();
    BARGE_ASSIGN_OR_RETURN(base->effective, EffectiveDigests(env, link->chain, link->index));
    for (const std::string& p : point.base_images) base->dirs.push_back(DirName(p));
    std::set<uint64_t> stored;
    for (size_t l : plan.layers) {
      BARGE_ASSIGN_OR_RETURN(formats::DigestTable t,
                             LoadDigestTable(env, chain.PathOf(chain.points[l].manifest.digest_table)));
      for (const auto& e : t.entries) stored.insert(e.cluster_index);
    }
    work.clear();
    for (uint64_t c : stored) {
      table.entries.push_back({c, point.Expected(c).value_or(zero)});
      const uint64_t off = c * pm.cluster_size;
      const uint64_t len = std::min<uint64_t>(pm.cluster_size, pm.virtual_size - off);
      if (!work.empty() && work.back().end() == off) {
        work.back().length += len;
      } else {
        work.push_back({off, len});
      }
    }
    const formats::DigestTable* layers[] = {&base->effective, &table};
    BARGE_ASSIGN_OR_RETURN(formats::DigestTable all, formats::MergeDigestTables(layers));
    if (formats::ImageDigestOf(all, pm.image_digest_algorithm) != pm.image_digest) {
      return Error::Corruption("the point's digests over its base do not add up to its image digest")
          .set_path(chain.points[plan.index].manifest_path);
    }
  } else {
    // A full backup's zero clusters are implicit.
    for (const auto& e : point.digests.entries) {
      if (e.digest != zero) table.entries.push_back(e);
    }
    if (formats::ImageDigestOf(table, pm.image_digest_algorithm) != pm.image_digest) {
      return Error::Corruption("the point's data digests do not add up to its image digest")
          .set_path(chain.points[plan.index].manifest_path);
    }
  }

  Staged staged;
  formats::Qcow2WriterStats stats;
  {
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<StagedFile> image_file,
                           StagedFile::Create(env, plan.image_staged, /*overwrite=*/true, /*sync=*/true, &writer.file_access()));
    DestinationSpec dest_spec;
    dest_spec.virtual_size = pm.virtual_size;
    dest_spec.cluster_bytes = pm.cluster_size;
    dest_spec.compression = compression.first;
    if (base) {
      dest_spec.backing_file = base->backing_file;
      dest_spec.zero_policy = ZeroPolicy::kZeroCluster;
    }
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Destination> dest, MakeDestination(image_file->sink(), dest_spec));
    CopyOptions copy = req.copy;
    copy.cluster_bytes = pm.cluster_size;
    copy.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, pm.cluster_size);
    copy.compression = compression.first;
    copy.compression_level = compression.second;
    copy.record_zero_digests = base.has_value();
    copy.digest_algorithm = pm.image_digest_algorithm;
    copy.verify = [&point](uint64_t c) { return point.Expected(c); };
    if (base) {
      copy.base_digest = [&base](uint64_t c) { return FindDigest(base->effective, c); };
      copy.base_next = [&base](uint64_t c) { return NextListed(base->effective, c); };
    } else if (!copy.sha512) {
      // A new full without backing file omits zero clusters: runs of holes
      // travel as one chunk, checked against the chain's digests as a range
      // (a 16 TiB thin chain merges in the time its data takes).
      copy.skip_zero_extents = true;
      copy.verify_zero_run = [&point](uint64_t b, uint64_t e) { return FirstListedData(point.digests, b, e); };
    }
    Destination* dests[] = {dest.get()};
    auto copied = RunCopy(*point.image, work, dests, copy);
    if (!copied.ok()) return Error(copied.error()).Wrap("merge through " + pm.id);
    if (copied->image_digest != pm.image_digest) {
      return Error::Corruption("flattened image digest " + copied->image_digest.ToHex() +
                               " differs from the manifest's " + pm.image_digest.ToHex())
          .set_path(chain.points[plan.index].manifest_path);
    }
    bool same = copied->cluster_digests.size() == table.entries.size();
    for (size_t i = 0; same && i < table.entries.size(); ++i) {
      same = copied->cluster_digests[i].cluster_index == table.entries[i].cluster_index &&
             copied->cluster_digests[i].digest == table.entries[i].digest;
    }
    if (!same) {
      return Error::Corruption("the flattened image's data clusters differ from the digest tables")
          .set_path(chain.dir);
    }
    stats = *dest->qcow2_stats();
    staged.bytes_read = copied->bytes_read;
    BARGE_RETURN_IF_ERROR(image_file->Commit());
  }

  formats::BackupManifest& m = staged.manifest;
  m = pm;
  m.type = formats::BackupType::kFull;
  m.parent.reset();
  m.base = base_of_chain;
  m.reason = "merged " + chain.points[plan.layers.front()].manifest.id + ".." + pm.id;
  // A full reads no change tracking: the folded increments' dirty source
  // and bytes describe them, not this point (issue 18).
  m.dirty_source.clear();
  m.dirty_bytes = 0;
  m.changed_by.clear();
  m.missed_clusters.reset();
  // strong_digest_table stays: it describes the point's content, which the
  // merge keeps (its image digest binds it).
  m.bytes_written = stats.file_bytes;
  m.data_clusters = stats.data_clusters + stats.compressed_clusters;
  m.compressed_clusters = stats.compressed_clusters;
  m.zero_clusters = stats.zero_clusters;
  std::vector<std::byte> table_bytes = formats::EncodeDigestTable(table);
  BARGE_ASSIGN_OR_RETURN(staged.digests_bytes, writer.StageReplacement(pm.digest_table, table_bytes));
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::EncodeManifest(m));
  std::span<const std::byte> text_bytes = std::as_bytes(std::span(text.data(), text.size()));
  BARGE_ASSIGN_OR_RETURN(staged.manifest_bytes, writer.StageReplacement(plan.manifest_name, text_bytes));
  BARGE_RETURN_IF_ERROR(
      VerifyStagedImage(env, plan.image_staged, table, pm.image_digest, pm.image_digest_algorithm, req.copy,
                        base ? &*base : nullptr));
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(plan.image_staged));
  staged.image_bytes = st.size_bytes;
  return staged;
}

// Stages the merged point (FlattenPoint), then drops the verification
// record of the image about to be replaced. Until the journal exists, an
// error leaves the folder as it was.
Result<Staged> StageMerge(Env& env, ChainWriter& writer, const MergeRequest& req, const MergePlan& plan) {
  auto staged = FlattenPoint(env, writer, req, plan);
  if (!staged.ok()) {
    // An error about a staged file names the file it was to become: the
    // staged names are barge's own business, as StagedFile's temporaries
    // are (issue 13).
    Error e = std::move(staged).error();
    for (const auto& [staged_path, final_name] : {std::pair{plan.image_staged, plan.pm.image},
                                                  std::pair{plan.digests_staged, plan.pm.digest_table},
                                                  std::pair{plan.manifest_staged, plan.manifest_name}}) {
      if (e.path() == staged_path) e.set_path(plan.chain.PathOf(final_name));
    }
    plan.RemoveStaged(env, e);
    return e;
  }
  // ID's verification record vouches for the image about to be replaced:
  // it goes (durably) before the switch can start.
  Status s = env.UnlinkIfExists(plan.chain.PathOf(VerificationFileName(plan.pm.id)));
  if (s.ok()) s = env.SyncDir(plan.chain.dir);
  if (!s.ok()) {
    Error e = std::move(s).error();
    plan.RemoveStaged(env, e);
    return e;
  }
  return staged;
}

// 2. Writes the journal: from here on the merge completes, now or on
// recovery. The journal's rename may have happened before a later step
// failed (its folder sync): then the merge is committed and the next job
// completes it; otherwise nothing changed.
Status WriteJournal(Env& env, const MergePlan& plan, const MergeJournal& journal) {
  Status s = WriteMergeJournal(env, plan.chain.dir, journal);
  if (s.ok()) return OkStatus();
  Error e = std::move(s).error();
  // The journal is barge's own file: the error names the chain folder.
  if (BaseName(e.path()) == kMergeJournalName || IsTempName(BaseName(e.path()))) {
    e.set_path(plan.chain.dir).Wrap("writing the merge journal");
  }
  auto committed = MergeJournalExists(env, plan.chain.dir);
  if (committed.ok() && !*committed) plan.RemoveStaged(env, e);
  return e;
}

// 3. Switches over (the same code path as recovery), then removes the
// folded points' verification records (best effort: the next backup
// removes what is left).
Status SwitchOver(Env& env, const MergePlan& plan) {
  Status switched = CompleteMergeJournal(env, plan.chain.dir);
  if (!switched.ok()) {
    Error e = switched.error();
    // The journal and the staged names are barge's own files: the error
    // names the chain folder (issue 13).
    std::string base = BaseName(e.path());
    if (base == kMergeJournalName || base.ends_with(".merge-new") || IsTempName(base)) e.set_path(plan.chain.dir);
    return std::move(e)
        .Wrap("merge through " + plan.pm.id +
              " stopped during the switch-over; the next barge merge, backup, restore or verify "
              "of this folder completes it");
  }
  for (size_t k = 0; k + 1 < plan.layers.size(); ++k) {
    const std::string& id = plan.chain.points[plan.layers[k]].manifest.id;
    IgnoreError(env.UnlinkIfExists(plan.chain.PathOf(VerificationFileName(id))),
                "the merge is done; a stale record is removed by the next backup");
  }
  return OkStatus();
}

}  // namespace

Result<MergeResult> RunMerge(Env& env, const MergeRequest& req) {
  auto start = std::chrono::steady_clock::now();
  BARGE_ASSIGN_OR_RETURN(bool holds, HoldsBackups(env, req.chain_dir));
  if (!holds) return Error::NotFound("the chain folder holds no backups: nothing to merge").set_path(req.chain_dir);
  BARGE_ASSIGN_OR_RETURN(PointSelector through, ParsePointSelector(req.through));
  // Locks the folder (unless the caller holds it) and completes an
  // interrupted merge first (re-entrant: running the same merge again after
  // a crash finds the point already full).
  ChainWriterOptions options;
  options.job = "merge";
  options.held = req.held;
  if (!req.dry_run) options.access = req.access;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<ChainWriter> writer, ChainWriter::Open(env, req.chain_dir, options));
  const ChainFolder& chain = writer->chain();
  // A merge removes the folded layers: never from under an export.
  if (!req.dry_run) BARGE_RETURN_IF_ERROR(CheckNotExported(env, req.chain_dir));
  BARGE_ASSIGN_OR_RETURN(size_t index, chain.Resolve(through));
  // Temporaries of killed runs (a live writer's are locked and kept).
  if (!req.dry_run) writer->SweepTemporaries();
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  const MergePlan plan(chain, index, std::move(layers));

  MergeResult result;
  result.manifest = plan.pm;
  if (plan.layers.size() == 1) {
    result.folded_ids = {plan.pm.id};
    result.seconds = SecondsSince(start);
    return result;
  }
  BARGE_RETURN_IF_ERROR(CheckNoOtherDependents(plan));
  BARGE_RETURN_IF_ERROR(CheckNoBaseFolded(env, plan, /*sweep=*/!req.dry_run));
  // Every layer's objects are removed or replaced: none may be under S3
  // Object Lock retention (pipeline/object_lock.h), refused before anything.
  {
    std::vector<std::string> files;
    for (size_t k : plan.layers) {
      for (std::string& f : PointFiles(chain.dir, chain.points[k].manifest)) files.push_back(std::move(f));
    }
    BARGE_RETURN_IF_ERROR(CheckNotLocked(env, files));
  }
  if (req.dry_run) {
    result.dry_run = true;
    result.folded_ids = plan.FoldedIds();
    result.removed_files = plan.RemovedFiles();
    result.seconds = SecondsSince(start);
    return result;
  }

  // Until the journal exists, a forced exit (a second SIGINT) removes the
  // staged files, through these registrations.
  std::vector<TempRegistration> registered;
  for (const std::string& p : {plan.image_staged, plan.digests_staged, plan.manifest_staged}) {
    registered.emplace_back(p);
  }
  BARGE_ASSIGN_OR_RETURN(Staged staged, StageMerge(env, *writer, req, plan));
  result.bytes_read = staged.bytes_read;

  // Last chance to stop with the folder unchanged.
  BARGE_RETURN_IF_ERROR(
      CheckCancel(req.copy.cancel, "merge cancelled before the switch-over; nothing changed", chain.dir));
  // The staged files are the journal's from here on: a forced exit must
  // leave them (unregistered before the journal exists, so no exit can
  // remove a file the journal needs; a leftover without a journal is
  // removed by the next merge or backup).
  registered.clear();
  MergeJournal journal;
  journal.through = plan.pm.id;
  journal.renames = {{MergeStagedName(plan.pm.image), plan.pm.image, staged.image_bytes},
                     {MergeStagedName(plan.pm.digest_table), plan.pm.digest_table, staged.digests_bytes},
                     {MergeStagedName(plan.manifest_name), plan.manifest_name, staged.manifest_bytes}};
  journal.remove = plan.RemovedFiles();
  result.folded_ids = plan.FoldedIds();
  BARGE_RETURN_IF_ERROR(WriteJournal(env, plan, journal));
  BARGE_RETURN_IF_ERROR(SwitchOver(env, plan));

  result.merged = true;
  result.manifest = std::move(staged.manifest);
  result.removed_files = journal.remove;
  result.image_bytes = staged.image_bytes;
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace barge::pipeline
