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
#include "pipeline/chain.h"
#include "pipeline/destination_spec.h"
#include "pipeline/endpoints.h"
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

// Writes a small file under `final_path` (a staged name itself), synced.
Result<uint64_t> WriteStagedSmall(Env& env, const std::string& final_path, std::span<const std::byte> bytes) {
  BARGE_RETURN_IF_ERROR(env.WriteFileAtomic(final_path, bytes));
  return bytes.size();
}

// Re-reads the staged image on its own (no backing file may exist) and
// checks its structure, every cluster's digest and the image digest.
Status VerifyStagedImage(Env& env, const std::string& path, const formats::DigestTable& table,
                         const formats::Digest128& image_digest, const CopyOptions& knobs) {
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
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<formats::Image> image, OpenImageFile(env, path, options));
  if (image->backing() != nullptr || !image->info().backing_file.empty()) {
    return Error::Corruption("the merged image has a backing file").set_path(path);
  }
  const formats::Digest128 zero = formats::ZeroClusterDigest(table.cluster_bytes);
  CopyOptions copy = knobs;
  copy.progress = nullptr;
  copy.compression = formats::Compression::kNone;
  copy.verify = [&table, zero](uint64_t c) -> std::optional<formats::Digest128> {
    if (auto d = FindDigest(table, c)) return d;
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

Result<MergeResult> RunMerge(Env& env, const MergeRequest& req) {
  auto start = std::chrono::steady_clock::now();
  BARGE_ASSIGN_OR_RETURN(bool holds, HoldsBackups(env, req.chain_dir));
  if (!holds) return Error::NotFound("the chain folder holds no backups: nothing to merge").set_path(req.chain_dir);
  BARGE_ASSIGN_OR_RETURN(PointSelector through, ParsePointSelector(req.through));
  std::optional<ChainLock> own_lock;
  if (req.held == nullptr) {
    BARGE_ASSIGN_OR_RETURN(ChainLock taken, ChainLock::Acquire(env, req.chain_dir));
    own_lock.emplace(std::move(taken));
  }
  const ChainLock& lock = req.held != nullptr ? *req.held : *own_lock;
  // Completes an interrupted merge first (re-entrant: running the same merge
  // again after a crash finds the point already full).
  BARGE_ASSIGN_OR_RETURN(ChainFolder chain, LoadChainFolder(env, req.chain_dir, &lock));
  BARGE_ASSIGN_OR_RETURN(size_t index, chain.Resolve(through));
  // Temporaries of killed runs (a live writer's are locked and kept).
  if (!req.dry_run) {
    IgnoreError(SweepStaleTemporaries(env, chain.dir), "a leftover that cannot be removed now goes at a later run");
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  const formats::BackupManifest& pm = chain.points[index].manifest;

  MergeResult result;
  result.manifest = pm;
  if (layers.size() == 1) {
    result.folded_ids = {pm.id};
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }
  // Refuse when a point outside this line still builds on a layer we remove.
  std::set<std::string> removed_ids;
  for (size_t k = 0; k + 1 < layers.size(); ++k) removed_ids.insert(chain.points[layers[k]].manifest.id);
  for (const auto& p : chain.points) {
    if (removed_ids.count(p.manifest.id) || p.manifest.id == pm.id) continue;
    if (p.manifest.parent && removed_ids.count(p.manifest.parent->id)) {
      return Error::InvalidArgument("backup " + p.manifest.id + " depends on " +
                                    p.manifest.parent->id + ", which the merge would remove")
          .set_path(chain.dir);
    }
  }

  if (req.dry_run) {
    result.dry_run = true;
    for (size_t k = 0; k < layers.size(); ++k) result.folded_ids.push_back(chain.points[layers[k]].manifest.id);
    for (size_t k = 0; k + 1 < layers.size(); ++k) {
      result.removed_files.push_back(BaseName(chain.points[layers[k]].manifest_path));
    }
    for (size_t k = 0; k + 1 < layers.size(); ++k) {
      result.removed_files.push_back(chain.points[layers[k]].manifest.image);
      result.removed_files.push_back(chain.points[layers[k]].manifest.digest_table);
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return result;
  }

  const std::string manifest_name = BaseName(chain.points[index].manifest_path);
  const std::string image_staged = chain.PathOf(MergeStagedName(pm.image));
  const std::string digests_staged = chain.PathOf(MergeStagedName(pm.digest_table));
  const std::string manifest_staged = chain.PathOf(MergeStagedName(manifest_name));
  // Until the journal exists, a forced exit (a second SIGINT) removes the
  // staged files, through these registrations.
  std::vector<TempRegistration> registered;
  for (const std::string& p : {image_staged, digests_staged, manifest_staged}) registered.emplace_back(p);

  // 1. Flatten the point into a staged full image, verified on the way.
  auto stage = [&]() -> Result<Staged> {
    BARGE_ASSIGN_OR_RETURN(OpenedPoint point, OpenPoint(env, chain, index));
    BARGE_ASSIGN_OR_RETURN(auto compression, ParseManifestCompression(pm.compression));
    formats::DigestTable table;
    table.cluster_bytes = pm.cluster_size;
    table.virtual_size = pm.virtual_size;
    const formats::Digest128 zero = formats::ZeroClusterDigest(pm.cluster_size);
    // A full backup's zero clusters are implicit.
    for (const auto& e : point.digests.entries) {
      if (e.digest != zero) table.entries.push_back(e);
    }
    if (formats::ImageDigestOf(table) != pm.image_digest) {
      return Error::Corruption("the point's data digests do not add up to its image digest")
          .set_path(chain.points[index].manifest_path);
    }

    Staged staged;
    formats::Qcow2WriterStats stats;
    {
      BARGE_ASSIGN_OR_RETURN(std::unique_ptr<StagedFile> image_file,
                             StagedFile::Create(env, image_staged, /*overwrite=*/true));
      DestinationSpec dest_spec;
      dest_spec.virtual_size = pm.virtual_size;
      dest_spec.cluster_bytes = pm.cluster_size;
      dest_spec.compression = compression.first;
      BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Destination> dest, MakeDestination(image_file->sink(), dest_spec));
      CopyOptions copy = req.copy;
      copy.cluster_bytes = pm.cluster_size;
      copy.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, pm.cluster_size);
      copy.compression = compression.first;
      copy.compression_level = compression.second;
      copy.record_zero_digests = false;
      copy.verify = [&point](uint64_t c) { return point.Expected(c); };
      Destination* dests[] = {dest.get()};
      auto copied = RunCopy(*point.image, {{0, pm.virtual_size}}, dests, copy);
      if (!copied.ok()) return Error(copied.error()).Wrap("merge through " + pm.id);
      if (copied->image_digest != pm.image_digest) {
        return Error::Corruption("flattened image digest " + copied->image_digest.ToHex() +
                                 " differs from the manifest's " + pm.image_digest.ToHex())
            .set_path(chain.points[index].manifest_path);
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
    m.reason = "merged " + chain.points[layers.front()].manifest.id + ".." + pm.id;
    // A full reads no change tracking: the folded increments' dirty source
    // and bytes describe them, not this point (issue 18).
    m.dirty_source.clear();
    m.dirty_bytes = 0;
    m.bytes_written = stats.file_bytes;
    m.data_clusters = stats.data_clusters + stats.compressed_clusters;
    m.compressed_clusters = stats.compressed_clusters;
    m.zero_clusters = stats.zero_clusters;
    std::vector<std::byte> table_bytes = formats::EncodeDigestTable(table);
    BARGE_ASSIGN_OR_RETURN(staged.digests_bytes, WriteStagedSmall(env, digests_staged, table_bytes));
    BARGE_ASSIGN_OR_RETURN(std::string text, formats::EncodeManifest(m));
    BARGE_ASSIGN_OR_RETURN(
        staged.manifest_bytes,
        WriteStagedSmall(env, manifest_staged, std::as_bytes(std::span(text.data(), text.size()))));
    BARGE_RETURN_IF_ERROR(VerifyStagedImage(env, image_staged, table, pm.image_digest, req.copy));
    BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(image_staged));
    staged.image_bytes = st.size_bytes;
    return staged;
  };
  auto staged = stage();
  if (!staged.ok()) {
    // Until the journal exists, an error leaves the folder as it was. An
    // error about a staged file names the file it was to become: the
    // staged names are barge's own business, as StagedFile's temporaries
    // are (issue 13).
    Error e = std::move(staged).error();
    for (const auto& [staged_path, final_name] : {std::pair{image_staged, pm.image},
                                                  std::pair{digests_staged, pm.digest_table},
                                                  std::pair{manifest_staged, manifest_name}}) {
      if (e.path() == staged_path) e.set_path(chain.PathOf(final_name));
    }
    for (const std::string& p : {image_staged, digests_staged, manifest_staged}) e.Also(env.UnlinkIfExists(p));
    return e;
  }
  result.bytes_read = staged->bytes_read;

  // ID's verification record vouches for the image about to be replaced:
  // it goes (durably) before the switch can start.
  {
    Status s = env.UnlinkIfExists(chain.PathOf(VerificationFileName(pm.id)));
    if (s.ok()) s = env.SyncDir(chain.dir);
    if (!s.ok()) {
      // Before the journal: the folder goes back to what it was.
      Error e = std::move(s).error();
      for (const std::string& p : {image_staged, digests_staged, manifest_staged}) e.Also(env.UnlinkIfExists(p));
      return e;
    }
  }

  // 2. The journal: from here on the merge completes, now or on recovery.
  // Last chance to stop with the folder unchanged.
  BARGE_RETURN_IF_ERROR(
      CheckCancel(req.copy.cancel, "merge cancelled before the switch-over; nothing changed", chain.dir));
  // The staged files are the journal's from here on: a forced exit must
  // leave them (unregistered before the journal exists, so no exit can
  // remove a file the journal needs; a leftover without a journal is
  // removed by the next merge or backup).
  registered.clear();
  MergeJournal journal;
  journal.through = pm.id;
  journal.renames = {{MergeStagedName(pm.image), pm.image, staged->image_bytes},
                     {MergeStagedName(pm.digest_table), pm.digest_table, staged->digests_bytes},
                     {MergeStagedName(manifest_name), manifest_name, staged->manifest_bytes}};
  for (size_t k = 0; k + 1 < layers.size(); ++k) {
    const ChainPoint& p = chain.points[layers[k]];
    journal.remove.push_back(BaseName(p.manifest_path));
    result.folded_ids.push_back(p.manifest.id);
  }
  result.folded_ids.push_back(pm.id);
  for (size_t k = 0; k + 1 < layers.size(); ++k) {
    const auto& lm = chain.points[layers[k]].manifest;
    journal.remove.push_back(lm.image);
    journal.remove.push_back(lm.digest_table);
  }
  if (Status s = WriteMergeJournal(env, chain.dir, journal); !s.ok()) {
    // The journal's rename may have happened before a later step failed
    // (its folder sync): then the merge is committed and the next job
    // completes it; otherwise nothing changed.
    Error e = std::move(s).error();
    // The journal is barge's own file: the error names the chain folder.
    if (BaseName(e.path()) == kMergeJournalName || IsTempName(BaseName(e.path()))) {
      e.set_path(chain.dir).Wrap("writing the merge journal");
    }
    auto committed = MergeJournalExists(env, chain.dir);
    if (committed.ok() && !*committed) {
      for (const std::string& p : {image_staged, digests_staged, manifest_staged}) e.Also(env.UnlinkIfExists(p));
    }
    return e;
  }

  // 3. Switch over: the same code path as recovery.
  Status switched = CompleteMergeJournal(env, chain.dir);
  if (!switched.ok()) {
    Error e = switched.error();
    // The journal and the staged names are barge's own files: the error
    // names the chain folder (issue 13).
    std::string base = BaseName(e.path());
    if (base == kMergeJournalName || base.ends_with(".merge-new") || IsTempName(base)) e.set_path(chain.dir);
    return std::move(e)
        .Wrap("merge through " + pm.id +
              " stopped during the switch-over; the next barge merge, backup, restore or verify "
              "of this folder completes it");
  }
  // The folded points' verification records (best effort: the next
  // backup removes what is left).
  for (size_t k = 0; k + 1 < layers.size(); ++k) {
    IgnoreError(env.UnlinkIfExists(chain.PathOf(VerificationFileName(chain.points[layers[k]].manifest.id))),
                "the merge is done; a stale record is removed by the next backup");
  }
  result.merged = true;
  result.manifest = std::move(staged->manifest);
  result.removed_files = journal.remove;
  result.image_bytes = staged->image_bytes;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace barge::pipeline
