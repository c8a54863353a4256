// How a served point stays in its chain folder (barge export, nbdkit's
// barge plugin): each export holds a lock file of its own in the folder,
// and the jobs that remove points (merge, forget) refuse to run while one
// is held. Backups add points and go on. docs/export.md, "Locks".
#pragma once

#include <memory>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "pipeline/chain.h"

namespace barge::pipeline {

// Under the chain's writer lock (ChainLock::Acquire, never waiting: kBusy
// while a backup, merge or forget runs), completes an interrupted merge,
// loads the folder into `*chain` and takes this export's own lock file
// DIR/.export-PID-N.lock, then releases the writer lock. Returns the held
// export lock (the destructor of ExportLock removes its file). `env` must
// outlive it.
class ExportLock {
 public:
  static Result<std::unique_ptr<ExportLock>> Take(Env& env, const std::string& dir, ChainFolder* chain);
  ~ExportLock();
  ExportLock(const ExportLock&) = delete;
  ExportLock& operator=(const ExportLock&) = delete;

 private:
  ExportLock(Env& env, std::unique_ptr<EnvLock> lock) : env_(env), lock_(std::move(lock)) {}
  Env& env_;
  std::unique_ptr<EnvLock> lock_;
};

// For a job about to remove points of `dir`, holding its writer lock:
// kBusy (retryable) naming the folder while an export holds its lock file;
// lock files of exports that died are removed. OK when none is held.
Status CheckNotExported(Env& env, const std::string& dir);

}  // namespace barge::pipeline
