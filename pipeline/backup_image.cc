// A backup's image steps (pipeline/backup_steps.h): what a killed run
// staged found and checked (pipeline/resume.h), the image made or taken
// over, the copy into it, and the point committed or, after a failure,
// its staged data kept for the next run.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "blockio/path.h"
#include "formats/digest_table.h"
#include "formats/json_fields.h"
#include "formats/units.h"
#include "pipeline/backup_steps.h"
#include "pipeline/base_refs.h"
#include "pipeline/destination_spec.h"

namespace barge::pipeline::backup_steps {

std::string IdFor(uint32_t sequence, const std::string& started_at) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04u", sequence);
  return std::string(buf) + "-" + formats::CompactTimestamp(started_at);
}

namespace {

// The work from guest cluster `from` on.
RangeList WorkFrom(const RangeList& work, uint64_t from_bytes) {
  RangeList out;
  for (const Range& r : work) {
    if (r.end() <= from_bytes) continue;
    uint64_t begin = std::max(r.offset, from_bytes);
    out.push_back({begin, r.end() - begin});
  }
  return out;
}

// What makes this run "the same backup" as one staged before it, with the
// staged run's start (its id and image name follow from it).
ResumeKey KeyFor(Env& env, const BackupRequest& req, const BackupRun& run, const std::string& started_at) {
  ResumeKey k;
  k.started_at = started_at;
  k.id = IdFor(run.writer->chain().next_sequence(), started_at);
  k.image = k.id + ".qcow2";
  k.type = req.incremental ? "incremental" : "full";
  k.disk = run.identity.kind + ":" + run.identity.location + ":" + run.identity.target + ":" + run.identity.source;
  if (run.identity.kind == "file") {
    // A file changed since (a VM wrote it) would mix two states.
    if (auto st = env.Stat(run.spec.location); st.ok()) {
      k.source_stamp = std::to_string(st->size_bytes) + "@" + std::to_string(st->mtime_ns);
    }
  }
  // A download changed on the server since would mix two versions too.
  if (!run.src.remote_version.empty()) k.source_stamp = run.src.remote_version;
  k.virtual_size = run.size;
  k.cluster_size = run.cluster;
  k.compression = formats::CompressionSpec{req.compression, req.compression_level}.ToString();
  if (run.m.parent) k.parent = run.m.parent->id + ":" + run.m.parent->image_digest.ToHex();
  if (run.m.base) k.parent = run.m.base->BackingName() + ":" + run.m.base->image_digest.ToHex();
  k.checkpoint = req.checkpoint;
  k.work_digest = RangesDigest(run.work);
  k.tool_version = req.tool_version;
  return k;
}

// The image's destination spec (the same for a fresh and a resumed image).
DestinationSpec ImageSpec(const BackupRequest& req, const BackupRun& run) {
  DestinationSpec dest_spec;
  dest_spec.virtual_size = run.size;
  dest_spec.cluster_bytes = run.cluster;
  dest_spec.compression = req.compression;
  if (run.m.parent) dest_spec.backing_file = run.m.parent->image;
  if (run.m.base) dest_spec.backing_file = run.m.base->BackingName();
  dest_spec.zero_policy = run.over_parent() ? ZeroPolicy::kZeroCluster : ZeroPolicy::kOmit;
  return dest_spec;
}

// A resume over an earlier run's staged image (req.staged_earlier): that
// run copied the disk as it was at its own checkpoint, so the clusters that
// changed since (run.changed_since_staged), or that this run's work adds
// to the staged run's, are stale. The writer appends front to back, so the
// staged image still holds up to the first such cluster and is continued
// from there: `check` (what CheckStaged kept) is cut there when that is
// lower, its problem saying why. Never lengthens it; next_cluster 0 means
// nothing is kept.
StagedCheck CutAtChangesSinceStaged(const BackupRequest& req, const BackupRun& run,
                                    const std::vector<JournalEntry>& entries, StagedCheck check) {
  const RangeList invalid = UniteRanges(
      run.changed_since_staged,
      SubtractRanges(run.work, AlignRanges(req.staged_earlier->work, run.cluster, run.size)));
  if (invalid.empty() || invalid.front().offset / run.cluster >= check.next_cluster) return check;
  check.next_cluster = invalid.front().offset / run.cluster;
  if (check.next_cluster == 0) {
    check.problem = "the disk changed at its start since checkpoint " + req.staged_earlier->checkpoint;
    return check;
  }
  const auto kept_end = entries.begin() + static_cast<ptrdiff_t>(check.kept_entries);
  check.kept_entries = static_cast<size_t>(
      std::lower_bound(entries.begin(), kept_end, check.next_cluster,
                       [](const JournalEntry& e, uint64_t c) { return e.stored.cluster_index < c; }) -
      entries.begin());
  check.problem = "cluster " + std::to_string(check.next_cluster) + " (changed since checkpoint " +
                  req.staged_earlier->checkpoint + ")";
  return check;
}

// The point's strong table, when it keeps one: the source's clusters (a
// digest scan's, else the parent's table) with the copied clusters taken
// from what was written. nullopt when a resumed copy kept clusters whose
// strong digests no run computed (only a digest scan knows them): the
// next digest incremental computes the table from the chain.
Result<std::optional<formats::StrongDigestTable>> StrongTableOf(const BackupRun& run, const CopyResult& copied) {
  if (!run.write_strong) return std::optional<formats::StrongDigestTable>();
  if (run.resume_cluster > 0 && !run.scan) return std::optional<formats::StrongDigestTable>();
  formats::StrongDigestTable t;
  t.cluster_bytes = run.cluster;
  t.virtual_size = run.size;
  t.image_digest = copied.image_digest;
  if (run.m.base) {
    t.entries = run.scan->source;  // the comparison with the base read the whole disk
    return std::optional(std::move(t));
  }
  if (!run.m.parent) {
    t.entries = copied.strong_digests;  // a full copied the whole disk
    return std::optional(std::move(t));
  }
  const std::vector<formats::StrongDigestEntry>& base = run.scan ? run.scan->source : run.parent_strong->table.entries;
  std::vector<formats::ClusterSpan> spans;
  for (const Range& r : run.remaining) {
    spans.push_back({r.offset / run.cluster, (r.end() + run.cluster - 1) / run.cluster});
  }
  auto entries = formats::ReplaceStrongEntries(base, spans, copied.strong_digests);
  if (!entries.ok()) return Error(entries.error()).Wrap("backup: strong digest table");
  t.entries = std::move(entries).value();
  return std::optional(std::move(t));
}

}  // namespace

