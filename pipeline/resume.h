// One resume mechanism for every job that continues what a killed run kept
// (docs/resume.md). A resumable job keeps, at a *site*, a journal (its key:
// what makes a later run "the same job"; its entries: what was stored, with
// digests) and, when it may resume at another point in time, its work set;
// beside them lies the data itself (a staged image, a copy's temporary, an
// NBD export written in place; later an object store's multipart upload),
// which a KeptData reads back. The next run finds the site, validates the
// journal's key against the job it is asked for, verifies the kept data
// against the journal, and continues from the verified part, or discards
// everything with a reason it reports.
//
// Used by backup (pipeline/backup_image.cc's FindStaged), replicate and
// so image add/sync (pipeline/replicate_destinations.cc's FindStagedCopy),
// and read by vm backup's planner (ReadResumeRecord). The journal's
// format: docs/formats/resume.md; the mechanism: docs/resume.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "blockio/extent.h"
#include "blockio/source.h"
#include "formats/qcow2_writer.h"
#include "pipeline/backup_resume.h"

namespace barge::pipeline {

// Where a killed job's leftovers are recorded.
struct ResumeSite {
  std::string journal;  // the journal's path
  std::string work;     // the work set's path (an extents file), or "" when the job keeps none
};

// A backup's site in chain folder `chain_dir` (one backup of a chain at a
// time): kResumeJournalName and kResumeWorkName there.
ResumeSite BackupResumeSite(const std::string& chain_dir);

// What a killed job kept besides its journal, as the next run reads it
// back. A new kind of target (an object store's multipart upload: its id
// in the key, one journal entry per part with the part's digest) is a new
// implementation; the find/validate/discard steps stay as they are.
class KeptData {
 public:
  virtual ~KeptData() = default;
  KeptData(const KeptData&) = delete;
  KeptData& operator=(const KeptData&) = delete;

  // The data in reasons: "the staged image", "the staged copy".
  virtual std::string noun() const = 0;
  // Reads back what `journal` says was kept and verifies it: the entries up
  // to the first that fails to check are kept (StagedCheck). kNotFound when
  // the data is gone; any other error when it cannot be read at all.
  virtual Result<StagedCheck> Verify(const LoadedJournal& journal) = 0;
  // After Verify failed: true when the data could not be reached now (an
  // export that is down) rather than being bad; the journal then stays for
  // a run that reaches it.
  virtual bool unreachable() const { return false; }

 protected:
  KeptData() = default;
};

// A staged qcow2 image written by a Qcow2Writer with `options`; its path
// follows from the staged key (a backup's image is named after the killed
// run's start). CheckStaged; `on_cluster` as there.
class StagedQcow2 final : public KeptData {
 public:
  StagedQcow2(Env& env, std::string noun, std::function<std::string(const ResumeKey&)> path,
              formats::Qcow2WriterOptions options, StagedClusterFn on_cluster = nullptr)
      : env_(env), noun_(std::move(noun)), path_(std::move(path)), options_(options),
        on_cluster_(std::move(on_cluster)) {}
  std::string noun() const override { return noun_; }
  Result<StagedCheck> Verify(const LoadedJournal& journal) override;

 private:
  Env& env_;
  std::string noun_;
  std::function<std::string(const ResumeKey&)> path_;
  formats::Qcow2WriterOptions options_;
  StagedClusterFn on_cluster_;
};

// A raw copy written front to back on a fresh file or an export whose
// unwritten clusters read as zeros (CheckStagedRaw), opened by `open`.
// With `reach_later`, a failure to open it is unreachable().
class StagedRaw final : public KeptData {
 public:
  using Opener = std::function<Result<std::unique_ptr<BlockSource>>()>;
  StagedRaw(std::string noun, Opener open, uint64_t virtual_size, uint32_t cluster_bytes, bool reach_later)
      : noun_(std::move(noun)), open_(std::move(open)), virtual_size_(virtual_size), cluster_bytes_(cluster_bytes),
        reach_later_(reach_later) {}
  std::string noun() const override { return noun_; }
  Result<StagedCheck> Verify(const LoadedJournal& journal) override;
  bool unreachable() const override { return open_failed_ && reach_later_; }

 private:
  std::string noun_;
  Opener open_;
  uint64_t virtual_size_;
  uint32_t cluster_bytes_;
  bool reach_later_;
  bool open_failed_ = false;
};

// Kept data checked by a function: a job's own variation (a backup's
// staged image cut where the disk changed since; an error known before
// any check), and tests.
class KeptCheck final : public KeptData {
 public:
  using CheckFn = std::function<Result<StagedCheck>(const LoadedJournal&)>;
  KeptCheck(std::string noun, CheckFn check) : noun_(std::move(noun)), check_(std::move(check)) {}
  std::string noun() const override { return noun_; }
  Result<StagedCheck> Verify(const LoadedJournal& journal) override { return check_(journal); }

