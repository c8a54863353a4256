// The status page's model (orchestrate/report/status_report.h).
#include "orchestrate/report/status_report.h"

#include <algorithm>
#include <set>

#include "blockio/nbd.h"
#include "orchestrate/policy/policy_metrics.h"
#include "orchestrate/policy/policy_runner.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

namespace {

// The chart's samples from `runs` (newest first, as ListRuns gives them):
// successful runs whose points are not all gone, their bytes written added
// up oldest first.
std::vector<StoredSample> StoredOverTime(const std::vector<RunRecord>& runs) {
  std::vector<StoredSample> samples;
  uint64_t total = 0;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    if (it->result != "success" || it->point_state == "removed") continue;
    auto at = ParseRfc3339(it->started_at);
    if (!at.ok()) continue;
    total += it->bytes_written;
    samples.push_back({*at, total});
  }
  return samples;
}

}  // namespace

std::string_view SourceState(const SourceStatus& s) {
  if (s.backup_missing) return "backup_missing";
  if (s.consecutive_failures > 0) return "failing";
  if (!s.points_kept) return "unknown";
  if (*s.points_kept == 0) return "unprotected";
  return "ok";
}

std::string AgeText(SysSeconds t, SysSeconds now) {
  int64_t s = now > t ? (now - t).count() : 0;
  const int64_t d = s / 86400, h = s % 86400 / 3600, m = s % 3600 / 60;
  s %= 60;
  if (d > 0) return std::to_string(d) + "d " + std::to_string(h) + "h";
  if (h > 0) return std::to_string(h) + "h " + std::to_string(m) + "m";
  if (m > 0) return std::to_string(m) + "m " + std::to_string(s) + "s";
  return std::to_string(s) + "s";
}

Result<PolicyStatus> CollectPolicyStatus(const Policy& policy, PolicyCatalog& catalog, Env& env, SysSeconds now,
                                         SysSeconds known_since) {
  BARGE_ASSIGN_OR_RETURN(PolicyMetricsSnapshot snap, CollectPolicyMetrics(policy, catalog, env, known_since));
  PolicyStatus st;
  st.policy = policy.name;
  st.policy_file = policy.file;
  st.generated_at = now;
  st.max_duration_without_backup = policy.max_duration_without_backup;
  if (auto next = NextRunTimes(policy, now, 1); !next.empty()) st.next_due = next.front();
  for (const SourceMetrics& m : snap.sources) {
    const PolicySource* src = policy.FindSource(m.source);
    SourceStatus s;
    s.name = m.source;
    s.kind = m.kind;
    s.location = src != nullptr ? RedactUri(src->location) : "";
    s.last_success = m.stats.last_success;
    s.consecutive_failures = m.stats.consecutive_failures;
    const auto& by_result = m.stats.runs_by_result;
    if (auto it = by_result.find("success"); it != by_result.end()) s.successful_runs = it->second;
    if (auto it = by_result.find("failed"); it != by_result.end()) s.failed_runs = it->second;
    s.known_since = m.known_since;
    s.points_kept = m.retained_points;
    s.backup_missing = BackupMissing(m, policy.max_duration_without_backup, now);
    BARGE_ASSIGN_OR_RETURN(auto runs, catalog.ListRuns({policy.name, m.source, 0}));
    for (const RunRecord& r : runs) {  // newest first
      if (r.result != "failed") continue;
      if (auto t = ParseRfc3339(r.started_at); t.ok()) s.last_failure = *t;
      s.last_failure_reason = RedactUrisIn(r.error);
      break;
    }
    s.stored = StoredOverTime(runs);
    if (src != nullptr) {
      auto points = ScanSource(env, policy, *src);
      if (points.ok()) {
        std::set<std::string> seen;
        for (const ChainView& c : points->chains) {
          if (seen.insert(c.chain_dir).second) s.chain_dirs.push_back(c.chain_dir);
        }
      } else {
        s.points_problem = RedactUrisIn(points.error().ToString());
      }
    }
    // A target that cannot be read (moved, unmounted) may hold points: how
    // many is unknown, not 0.
    for (const TargetMetrics& t : snap.targets) {
      if (t.space || !s.points_kept) continue;
      s.points_kept.reset();
      s.points_problem = "target " + t.path + " cannot be read";
    }
    st.sources.push_back(std::move(s));
  }
  for (const TargetMetrics& t : snap.targets) {
    TargetStatus ts{t.path};
    if (t.space) {
      ts.up = !t.space->read_only;
      ts.free_bytes = t.space->free_bytes;
      ts.total_bytes = t.space->total_bytes;
    }
    st.targets.push_back(std::move(ts));
  }
  return st;
}

}  // namespace barge::orchestrate
