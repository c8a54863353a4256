// Policy hooks as commands (orchestrate/policy/policy_hooks.h): an adapter of
// orchestrate/base/hooks.h's runner (/bin/sh -c in a process group of its own,
// output kept, a deadline and the run's cancel flag enforced on the group).
#include "orchestrate/policy/policy_hooks.h"

#include <chrono>
#include <map>
#include <string>

#include "orchestrate/base/hooks.h"

namespace barge::orchestrate {
namespace {

// The variables a hook gets (docs/policies.md, "Hooks").
std::map<std::string, std::string> HookEnvironment(const HookContext& c) {
  std::map<std::string, std::string> env = {{kPolicyHookPolicyVar, c.policy},
                                            {kPolicyHookSourceVar, c.source},
                                            {kPolicyHookTargetVar, c.target},
                                            {kHookPhaseVar, c.phase}};
  if (c.phase == "post") {
    env[kHookStatusVar] = c.result == "success" ? "ok" : c.result;
    if (!c.error.empty()) env[kHookErrorVar] = c.error;
  }
  return env;
}

class CommandHookRunner final : public HookRunner {
 public:
  Status Run(const PolicyHook& hook, const HookContext& context, const std::atomic<bool>* cancel) override {
    auto run = RunHookCommand(context.phase, hook.command, HookEnvironment(context),
                              std::chrono::duration_cast<std::chrono::milliseconds>(hook.timeout), cancel);
    if (!run.ok()) return run.error();
    if (run->ok()) return OkStatus();
    return Error::IoError(run->Describe());
  }
};

}  // namespace

std::unique_ptr<HookRunner> NewPolicyHookRunner() { return std::make_unique<CommandHookRunner>(); }

}  // namespace barge::orchestrate
