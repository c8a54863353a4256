// --pre-hook, --post-hook and --hook-timeout, shared by every command that
// makes a consistent point (snapshot create, backup, vm backup); the hooks
// themselves are orchestrate/base/hooks.h's.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/error.h"
#include "orchestrate/base/hooks.h"

namespace barge::cli {

struct HookFlags {
  std::string pre, post;
  std::string timeout = "60s";

  void AddTo(CLI::App* app);
  // kInvalidArgument naming --hook-timeout when it is not a positive
  // duration ("30s", "2m").
  Result<orchestrate::HookSpec> ToSpec() const;
};

// The hooks that ran, for a result: [{"phase", "command", "exit_code",
// "timed_out", "duration_seconds"}], and one text line each.
nlohmann::json HookRunsJson(const std::vector<orchestrate::HookRun>& runs);
std::string HookRunsText(const std::vector<orchestrate::HookRun>& runs);

}  // namespace barge::cli
