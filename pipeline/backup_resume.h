// Resuming an interrupted backup: while a backup runs, a journal beside its
// staged image records, at checkpoints, the clusters the qcow2 writer stored
// and their digests; the next run of the same backup checks them against
// the staged image and goes on from there instead of starting over. The
// journal's format: docs/formats/resume.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/extent.h"
#include "blockio/sink.h"
#include "blockio/source.h"
#include "formats/digest.h"
#include "formats/qcow2_writer.h"
#include "pipeline/destination.h"

namespace barge::pipeline {

// The journal's name in the chain folder (one backup of a chain at a time).
inline constexpr std::string_view kResumeJournalName = ".backup.barge-resume";
// Beside it, for a backup that a later run may resume at another point in
// time (a vm backup): the work set the journal's run copies, as an extents
// file (docs/formats/extents.md; docs/formats/resume.md, "vm backup").
inline constexpr std::string_view kResumeWorkName = ".backup.barge-resume-work";

// Writes `work` (of a disk of `virtual_size` bytes) to `path` as an
// extents file, atomically.
Status SaveResumeWork(Env& env, const std::string& path, const RangeList& work, uint64_t virtual_size);
// Reads it back, as untrusted bytes (DecodeExtentsFile's checks): kNotFound
// when there is none; kCorruption when it does not decode or is of
// another size than `virtual_size`.
Result<RangeList> LoadResumeWork(Env& env, const std::string& path, uint64_t virtual_size);

// What makes a staged backup "the same backup" as the one asked for now.
// Every field must match for a resume; ResumeMismatch says which did not.
struct ResumeKey {
  std::string id;            // the point's id (sequence and start time)
  std::string started_at;    // its start (a resumed run's point takes its own)
  std::string image;         // the image's final name in the chain folder
  std::string type;          // "full" or "incremental"
  std::string disk;          // the disk's identity (kind, location, target)
  std::string source_stamp;  // a file source's size and mtime; else ""
  uint64_t virtual_size = 0;
  uint32_t cluster_size = 0;
  std::string compression;   // "zstd:3", "none"
  std::string parent;        // the parent point's id and image digest, or ""
  std::string checkpoint;    // the libvirt checkpoint recorded, or ""
  std::string work_digest;   // xxh3-128 of the ranges to copy
  std::string tool_version;  // the writer's layout must be the same
};

// Why a backup staged under `staged` is not the one `now` asks for, in
// words for "staged data not reusable: WHY"; "" when it is.
std::string ResumeMismatch(const ResumeKey& staged, const ResumeKey& now);

// xxh3-128 of a range list (the work set), as ResumeKey::work_digest.
std::string RangesDigest(const RangeList& ranges);

// What became of a staged run's data (a backup's image, a replicated
// copy) found by the next run.
struct ResumeNote {
  bool resumed = false;
  uint64_t staged_bytes = 0;  // resumed: bytes of the work taken from the staged image
  uint64_t total_bytes = 0;   // bytes of the work
  // resumed: what of the staged image failed its check and is copied
  // again ("" if nothing); not resumed: why it could not be used.
  std::string problem;
};

// One stored cluster and the digest of its guest bytes.
struct JournalEntry {
  formats::StoredCluster stored;
  formats::Digest128 digest;
};

// A journal read back: its key and the entries of every whole checkpoint.
struct LoadedJournal {
  ResumeKey key;
  std::vector<JournalEntry> entries;
  uint64_t next_cluster = 0;  // the guest cluster the last checkpoint ended at
  uint64_t end_bytes = 0;     // the staged image's end at the last checkpoint
  bool torn = false;          // a last, incomplete checkpoint was dropped
};

// Reads the journal at `path`. kNotFound when there is none; kCorruption
// when its header is unreadable (another version, torn at creation).
// A checkpoint cut short or damaged ends the list (torn).
Result<LoadedJournal> LoadResumeJournal(Env& env, const std::string& path);
// The journal's bytes `text` as LoadResumeJournal reads them (`path` names
// it in errors). The entries are as written, unchecked: Qcow2Writer's
// PlanStored refuses a sequence the writer could not have made.
Result<LoadedJournal> DecodeResumeJournal(std::string_view text, const std::string& path);

// While held, a sweep of stale temporaries in chain folder `dir` spares
// the image a resume journal there names (a lock on it; null when there
// is no journal or it cannot be read). For the sweeps that run before a
// backup decides whether to resume (loading the chain with its lock).
std::unique_ptr<EnvLock> SpareResumableImage(Env& env, const std::string& dir);

// The part of a staged image that can be kept.
struct StagedCheck {
  size_t kept_entries = 0;    // the journal's first entries that verified
  uint64_t next_cluster = 0;  // the guest cluster to copy from
  std::string problem;        // why fewer than all were kept, or ""
};

// Reads back every journaled cluster from the staged image at `staged_path`
// (written by a Qcow2Writer with `options`), decompressing where stored
// compressed, and compares its digest with the journal's: the entries up
// to the first mismatch or unreadable cluster are kept (the rest is copied
// again). An error only when the image cannot be opened at all.
// `on_cluster`, when set, gets every journaled data or compressed cluster
// that verified, in guest order, with its guest bytes (a replicated copy's
// SHA-512 of the kept part is taken from them); an error from it ends the
// check with that error.
using StagedClusterFn = std::function<Status(uint64_t cluster_index, std::span<const std::byte> bytes)>;
Result<StagedCheck> CheckStaged(Env& env, const std::string& staged_path,
                                const formats::Qcow2WriterOptions& options, const LoadedJournal& journal,
                                const StagedClusterFn& on_cluster = nullptr);
// The same for a raw file written by a RawDestination on a fresh file (a
// replicated raw copy): every cluster below the journal's next cluster is
// read back, a journaled one must match its digest and any other must read
// as zeros. `on_cluster` gets the journaled clusters that verified.
Result<StagedCheck> CheckStagedRaw(Env& env, const std::string& staged_path, uint64_t virtual_size,
                                   uint32_t cluster_bytes, const LoadedJournal& journal,
                                   const StagedClusterFn& on_cluster = nullptr);
// The same over a staged copy already open: an NBD export written in place
// (a replicated raw copy to nbd://), whose unwritten clusters were written
// as zeroes, so the same rule holds.
Result<StagedCheck> CheckStagedRaw(BlockSource& staged, uint64_t virtual_size, uint32_t cluster_bytes,
                                   const LoadedJournal& journal, const StagedClusterFn& on_cluster = nullptr);
// The entries' stored clusters, in order: what Qcow2Writer::Resume and
// PlanStored take.
std::vector<formats::StoredCluster> StoredClusters(std::span<const JournalEntry> entries);
// `journal` cut to the clusters below `cluster` (what a resume from there
// keeps), with `cluster` as its next cluster.
LoadedJournal JournalUpTo(const LoadedJournal& journal, uint64_t cluster);

// A sink whose bytes past its size at the wrap read as zeros, as the
// resumed writer only appends there (Qcow2Writer::Resume, or a resumed raw
// copy, truncated the file to its end): it may leave zero blocks unwritten as on a new file.
class ResumedSink final : public BlockSink {
 public:
  explicit ResumedSink(BlockSink& target) : target_(target) {}
  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  SinkCapabilities capabilities() const override {
    SinkCapabilities caps = target_.capabilities();
    caps.zero_initialized = true;
    return caps;
  }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override { return target_.WriteAt(offset, data); }
  Status WriteZeroes(uint64_t offset, uint64_t length) override { return target_.WriteZeroes(offset, length); }
  Status Flush() override { return target_.Flush(); }
  Status Truncate(uint64_t size_bytes) override { return target_.Truncate(size_bytes); }

