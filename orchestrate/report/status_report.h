// The status page's model (issue 42; docs/status_page.md): per policy and
// source what protects it now, gathered from the run records, the policy
// file, the chain folders on its targets and the metrics snapshot. One
// model, three renderings: serve's `/` (status_html.h), `barge report
// --html` (the same page into a file) and `barge report --json`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_catalog.h"

namespace barge::orchestrate {

// One point of the "bytes stored over time" chart: after the successful run
// that started at `at`, the bytes written by the source's successful runs
// whose points are still (at least partly) present, those up to `at`.
struct StoredSample {
  SysSeconds at;
  uint64_t bytes = 0;
};

struct SourceStatus {
  std::string name;
  std::string kind;      // "image", "domain", "nbd"
  std::string location;  // as RedactUri shows it (no password)
  std::optional<SysSeconds> last_success;
  std::optional<SysSeconds> last_failure;
  std::string last_failure_reason;  // its record's error
  uint64_t consecutive_failures = 0;
  uint64_t successful_runs = 0;
  uint64_t failed_runs = 0;
  SysSeconds known_since;
  // nullopt: unknown, a target (moved, unmounted) or a chain folder could
  // not be read.
  std::optional<uint64_t> points_kept;
  std::string points_problem;           // why, when points_kept is nullopt
  // The chain folders holding its points (the page per chain).
  std::vector<std::string> chain_dirs;
  std::vector<StoredSample> stored;  // oldest first
  // BargeBackupMissing holds now (BackupMissing, policy_metrics.h).
  bool backup_missing = false;
};

struct TargetStatus {
  std::string path;
  bool up = false;  // space readable and writable, as barge_policy_target_up
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

struct PolicyStatus {
  std::string policy;
  std::string policy_file;
  SysSeconds generated_at;
  std::chrono::seconds max_duration_without_backup{0};
  std::optional<SysSeconds> next_due;  // the schedule's next slot; nullopt without a schedule
  std::vector<SourceStatus> sources;   // in the policy's order
  std::vector<TargetStatus> targets;
};

// Gathers the model at `now`. `known_since` as CollectPolicyMetrics: when
// a source without any run became known (serve: its start; report: now).
Result<PolicyStatus> CollectPolicyStatus(const Policy& policy, PolicyCatalog& catalog, Env& env, SysSeconds now,
                                         SysSeconds known_since);

// The source's state, the most pressing first: "backup_missing" (the
// BargeBackupMissing rule holds), "failing" (its latest runs failed),
// "unprotected" (no point on the targets), "unknown" (its points could not
// be counted: a target or chain folder unreadable), else "ok".
std::string_view SourceState(const SourceStatus& s);

// "3h 12m", "2d 4h", "45s": how long before `now` `t` was (0s when later).
std::string AgeText(SysSeconds t, SysSeconds now);

}  // namespace barge::orchestrate
