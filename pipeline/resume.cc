#include "pipeline/resume.h"

#include <utility>


namespace barge::pipeline {

ResumeSite BackupResumeSite(const std::string& chain_dir) {
  return {chain_dir + "/" + std::string(kResumeJournalName), chain_dir + "/" + std::string(kResumeWorkName)};
}

Result<StagedCheck> StagedQcow2::Verify(const LoadedJournal& journal) {
  return CheckStaged(env_, path_(journal.key), options_, journal, on_cluster_);
}

Result<StagedCheck> StagedRaw::Verify(const LoadedJournal& journal) {
  open_failed_ = false;
  auto src = open_();
  if (!src.ok()) {
    open_failed_ = true;
    return std::move(src).error();
  }
  return CheckStagedRaw(**src, virtual_size_, cluster_bytes_, journal);
}

ResumeDecision DecideResume(const Result<LoadedJournal>& loaded, const ResumeTerms& terms, KeptData& kept) {
  using Outcome = ResumeDecision::Outcome;
  ResumeDecision d;
  if (!loaded.ok() && loaded.error().code() == ErrorCode::kNotFound) return d;
  d.outcome = Outcome::kDiscard;
  if (!terms.refused.empty()) {
    d.reason = terms.refused;
    return d;
  }
  if (!loaded.ok()) {
    d.reason = "its journal is unreadable (" + loaded.error().message() + ")";
    return d;
  }
  if (terms.expected) {
    d.reason = ResumeMismatch(loaded->key, terms.expected(loaded->key));
    if (!d.reason.empty()) return d;
  }
  auto check = kept.Verify(*loaded);
  if (!check.ok()) {
    if (kept.unreachable()) d.outcome = Outcome::kLeave;
    d.reason = check.error().code() == ErrorCode::kNotFound
                   ? kept.noun() + " is gone"
                   : kept.noun() + " cannot be read (" + check.error().message() + ")";
    return d;
  }
  if (check->next_cluster == 0) {
    d.reason = check->problem.empty() ? std::string("nothing was staged") : check->problem;
    return d;
  }
  d.outcome = Outcome::kResume;
  d.journal = *loaded;
  d.kept = std::move(check).value();
  d.reason = d.kept.problem;
  return d;
}

ResumeDecision FindResume(Env& env, const ResumeSite& site, const ResumeTerms& terms, KeptData& kept) {
  ResumeDecision d = DecideResume(LoadResumeJournal(env, site.journal), terms, kept);
  if (d.outcome == ResumeDecision::Outcome::kDiscard) {
    DiscardResume(env, site);
  } else if (d.outcome == ResumeDecision::Outcome::kNothing && !site.work.empty()) {
    IgnoreError(env.UnlinkIfExists(site.work), "a work set without its journal is never read");
  }
  return d;
}

bool KeepAfterFailure(const Error& error, JournaledDestination& journaled, const ResumeJournal& journal,
                      bool target_failure_keeps, const std::function<Status()>& keep) {
  if (error.code() == ErrorCode::kCancelled || error.code() == ErrorCode::kNoSpace) return false;
  if (journaled.failed()) return target_failure_keeps && journal.checkpoints() > 0;
  // What was stored after the last checkpoint is kept too.
  Status last = journaled.Checkpoint();
  return last.ok() && journal.checkpoints() > 0 && keep().ok();
}

void DiscardResume(Env& env, const ResumeSite& site) {
  IgnoreError(env.UnlinkIfExists(site.journal), "a stale journal's key never matches a later run");
  if (!site.work.empty()) {
    IgnoreError(env.UnlinkIfExists(site.work), "a work set without its journal is never read");
  }
}

Result<ResumeRecord> ReadResumeRecord(Env& env, const ResumeSite& site) {
  ResumeRecord record;
  BARGE_ASSIGN_OR_RETURN(record.journal, LoadResumeJournal(env, site.journal));
  if (site.work.empty()) return record;
  auto work = LoadResumeWork(env, site.work, record.journal.key.virtual_size);
  if (work.ok()) {
    record.work = std::move(work).value();
  } else if (work.error().code() != ErrorCode::kNotFound) {
    return Error::Corruption("its work set is unreadable (" + work.error().message() + ")").set_path(site.work);
  }
  return record;
}

std::unique_ptr<EnvLock> SpareKeptFile(Env& env, const std::string& staged_path) {
  LockOptions lo;
  lo.create = false;
  auto lock = env.LockFile(staged_path, lo);
  if (!lock.ok()) return nullptr;
  return std::move(lock).value();
}

ResumeNote NoteOf(const ResumeDecision& decision, uint64_t total_bytes, uint64_t staged_bytes) {
  ResumeNote note;
  note.resumed = decision.resumed();
  note.total_bytes = total_bytes;
  note.staged_bytes = decision.resumed() ? staged_bytes : 0;
  note.problem = decision.reason;
  return note;
}

}  // namespace barge::pipeline