 private:
  BlockSink& target_;  // the staged file's; outlives this
};

// How often a resumable copy checkpoints: about every 2% of its work (so
// a resumed run copies little again), between 4 and 64 MiB, and at least
// every kCheckpointInterval.
inline uint64_t CheckpointBytes(uint64_t work_bytes) {
  return std::clamp<uint64_t>(work_bytes / 50, 4ull << 20, 64ull << 20);
}
inline constexpr std::chrono::milliseconds kCheckpointInterval{2000};

// The journal being written. One thread at a time; `env` must outlive it.
class ResumeJournal {
 public:
  // Writes a new journal at `path` (atomically, durably): the header and,
  // when `kept` is not empty, one checkpoint holding them.
  static Result<std::unique_ptr<ResumeJournal>> Create(Env& env, const std::string& path, const ResumeKey& key,
                                                       std::span<const JournalEntry> kept, uint64_t next_cluster,
                                                       uint64_t end_bytes);
  ResumeJournal(const ResumeJournal&) = delete;
  ResumeJournal& operator=(const ResumeJournal&) = delete;

  // Appends one checkpoint (the entries stored since the last, the next
  // guest cluster to copy, the image's synced end) and flushes it.
  Status Append(std::span<const JournalEntry> entries, uint64_t next_cluster, uint64_t end_bytes);
  // Removes the journal file.
  Status Remove();
  uint64_t checkpoints() const { return checkpoints_; }

