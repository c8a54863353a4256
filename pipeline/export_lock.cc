// Export lock files of a chain folder.
#include "pipeline/export_lock.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "blockio/leftovers.h"
#include "blockio/path.h"
#include "pipeline/chain_files.h"
#include "pipeline/file_access.h"

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

}  // namespace

Result<std::unique_ptr<ExportLock>> ExportLock::Take(Env& env, const std::string& dir, ChainFolder* chain) {
  BARGE_ASSIGN_OR_RETURN(ChainLock writer, AcquireBriefly(env, dir));
  BARGE_ASSIGN_OR_RETURN(*chain, LoadChainFolder(env, dir, &writer));
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
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EnvLock> lock, env.LockFile(path, o));
  // The writer lock goes when `writer` does, once this export's lock is held.
  return std::unique_ptr<ExportLock>(new ExportLock(env, std::move(lock)));
}

ExportLock::~ExportLock() {
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
  return OkStatus();
}

}  // namespace barge::pipeline