Status FindStaged(Env& env, const BackupRequest& req, BackupRun& run) {
  const ChainFolder& chain = run.writer->chain();
  run.site = BackupResumeSite(chain.dir);
  ResumeTerms terms;
  terms.refused = !req.resume_refused.empty() ? req.resume_refused
                  : !req.resume               ? std::string("resuming is off")
                                              : std::string();
  terms.expected = [&](const ResumeKey& staged) {
    ResumeKey now = KeyFor(env, req, run, staged.started_at);
    if (req.staged_earlier) {
      // The staged run's point in time: its checkpoint and work set.
      now.checkpoint = req.staged_earlier->checkpoint;
      if (req.incremental) now.work_digest = RangesDigest(AlignRanges(req.staged_earlier->work, run.cluster, run.size));
    }
    return now;
  };
  auto staged_path = [&chain](const ResumeKey& key) { return TempPathFor(chain.PathOf(key.image)); };
  auto options = Qcow2OptionsFor(ImageSpec(req, run));
  KeptCheck image("the staged image", [&](const LoadedJournal& journal) -> Result<StagedCheck> {
    if (!options.ok()) return options.error();
    BARGE_ASSIGN_OR_RETURN(StagedCheck check, CheckStaged(env, staged_path(journal.key), *options, journal));
    if (req.staged_earlier && check.next_cluster > 0) {
      check = CutAtChangesSinceStaged(req, run, journal.entries, std::move(check));
    }
    return check;
  });
  ResumeDecision found = FindResume(env, run.site, terms, image);
  std::string keep;
  if (found.resumed()) {
    run.staged_image = found.journal.key.image;
    run.kept.assign(found.journal.entries.begin(),
                    found.journal.entries.begin() + static_cast<ptrdiff_t>(found.kept.kept_entries));
    run.resume_cluster = found.kept.next_cluster;
    keep = BaseName(staged_path(found.journal.key));
  }
  BARGE_ASSIGN_OR_RETURN(run.stale, run.writer->RemoveLeftovers(keep));
  run.remaining = WorkFrom(run.work, run.resume_cluster * run.cluster);
  if (found.found()) {
    const uint64_t total = TotalBytes(run.work);
    run.note = NoteOf(found, total, total - TotalBytes(run.remaining));
    if (req.on_resume) req.on_resume(*run.note);
  }
  return OkStatus();
}