 private:
  ResumeJournal(Env& env, std::string path) : env_(env), path_(std::move(path)) {}
  Env& env_;
  std::string path_;
  std::unique_ptr<BlockSink> sink_;
  uint64_t size_bytes_ = 0;
  uint64_t checkpoints_ = 0;
};

// A qcow2 destination that journals what it stores: after every
// `checkpoint_bytes` of work consumed, or `checkpoint_interval`, it syncs
// the image (Qcow2Writer::Sync) and appends a checkpoint. Both must
// outlive it. Threads: as Destination (one at a time, in order).
class JournaledDestination final : public Destination {
 public:
  JournaledDestination(Qcow2Destination& inner, ResumeJournal& journal, bool store_zero, uint64_t checkpoint_bytes,
                       std::chrono::milliseconds checkpoint_interval);
  // Any destination that writes in guest order with `sync` making what it
  // stored durable and returning its file's end: a raw copy
  // (RawDestination, whose data clusters are journaled as kData). Its
  // Consume runs in order here, even where the inner one allows more.
  JournaledDestination(Destination& inner, std::function<Result<uint64_t>()> sync, ResumeJournal& journal,
                       bool store_zero, uint64_t checkpoint_bytes, std::chrono::milliseconds checkpoint_interval);

  const std::string& name() const override { return inner_.name(); }
  formats::Compression compression() const override { return inner_.compression(); }
  std::optional<formats::Qcow2WriterStats> qcow2_stats() const override { return inner_.qcow2_stats(); }
  Status Consume(const Chunk& chunk) override;
  Status Finish() override;

  // Syncs and journals what was stored since the last checkpoint (after a
  // failed copy: what the next run can resume from). A no-op when nothing
  // is new.
  Status Checkpoint();
  // Whether a Consume, Checkpoint or Finish failed: the target's fault, not the
  // source's (what was staged is then not kept for a resume).
  bool failed() const { return failed_; }

 private:
  Destination& inner_;  // borrowed
  std::function<Result<uint64_t>()> sync_;
  ResumeJournal& journal_;   // borrowed
  bool store_zero_;
  uint64_t checkpoint_bytes_;
  std::chrono::milliseconds checkpoint_interval_;
  std::vector<JournalEntry> pending_;
  uint64_t next_cluster_ = 0;
  uint64_t journaled_next_ = 0;
  uint64_t bytes_since_ = 0;
  std::chrono::steady_clock::time_point last_;
  bool failed_ = false;
};

}  // namespace barge::pipeline
