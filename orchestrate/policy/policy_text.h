// What a person reads about policies: `policy check`'s summary and
// problem lines, `policy shards`, `run`'s per-source lines, `forget`'s plan
// and `runs list`'s records, each rendered from the orchestrate struct it
// describes. The cli prints these strings; --json is the cli's own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_catalog.h"
#include "orchestrate/policy/policy_problems.h"
#include "orchestrate/policy/policy_runner.h"

namespace barge::orchestrate {

// A policy file's problems compiler-style, one a line:
// "FILE:LINE:COLUMN: message" (editors jump to them), "FILE: message" for
// one without a place.
std::string PolicyProblemsText(const std::string& file, const std::vector<PolicyProblem>& problems);

// `policy check` of a valid policy: that it is valid (with `warnings`
// warnings said above it), each source (how its incrementals find changes,
// its tracker, host, quiesce), the targets and free-space check, retention,
// parallelism, run time, chains, compression, the alert, and the schedule
// with `next_runs` (each also in the schedule's own zone when not UTC).
std::string PolicyCheckText(const std::string& file, const Policy& p, size_t warnings,
                            const std::vector<std::chrono::sys_seconds>& next_runs);

// The usage error for the first of `wanted` (--source names) that is not a
// source of `p`: its name, a likely intended one, and the policy's
// sources. "" when every name is one.
std::string UnknownSourceMessage(const Policy& p, const std::vector<std::string>& wanted);

// Which shard of `count` (ShardOfSource) backs up each source of a policy.
struct PolicyShards {
  std::vector<std::pair<std::string, uint32_t>> sources;  // name and shard, in the policy's order
  std::vector<std::vector<std::string>> per;              // per shard index, the names in that order
};
// count >= 1.
PolicyShards ShardPolicySources(const Policy& p, uint32_t count);

// `policy shards`' text.
std::string ShardsText(const Policy& p, const PolicyShards& shards);

// One line per source of a run (what ran, why, where, how it ended; or
// why it was not due), then the run's summary.
std::string RunReportText(const Policy& policy, const RunReport& report);

// One source's (or a chain folder's) forget: the counts, each kept point
// with the rules that keep it (or why it is kept anyway), each point
// removed, the merge and remove actions, and the error. `dry_run` says
// "would".
std::string ForgetSourceText(const ForgetSourceReport& r, bool dry_run);

// `runs list`'s records (each with the catalog file it is in), newest
// first: a line each with its points under it; "no runs recorded [for
// policy NAME]" without any. `name_catalogs`: say which catalog file holds
// each record (more than one was read).
std::string RunsListText(const std::vector<std::pair<RunRecord, std::string>>& runs, const std::string& policy_name,
                         bool name_catalogs);

}  // namespace barge::orchestrate
