// The command runner behind a policy's pre_hook and post_hook
// (docs/policies.md, "Hooks"): each hook is `/bin/sh -c COMMAND` in a
// process group of its own, with the policy, source, target and phase in
// its environment, stopped when it outlives its timeout.
#pragma once

#include <memory>

#include "orchestrate/policy/policy_runner.h"

namespace barge::orchestrate {

// Environment of a hook, besides the process's own variables:
//   BARGE_POLICY, BARGE_SOURCE, BARGE_TARGET  the policy, the source's name,
//                                             the target folder chosen
//   BARGE_HOOK_PHASE                          "pre" or "post"
//   BARGE_HOOK_STATUS  (post)                 "ok", "failed" (the backup
//                                             failed) or "aborted" (the pre
//                                             hook failed: nothing was done)
//   BARGE_HOOK_ERROR   (post, when not ok)    why
// The phase, status and error names are those of orchestrate/base/hooks.h
// (snapshot hooks), so one script serves both.
inline constexpr const char* kPolicyHookPolicyVar = "BARGE_POLICY";
inline constexpr const char* kPolicyHookSourceVar = "BARGE_SOURCE";
inline constexpr const char* kPolicyHookTargetVar = "BARGE_TARGET";

// The HookRunner policies use. Run() blocks until the command ends; it
// returns ok for exit status 0, and otherwise kIoError naming the command
// and how it ended ("exited with 3", "timed out after 5m", "was killed by
// signal 9") with the last line of its output (stdout and stderr). At the
// timeout, or when *cancel turns true (the run was stopped; pre hooks
// only), the command's whole process group gets SIGTERM, then SIGKILL 2 s
// later; the result is then an error too (kCancelled when cancelled).
// Thread-safe: sources run their hooks at once.
//
// Built on orchestrate/base/hooks.h's RunHookCommand where that header exists
// (there the cancel flag is not watched: a pre hook runs to its end or its
// timeout); otherwise on a runner of its own with the same behaviour.
std::unique_ptr<HookRunner> NewPolicyHookRunner();

}  // namespace barge::orchestrate
