// Resuming an interrupted backup: while a backup runs, a journal beside its
// staged image records, at checkpoints, the clusters the qcow2 writer stored
// and their digests; the next run of the same backup checks them against
// the staged image and goes on from there instead of starting over. The
// journal's format: docs/formats/resume.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/extent.h"
#include "formats/digest.h"
#include "formats/qcow2_writer.h"
#include "pipeline/destination.h"

namespace barge::pipeline {

// The journal's name in the chain folder (one backup of a chain at a time).
inline constexpr std::string_view kResumeJournalName = ".backup.barge-resume";

// What makes a staged backup "the same backup" as the one asked for now.
// Every field must match for a resume; ResumeMismatch says which did not.
struct ResumeKey {
  std::string id;            // the point's id (sequence and start time)
  std::string started_at;    // its start, kept by the resumed run
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
Result<StagedCheck> CheckStaged(Env& env, const std::string& staged_path,
                                const formats::Qcow2WriterOptions& options, const LoadedJournal& journal);

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
  Qcow2Destination& inner_;  // borrowed
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
