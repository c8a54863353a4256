// What `barge run` and `barge serve` print about a policy run: the JSON
// object (run's result, serve's "run" events) and the readable lines.
#pragma once

#include <iosfwd>
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

// One line per source (what ran, why, where, how it ended), then a summary.
void PrintRunReport(std::ostream& out, const orchestrate::Policy& policy, const orchestrate::RunReport& report);

// The stop reason of runs ended by SIGINT or SIGTERM ("stopped by SIGTERM").
std::string SignalStopReason();

}  // namespace barge::cli