// 3. Makes the destination: the point's qcow2 image, staged in the chain
// folder, or the staged one a killed run left, taken over. An incremental
// names its parent and stores the zero clusters of its work set (they must
// mask the parent's data). With req.resume, starts the journal (holding
// what was kept).
Result<std::unique_ptr<Qcow2Destination>> MakeImage(Env& env, const BackupRequest& req, BackupRun& run,
                                                    std::unique_ptr<ResumedSink>& resumed_sink) {
  DestinationSpec spec = ImageSpec(req, run);
  auto made = [&]() -> Result<std::unique_ptr<Qcow2Destination>> {
    BARGE_ASSIGN_OR_RETURN(formats::Qcow2WriterOptions options, Qcow2OptionsFor(spec));
    std::unique_ptr<formats::Qcow2Writer> writer;
    BlockSink* sink = nullptr;
    if (run.resume_cluster > 0) {
      if (run.staged_image != run.m.image) {
        // Named after the killed run's start; the point is this run's.
        const ChainFolder& chain = run.writer->chain();
        BARGE_RETURN_IF_ERROR(
            env.Rename(TempPathFor(chain.PathOf(run.staged_image)), TempPathFor(chain.PathOf(run.m.image))));
      }
      BARGE_ASSIGN_OR_RETURN(BlockSink * staged, run.writer->AdoptStagedImage(run.m.image));
      // The wrapper goes on top after the truncation in Resume.
      resumed_sink = std::make_unique<ResumedSink>(*staged);
      BARGE_ASSIGN_OR_RETURN(writer, formats::Qcow2Writer::Resume(*resumed_sink, options, StoredClusters(run.kept)));
      sink = resumed_sink.get();
    } else {
      BARGE_ASSIGN_OR_RETURN(sink, run.writer->StageImage(run.m.image));
      BARGE_ASSIGN_OR_RETURN(writer, formats::Qcow2Writer::Create(*sink, options));
    }
    if (req.resume) {
      BARGE_ASSIGN_OR_RETURN(uint64_t end, writer->Sync());
      run.key = KeyFor(env, req, run, run.started_at);
      // The work set first: a journal never names a work set it lacks.
      if (req.keep_work) BARGE_RETURN_IF_ERROR(SaveResumeWork(env, run.site.work, run.work, run.size));
      BARGE_ASSIGN_OR_RETURN(run.journal,
                             ResumeJournal::Create(env, run.site.journal, run.key, run.kept, run.resume_cluster, end));
    }
    return std::make_unique<Qcow2Destination>(std::move(writer), sink->name(), spec.compression, spec.zero_policy);
  }();
  if (!made.ok()) return Error(made.error()).Wrap("backup: starting " + run.m.image);
  return made;
}

// 4. Runs the copy of the work set (what is left of it, resumed); an
// incremental's clusters that equal the parent's are still written (zero
// ones recorded too). The clusters kept from a staged image count in the
// image digest as they were journaled.
Result<CopyResult> CopyWork(const BackupRequest& req, BackupRun& run, Destination& dest) {
  CopyOptions copy = req.copy;
  copy.cluster_bytes = run.cluster;
  copy.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, run.cluster);
  copy.compression = req.compression;
  copy.compression_level = req.compression_level;
  copy.record_zero_digests = run.over_parent();
  copy.strong_digests = run.write_strong && !run.m.base;  // over a base: the scan has them all
  // A full omits zero clusters: runs of holes and zero extents are folded
  // as a run, never walked cluster by cluster (a thin disk costs its data).
  copy.skip_zero_extents = !run.over_parent() && !copy.sha512;
  BaseDigestLookup parent;
  if (run.over_parent()) {
    parent = [&run](uint64_t c) { return FindDigest(run.parent_digests, c); };
  }
  if (run.resume_cluster > 0) {
    // Kept clusters are in guest order: the fold asks in increasing order.
    copy.base_digest = [&run, parent, at = size_t{0}](uint64_t c) mutable -> std::optional<formats::Digest128> {
      if (c < run.resume_cluster) {
        while (at < run.kept.size() && run.kept[at].stored.cluster_index < c) ++at;
        if (at < run.kept.size() && run.kept[at].stored.cluster_index == c) return run.kept[at].digest;
      }
      return parent ? parent(c) : std::nullopt;
    };
    // The fold jumps between kept clusters (and parent entries): a resumed
    // thin disk's fold costs its entries, not the clusters before the resume.
    copy.base_next = [&run](uint64_t c) {
      uint64_t next = run.over_parent() ? NextListed(run.parent_digests, c) : UINT64_MAX;
      if (c < run.resume_cluster) {
        auto it = std::lower_bound(run.kept.begin(), run.kept.end(), c, [](const JournalEntry& e, uint64_t x) {
          return e.stored.cluster_index < x;
        });
        if (it != run.kept.end()) next = std::min(next, it->stored.cluster_index);
      }
      return next;
    };
  } else {
    copy.base_digest = parent;
    // The fold of the clean clusters jumps from one parent entry to the next.
    if (parent) copy.base_next = [&run](uint64_t c) { return NextListed(run.parent_digests, c); };
  }
  Destination* dests[] = {&dest};
  auto copied = RunCopy(*run.src.image, run.remaining, dests, copy);
  if (!copied.ok()) return Error(copied.error()).Wrap("backup");
  if (!run.kept.empty()) {
    // Kept clusters were recorded as the copy records them (a full stores
    // and records data clusters; an incremental zero ones too).
    std::vector<ClusterDigest> all;
    all.reserve(run.kept.size() + copied->cluster_digests.size());
    for (const JournalEntry& e : run.kept) all.push_back({e.stored.cluster_index, e.digest});
    all.insert(all.end(), copied->cluster_digests.begin(), copied->cluster_digests.end());
    copied->cluster_digests = std::move(all);
  }
  return copied;
}

