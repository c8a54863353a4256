// Export lock files of a chain folder.
#include "pipeline/export_lock.h"

#include <errno.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include "blockio/leftovers.h"
#include "blockio/path.h"
#include "pipeline/chain_files.h"
#include "pipeline/file_access.h"
#include "pipeline/merge_journal.h"

namespace barge::pipeline {

namespace {

constexpr std::string_view kPrefix = ".export-";
constexpr std::string_view kSuffix = ".lock";

bool IsExportLockName(const std::string& name) {
  return name.size() > kPrefix.size() + kSuffix.size() && name.starts_with(kPrefix) && name.ends_with(kSuffix);
}

// The writer lock, retried for a moment: two exports starting together
// each hold it only briefly.
Result<ChainLock> AcquireBriefly(Env& env, const std::string& dir) {
  for (int attempt = 0;; ++attempt) {
    auto lock = ChainLock::Acquire(env, dir, /*wait=*/false);
    if (lock.ok() || lock.error().code() != ErrorCode::kBusy || attempt >= 20) return lock;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// An error that says this process may not write into the folder: a
// read-only mount (EROFS), another user's folder (EACCES, EPERM).
bool CannotWrite(const Error& e) {
  const int err = e.errno_value();
  return err == EROFS || err == EACCES || err == EPERM;
}

// Before anything is written into `dir`: a folder that holds no point
// (barge export /etc) is refused with nothing made in it.
Status CheckHoldsChain(Env& env, const std::string& dir) {
  auto st = env.Stat(dir);
  if (!st.ok() || !st->is_directory()) {
    if (st.ok() || st.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("no such chain folder (nothing backed up under this name?)").set_path(dir);
    }
    return st.error();
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    if (name == kMergeJournalName) return OkStatus();
    if (!name.empty() && name[0] != '.' && Extension(name) == ".json") return OkStatus();
  }
  return Error::NotFound("not a chain folder: it holds no backup (no manifest ID.json); name the folder of one "
                         "disk's chain")
      .set_path(dir);
}

// The chain's lock file, opened read-only (never made, never followed):
// how an export that may not write the folder waits out a writer. Null
// when there is none.
Result<std::unique_ptr<EnvLock>> LockExistingBriefly(Env& env, const std::string& dir) {
  LockOptions o;
  o.create = false;
  o.busy_message = "another barge job is writing this chain folder now";
  for (int attempt = 0;; ++attempt) {
    auto lock = env.LockFile(JoinPath(dir, ".lock"), o);
    if (lock.ok()) return lock;
    const ErrorCode code = lock.error().code();
    if (code == ErrorCode::kNotFound) return std::unique_ptr<EnvLock>();
    if (code != ErrorCode::kBusy || attempt >= 20) {
      Error e = std::move(lock).error();
      if (code == ErrorCode::kBusy) e.set_path(dir);
      return e;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

Result<std::unique_ptr<ExportLock>> ExportLock::TakeShared(Env& env, const std::string& dir, ChainFolder* chain,
                                                           const std::string& why) {
  // Nothing below writes: no lock file made, no interrupted merge
  // completed, no leftover swept.
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EnvLock> brief, LockExistingBriefly(env, dir));
  BARGE_ASSIGN_OR_RETURN(bool journal, MergeJournalExists(env, dir));
  if (journal) {
    return Error::Busy("an interrupted merge must be completed first, by a job that may write the folder (" + why +
                       "): run barge merge or barge list there as its owner")
        .set_path(dir);
  }
  BARGE_ASSIGN_OR_RETURN(*chain, LoadChainFolder(env, dir));
  if (brief == nullptr) {
    // No lock file, and none can be made here: no barge job ever locked
    // the folder (a copy made without hidden files?). Nothing to share.
    return std::unique_ptr<ExportLock>(
        new ExportLock(env, nullptr, false,
                       "served without a lock: the chain folder has no lock file and " + why));
  }
  // A shared (OFD read) lock of the chain's lock file, held for the
  // export's life: merge and forget probe it (CheckNotExported), backups
  // (flock on the same file, which OFD locks do not meet) go on.
  auto shared = env.LockImage(brief->path(), ImageAccess::kRead);
  if (!shared.ok()) return std::move(shared).error().set_path(dir);
  return std::unique_ptr<ExportLock>(new ExportLock(env, std::move(shared).value(), false,
                                                    "a shared lock of the chain's lock file: " + why));
}

Result<std::unique_ptr<ExportLock>> ExportLock::Take(Env& env, const std::string& dir, ChainFolder* chain) {
  // A folder that is no chain (barge export /etc) gets nothing written.
  BARGE_RETURN_IF_ERROR(CheckHoldsChain(env, dir));
  std::optional<ChainLock> writer;
  {
    auto acquired = AcquireBriefly(env, dir);
    if (!acquired.ok()) {
      if (!CannotWrite(acquired.error())) return std::move(acquired).error();
      return TakeShared(env, dir, chain, "it cannot be written (" + acquired.error().ToString() + ")");
    }
    writer.emplace(std::move(acquired).value());
  }
  static std::atomic<uint64_t> counter{0};
  const std::string path =
      JoinPath(dir, std::string(kPrefix) + std::to_string(::getpid()) + "-" + std::to_string(counter++) +
                        std::string(kSuffix));
  LockOptions o;
  o.busy_message = "another export holds this lock file";
  // A link or FIFO planted under the (predictable) name goes, never followed.
  BARGE_RETURN_IF_ERROR(RemovePlanted(env, path));
  BARGE_ASSIGN_OR_RETURN(FileAccess access, FolderAccess(env, dir));
  o.create_mode = access.file_mode;  // as private as the chain's other files
  // Made before the folder is loaded (which may complete a merge): a
  // folder this process may not write (a read-only mount, another user's
  // chain) is then only read.
  auto own = env.LockFile(path, o);
  if (!own.ok()) {
    if (!CannotWrite(own.error())) return std::move(own).error();
    const std::string why = "it cannot be written (" + own.error().ToString() + ")";
    writer.reset();  // the brief lock goes before the shared one's own brief lock is taken
    return TakeShared(env, dir, chain, why);
  }
  std::unique_ptr<ExportLock> held(new ExportLock(env, std::move(own).value(), true, ""));
  BARGE_ASSIGN_OR_RETURN(*chain, LoadChainFolder(env, dir, &*writer));
  // The writer lock goes when `writer` does, once this export's lock is held.
  return held;
}

ExportLock::~ExportLock() {
  if (lock_ == nullptr || !own_file_) return;
  // Removed while held: a merge that opened it meanwhile finds no file.
  IgnoreError(env_.UnlinkIfExists(lock_->path()), "a stale export lock file is removed by the next merge or forget");
}

Status CheckNotExported(Env& env, const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    if (!IsExportLockName(name)) continue;
    const std::string path = JoinPath(dir, name);
    // A link or FIFO planted under an export lock's name is no export's.
    BARGE_ASSIGN_OR_RETURN(bool planted, RemovePlanted(env, path));
    if (planted) continue;
    LockOptions o;
    o.create = false;
    auto lock = env.LockFile(path, o);
    if (!lock.ok()) {
      if (lock.error().code() == ErrorCode::kNotFound) continue;  // the export just ended
      if (lock.error().code() == ErrorCode::kBusy) {
        return Error::Busy("a point of this chain folder is being exported (barge export, or nbdkit's barge "
                           "plugin): stop the export, then retry")
            .set_path(dir);
      }
      return lock.error();
    }
    // Nobody holds it: an export that died. Removed while we hold it.
    BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(path));
  }
  // Exports that could make no lock file of their own (a read-only view
  // of the folder, another user's chain) hold a shared lock of the chain's
  // lock file instead (ExportLock::TakeShared): probed with a conflicting
  // one, held only for the probe.
  auto probe = env.LockImage(JoinPath(dir, ".lock"), ImageAccess::kExclusiveWrite);
  if (!probe.ok()) {
    if (probe.error().code() == ErrorCode::kNotFound) return OkStatus();
    if (probe.error().code() == ErrorCode::kBusy) {
      return Error::Busy("a point of this chain folder is being exported from a read-only view of it (barge export "
                         "or barge files of another user, or of a read-only mount): stop the export, then retry")
          .set_path(dir);
    }
    return probe.error();
  }
  return OkStatus();
}

}  // namespace barge::pipeline
