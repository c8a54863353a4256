// backup and vm backup inside their consistency hooks
// (orchestrate/vm/hooked_backup.h).
#include "orchestrate/vm/hooked_backup.h"

#include <map>
#include <optional>
#include <string>

namespace barge::orchestrate {
namespace {

// `run` (returning a Result<T>) between the hooks; the result, or the
// failure under the one post-hook rule (hooks.h).
template <typename T, typename Run>
Result<T> WithHooks(const HookSpec& hooks, const std::map<std::string, std::string>& hook_env,
                    HookedResult& hooked, Run run) {
  std::optional<T> result;
  Status done = RunWithHooks(hooks, hook_env, [&]() -> Status {
    auto r = run();
    if (!r.ok()) return std::move(r).error();
    result = std::move(r).value();
    return OkStatus();
  }, &hooked);
  if (!done.ok()) return std::move(done).error();
  return std::move(*result);
}

}  // namespace

Result<pipeline::BackupResult> RunBackupWithHooks(Env& env, const pipeline::BackupRequest& req, const HookSpec& hooks,
                                                  HookedResult& hooked) {
  const std::string& source = req.source.location;
  std::map<std::string, std::string> hook_env = {{"BARGE_OPERATION", "backup"},
                                                 {"BARGE_IMAGE", source},
                                                 {"BARGE_DISK", req.disk_name.empty() ? source : req.disk_name}};
  if (!req.source.snapshot.empty()) hook_env["BARGE_SNAPSHOT"] = req.source.snapshot;
  return WithHooks<pipeline::BackupResult>(hooks, hook_env, hooked, [&] { return pipeline::RunBackup(env, req); });
}

Result<VmBackupResult> RunVmBackupWithHooks(Env& env, const VmBackupRequest& req, const HookSpec& hooks,
                                            HookedResult& hooked) {
  std::map<std::string, std::string> hook_env = {{"BARGE_OPERATION", "vm-backup"}, {"BARGE_DOMAIN", req.domain}};
  return WithHooks<VmBackupResult>(hooks, hook_env, hooked, [&] { return RunVmBackup(env, req); });
}

}  // namespace barge::orchestrate
