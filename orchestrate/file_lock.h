// Cross-process exclusion for catalog work: an exclusive lock on a lock
// file (vm backup per domain, image add/sync per image), and the identity of
// a process written into catalog rows so that a later process can tell
// whether the row's writer is gone (killed, crashed, machine rebooted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

// Env::LockFile (an exclusive flock, released by the kernel when the
// process dies, so never stale; a second lock of the same path conflicts
// even inside one process) on `path`, without waiting, after creating the
// file's folder. The lock file itself is left in place (removing it would
// race with a waiter that already opened it).
// Returns:
//   the held lock;
//   kBusy (retryable) with `busy_message` and the lock's path when another
//     lock holds it;
//   an errno Error when the folder or file cannot be made or opened.
Result<std::unique_ptr<EnvLock>> TryLockFile(Env& env, const std::string& path,
                                             const std::string& busy_message);

// Who a process is, precisely enough to survive pid reuse: host name, the
// kernel's boot id (/proc/sys/kernel/random/boot_id), pid and the process's
// start time in clock ticks since boot (/proc/PID/stat field 22). Encoded
// as "pid=PID start=TICKS boot=BOOT_ID host=HOST" (one line, no quoting:
// none of the parts holds a space).
struct ProcessOwner {
  std::string host;
  std::string boot_id;
  pid_t pid = 0;
  uint64_t start_ticks = 0;

  // The calling process (cached per pid; /proc read through `env` the
  // first time). Thread-safe.
  static ProcessOwner Self(Env& env);
  // A live process of this machine; kNotFound when there is none.
  static Result<ProcessOwner> Of(Env& env, pid_t pid);
  // Parses Encode()'s form; kInvalidArgument for anything else.
  static Result<ProcessOwner> Parse(const std::string& text);
  std::string Encode() const;
};

// Whether the process `owner` (Encode()'s form) has certainly ended:
//   true  for an empty or unparseable owner (written by no live barge:
//         older versions stored none);
//   true  when the host is ours and the boot id differs (rebooted since),
//         or no process has that pid, or it has another start time (the pid
//         was reused), or it is a zombie;
//   false when that process still runs, and for an owner on another host
//         (this machine cannot tell, so it never claims one is gone).
// Reads /proc through `env`; does not block. Thread-safe.
bool OwnerIsGone(Env& env, const std::string& owner);

}  // namespace barge::orchestrate