 private:
  std::string noun_;
  CheckFn check_;
};

// What the run asking now accepts.
struct ResumeTerms {
  // Why nothing staged may be resumed at all ("resuming is off", a kind of
  // job that never resumes), or "" to look.
  std::string refused;
  // The key a staged run must have had to be this job, given the staged
  // key (a backup's id and image follow from the staged run's start).
  std::function<ResumeKey(const ResumeKey& staged)> expected;
};

// What the next run does with a site.
struct ResumeDecision {
  enum class Outcome : uint8_t {
    kNothing,  // no journal: nothing was kept
    kResume,   // continue from `kept`
    kDiscard,  // not reusable: the journal and work set go (the data is swept as any leftover)
    kLeave,    // not reachable now: everything stays for a later run
  };
  Outcome outcome = Outcome::kNothing;
  LoadedJournal journal;  // kResume: as read (all its entries)
  StagedCheck kept;       // kResume: the part that verified (next_cluster > 0)
  // kResume: why not all of the staged data is kept ("" when all is);
  // kDiscard, kLeave: why none is, in words for "staged data not reusable: WHY".
  std::string reason;

  bool found() const { return outcome != Outcome::kNothing; }
  bool resumed() const { return outcome == Outcome::kResume; }
  // The journal cut to the kept part (what a resumed writer continues).
  LoadedJournal KeptJournal() const { return JournalUpTo(journal, kept.next_cluster); }
};

// The decision over a journal as loaded (kNotFound: there is none), in
// this order: refused, journal unreadable, key mismatch (ResumeMismatch),
// kept data gone, unreadable or with nothing verified. Touches no file.
ResumeDecision DecideResume(const Result<LoadedJournal>& loaded, const ResumeTerms& terms, KeptData& kept);

// Loads the site's journal and decides; then removes what a decision
// leaves no use for: on kDiscard the journal and work set, on kNothing a
// work set without its journal. The kept data itself is never removed
// here (the job's sweep of stale temporaries takes it).
ResumeDecision FindResume(Env& env, const ResumeSite& site, const ResumeTerms& terms, KeptData& kept);

// After a failed copy: whether what was staged is kept for the next run
// (the caller then lets go of its journal and says so; else it discards).
// Never after a cancel (kCancelled: asked to stop) or a full target
// (kNoSpace). When the source failed (not journaled.failed()): the last
// checkpoint is journaled, then `keep` makes the staged data a leftover
// the next run finds (StagedFile::Keep); kept when both succeed and some
// checkpoint was journaled. When the target failed: kept only with
// `target_failure_keeps` (an export written in place, every journaled
// checkpoint after a flush of it, read back before it is trusted) and some
// checkpoint journaled; a local file that failed a write is not to be
// trusted. Callers with a policy of their own (a backup's keep_staged)
// ask only when it allows.
bool KeepAfterFailure(const Error& error, JournaledDestination& journaled, const ResumeJournal& journal,
                      bool target_failure_keeps, const std::function<Status()>& keep);

// Removes the site's journal and work set (a failed run that keeps
// nothing; a finished one). Failures are ignored: a journal whose data
// is gone never verifies.
void DiscardResume(Env& env, const ResumeSite& site);

// The record a site holds, read back without deciding anything (a
// planner's look at what the next run will find: vm backup's PlanResumes).
struct ResumeRecord {
  LoadedJournal journal;
  std::optional<RangeList> work;  // when the site keeps one and it exists
};
// kNotFound when there is no journal; the journal's error when it does not
// load; kCorruption "its work set is unreadable (...)" when the site's work
// set exists but does not decode for the journal's disk size.
Result<ResumeRecord> ReadResumeRecord(Env& env, const ResumeSite& site);

// A lock on the staged file at `staged_path` (not created), so that a sweep
// of stale temporaries spares it until the run decides; null when it
// is missing or another process holds it.
std::unique_ptr<EnvLock> SpareKeptFile(Env& env, const std::string& staged_path);

// The note a job reports (BackupResult/ReplicateResult::resume, on_resume)
// for a found site: `total_bytes` of work, of which `staged_bytes` are kept.
ResumeNote NoteOf(const ResumeDecision& decision, uint64_t total_bytes, uint64_t staged_bytes);

}  // namespace barge::pipeline
