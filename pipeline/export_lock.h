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

// A folder that holds no point (no manifest, no merge journal) is
// kNotFound with nothing written in it. Then, under the chain's writer
// lock (ChainLock::Acquire, never waiting: kBusy while a backup, merge or
// forget runs), takes this export's own lock file DIR/.export-PID-N.lock,
// completes an interrupted merge and loads the folder into `*chain`, then
// releases the writer lock.
// A folder this process may not write (a read-only mount: EROFS; root's
// chain read by another user, or another user's with --allow-other-owner:
// EACCES) is only read: the chain's existing DIR/.lock is opened read-only, locked
// briefly to wait out a writer, and then held with a shared lock for the
// export's life (merge and forget probe it; backups go on); an
// interrupted merge is kBusy (its owner completes it). With no DIR/.lock
// there, the export holds no lock (note() says so).
// Returns the held export lock (the destructor of ExportLock removes its
// own file). `env` must outlive it.
class ExportLock {
 public:
  static Result<std::unique_ptr<ExportLock>> Take(Env& env, const std::string& dir, ChainFolder* chain);
  ~ExportLock();
  ExportLock(const ExportLock&) = delete;
  ExportLock& operator=(const ExportLock&) = delete;

  // How the folder is locked, when not by a lock file of the export's own
  // ("served without a lock: ..."); empty otherwise. For a debug log.
  const std::string& note() const { return note_; }

 private:
  ExportLock(Env& env, std::unique_ptr<EnvLock> lock, bool own_file, std::string note)
      : env_(env), lock_(std::move(lock)), own_file_(own_file), note_(std::move(note)) {}
  // Take's read-only path; `why` says why the folder is not written.
  static Result<std::unique_ptr<ExportLock>> TakeShared(Env& env, const std::string& dir, ChainFolder* chain,
                                                        const std::string& why);
  Env& env_;
  std::unique_ptr<EnvLock> lock_;  // null: lock-free
  bool own_file_;                  // lock_ is DIR/.export-PID-N.lock, removed at the end
  std::string note_;
};

// For a job about to remove points of `dir`, holding its writer lock:
// kBusy (retryable) naming the folder while an export holds its lock file,
// or a shared lock of DIR/.lock (an export of a read-only view of the
// folder); lock files of exports that died are removed. OK when none is
// held.
Status CheckNotExported(Env& env, const std::string& dir);

}  // namespace barge::pipeline
