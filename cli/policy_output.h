// What `barge run` and `barge serve` print about a policy run: the JSON
// object (run's result, serve's "run" events); the readable lines are
// orchestrate::RunReportText.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_runner.h"

namespace barge::cli {

// A run's or record's shard: {index, count}, or null when not sharded.
nlohmann::json ShardJson(const orchestrate::ShardSpec& shard);

// {policy, run_id, shard, started_at, finished_at, duration_seconds, due, ran,
// succeeded, failed, stopped, stop_reason, sources: [...]} (docs/policies.md,
// "JSON").
nlohmann::json RunReportJson(const orchestrate::Policy& policy, const orchestrate::RunReport& report);

// The stop reason of runs ended by SIGINT or SIGTERM ("stopped by SIGTERM").
std::string SignalStopReason();

}  // namespace barge::cli