// After a failed copy: a resumable backup keeps its staged image and
// journal for the next run when the source failed (its connection lost);
// not after a cancel, which asks to stop, nor when writing the target
// failed (a full or failing disk: what it holds is not to be trusted or
// kept); else the journal goes.
Error KeepOrDrop(Env& env, const BackupRequest& req, BackupRun& run, JournaledDestination* journaled, Error error) {
  if (run.journal == nullptr) return error;
  using Keep = BackupRequest::KeepStaged;
  const bool keep = req.keep_staged == Keep::kAfterSourceFailure ||
                    (req.keep_staged == Keep::kWhenDisconnected && error.code() == ErrorCode::kIoError &&
                     error.retryable());
  if (keep && journaled != nullptr &&
      KeepAfterFailure(error, *journaled, *run.journal, /*target_failure_keeps=*/false,
                       [&run] { return run.writer->KeepStagedImage(); })) {
    run.journal.reset();
    return error.Wrap("the data staged so far is kept: the next run of this backup resumes from it; backup");
  }
  run.journal.reset();
  DiscardResume(env, run.site);  // a journal whose image is gone is never resumed
  return error;
}

// 5. Commits: the digest table and the finished manifest staged beside the
// image, then image, digests, manifest published in that order.
Status CommitPoint(Env& env, BackupRun& run, const CopyResult& copied, const formats::Qcow2WriterStats& stats,
                   std::chrono::steady_clock::time_point start) {
  formats::BackupManifest& m = run.m;
  formats::DigestTable table;
  table.cluster_bytes = run.cluster;
  table.virtual_size = run.size;
  table.entries.reserve(copied.cluster_digests.size());
  for (const ClusterDigest& d : copied.cluster_digests) {
    table.entries.push_back({d.cluster_index, d.digest});
  }
  m.image_digest = copied.image_digest;
  // What the run read: the copy, plus a digest scan's whole read of the
  // source and a strong table computed from the chain.
  m.bytes_read = copied.bytes_read + (run.scan ? run.scan->bytes_read : 0) + run.base_compared_bytes +
                 (run.parent_strong && run.parent_strong->computed ? run.parent_strong->bytes_read : 0);
  m.bytes_written = stats.file_bytes;
  m.data_clusters = stats.data_clusters + stats.compressed_clusters;
  m.compressed_clusters = stats.compressed_clusters;
  m.zero_clusters = stats.zero_clusters;
  m.finished_at = formats::NowRfc3339();
  // Exact to the microsecond (the times above are whole seconds).
  m.duration_seconds =
      std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e6) / 1e6;

  std::vector<std::byte> table_bytes = formats::EncodeDigestTable(table);
  BARGE_RETURN_IF_ERROR(run.writer->StageSmallFile(m.digest_table, table_bytes));
  BARGE_ASSIGN_OR_RETURN(std::optional<formats::StrongDigestTable> strong, StrongTableOf(run, copied));
  if (strong) {
    m.strong_digest_table = m.id + ".sha256";
    std::vector<std::byte> strong_bytes = formats::EncodeStrongDigestTable(*strong);
    BARGE_RETURN_IF_ERROR(run.writer->StageSmallFile(m.strong_digest_table, strong_bytes));
  }
  if (m.base) {
    // Before the point is committed, so a committed point always protects
    // its base; a run killed before its commit leaves a stale reference,
    // which the base chain's next forget, merge or retention sweeps.
    BaseRef ref;
    ref.dependent = RelativeFolderPath(run.base_dir, run.writer->dir());
    ref.chain_id = m.chain_id;
    ref.base_id = m.base->id;
    Status wrote = WriteBaseRef(env, run.base_dir, ref);
    if (!wrote.ok()) return Error(wrote.error()).Wrap("backup: recording it in its base chain");
  }
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::EncodeManifest(m));
  BARGE_RETURN_IF_ERROR(run.writer->StageSmallFile(m.id + ".json", std::as_bytes(std::span(text.data(), text.size()))));
  return run.writer->Commit();
}

}  // namespace barge::pipeline::backup_steps
