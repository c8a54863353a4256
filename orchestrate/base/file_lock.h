// Cross-process exclusion for catalog work: an exclusive lock on a lock
// file (vm backup per domain, image add/sync per image), and the identity of
// a process written into catalog rows so that a later process can tell
// whether the row's writer is gone (killed, crashed, machine rebooted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

// What a catalog lock guards. Each kind has its own folder under
// <catalog folder>/locks, so that names of different kinds never meet (a
// domain named "policy-x" and policy "x" used to share one file).
enum class LockKind : uint8_t {
  kDomain,         // "domains": vm backup, cbt enable/disable, state migrate
  kImage,          // "images": image add, sync, forget, recovery
  kPolicy,         // "policies": one run of a policy at a time
  kSnapshotApply,  // "snapshot-apply": one apply per disk image
};

// The one lock-name scheme (docs/replication.md, "Locks"):
//   <folder of catalog_path>/locks/<kind folder>/<EscapeLockName(name)>.lock
// e.g. /var/lib/barge/locks/domains/web1.lock. Every catalog lock path is
// built here.
std::string CatalogLockPath(const std::string& catalog_path, LockKind kind, std::string_view name);

// `name` as one file name: bytes other than [A-Za-z0-9_+:@=,-] and '.'
// become %XX (uppercase hex), as does a leading '.' (so that no name is
// "." or ".." or hidden); "" becomes "%". Names of the allowed characters (every
// policy, source and typical domain name) are unchanged. Distinct names
// give distinct results.
std::string EscapeLockName(std::string_view name);

// Env::LockFile (an exclusive flock, released by the kernel when the
// process dies, so never stale; a second lock of the same path conflicts
// even inside one process) on `path`, after creating the file's folder.
// Without `wait` it does not block; with it, it blocks until the holder
// lets go (policy run --wait). The lock file itself is left in place
// (removing it would race with a waiter that already opened it).
// Returns:
//   the held lock;
//   kBusy (retryable) with `busy_message` and the lock's path when another
//     lock holds it (never with `wait`);
//   an errno Error when the folder or file cannot be made or opened.
Result<std::unique_ptr<EnvLock>> TryLockFile(Env& env, const std::string& path, const std::string& busy_message,
                                             bool wait = false);

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
