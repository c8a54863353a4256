// Consistency hooks: user commands run before and after a consistent point
// (a snapshot, a backup, a VM backup) so that an application can flush and
// resume. One small component every job uses the same way; the contract is
// in docs/snapshots.md ("Consistency hooks").
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "blockio/error.h"

namespace barge::orchestrate {

// The environment names a hook sees, besides the caller's own variables and
// the process environment.
inline constexpr const char* kHookPhaseVar = "BARGE_HOOK_PHASE";    // "pre" or "post"
inline constexpr const char* kHookStatusVar = "BARGE_HOOK_STATUS";  // post only: ok, failed, aborted
inline constexpr const char* kHookErrorVar = "BARGE_HOOK_ERROR";    // post only: why, when not ok

struct HookSpec {
  std::string pre;   // shell command (/bin/sh -c); "" = none
  std::string post;  // shell command; "" = none
  // Each command is stopped (SIGTERM to its process group, SIGKILL 2 s
  // later) when it runs longer.
  std::chrono::milliseconds timeout{60000};
  // The job's stop (SIGINT/SIGTERM): when it turns true, the pre-hook in
  // progress is stopped as at its timeout (HookRun::cancelled) and the job
  // aborted; the post-hook still runs to its end (it may thaw a guest).
  // May be null. Must outlive the run.
  const std::atomic<bool>* cancel = nullptr;
};

// How one command ended.
struct HookRun {
  std::string phase;    // "pre" or "post"
  std::string command;
  int exit_code = -1;   // -1 when killed by a signal or not started
  int signal = 0;       // the signal that ended it, if any
  bool timed_out = false;
  bool cancelled = false;  // stopped because the caller's cancel flag was set
  std::string output;   // stdout and stderr together, at most the last 64 KiB
  double seconds = 0;
  bool ok() const { return exit_code == 0 && !timed_out && !cancelled; }
  // "pre-hook 'cmd' exited with 3: <last line of output>", "... timed out after 5 s".
  std::string Describe() const;
};

// Runs `command` with /bin/sh -c, stdin from /dev/null, stdout and stderr
// captured, `env` added to the process environment, in a process group of
// its own. Blocks until it ends or the timeout stops it.
// Returns the run (also when the command failed), or kIoError when it
// cannot be started at all.
// A set `cancel` stops the command the same way (HookRun::cancelled).
Result<HookRun> RunHookCommand(const std::string& phase, const std::string& command,
                               const std::map<std::string, std::string>& env,
                               std::chrono::milliseconds timeout,
                               const std::atomic<bool>* cancel = nullptr);

struct HookedResult {
  std::vector<HookRun> runs;          // the hooks that ran, in order
  std::vector<std::string> warnings;  // a failed post-hook after a good body
};

// The one rule for a failed post-hook, shared by every job with hooks
// (snapshot create, backup, vm backup, policies; docs/snapshots.md,
// "Consistency hooks"): `post_failure` (ok when the post-hook succeeded or
// there was none) after a `body` that succeeded is a warning, its message
// appended to `warnings` and ok returned (the consistent point, snapshot
// or backup exists and is kept); after a `body` that failed or was aborted
// it is appended to the body's error (Error::Also), which is returned.
Status ApplyPostHookRule(Status body, Status post_failure, std::vector<std::string>& warnings);

// pre-hook, then `body`, then post-hook:
//   - a pre-hook that fails (non-zero exit, timeout, cannot start) aborts:
//     `body` is not called, the post-hook still runs (status "aborted"),
//     and the error (kCancelled, naming the pre-hook) is returned;
//   - the post-hook runs whatever `body` returned (status "ok" or
//     "failed" with the error in BARGE_HOOK_ERROR);
//   - a failing post-hook: ApplyPostHookRule (a warning after a good body,
//     appended to the error after a failed or aborted one).
// `env` goes to both hooks (each also gets BARGE_HOOK_PHASE). `result`, if
// given, receives the runs and warnings in either case.
Status RunWithHooks(const HookSpec& hooks, const std::map<std::string, std::string>& env,
                    const std::function<Status()>& body, HookedResult* result = nullptr);

}  // namespace barge::orchestrate
