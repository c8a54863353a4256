// Consistency hook flags and how their runs are reported.
#include "cli/hook_flags.h"

#include "cli/common.h"
#include "cli/interrupt.h"

namespace barge::cli {

void HookFlags::AddTo(CLI::App* app) {
  app->add_option("--pre-hook", pre,
                  "Shell command run before the consistent point; failing aborts with nothing made "
                  "(environment: docs/snapshots.md)");
  app->add_option("--post-hook", post, "Shell command run after it, whatever happened");
  app->add_option("--hook-timeout", timeout, "Stop a hook that runs longer (30s, 2m)")->capture_default_str();
}

Result<orchestrate::HookSpec> HookFlags::ToSpec() const {
  orchestrate::HookSpec spec;
  spec.pre = pre;
  spec.post = post;
  auto seconds = formats::ParseDurationSeconds(timeout);
  if (!seconds.ok()) return Error::InvalidArgument("--hook-timeout: " + seconds.error().message());
  if (*seconds <= 0 || *seconds > 24 * 3600) {
    return Error::InvalidArgument("--hook-timeout must be between 1s and 24h, not '" + timeout + "'");
  }
  spec.timeout = std::chrono::seconds(*seconds);
  spec.cancel = &CancelFlag();  // SIGINT/SIGTERM stop a pre-hook in progress
  return spec;
}

nlohmann::json HookRunsJson(const std::vector<orchestrate::HookRun>& runs) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : runs) {
    arr.push_back({{"phase", r.phase},
                   {"command", r.command},
                   {"exit_code", r.exit_code},
                   {"timed_out", r.timed_out},
                   {"duration_seconds", r.seconds}});
  }
  return arr;
}

std::string HookRunsText(const std::vector<orchestrate::HookRun>& runs) {
  std::string text;
  for (const auto& r : runs) {
    text += "  " + r.phase + "-hook: " + (r.ok() ? "ok" : r.Describe()) + " (" + HumanSeconds(r.seconds) + ")\n";
  }
  return text;
}

}  // namespace barge::cli
