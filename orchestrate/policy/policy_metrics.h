// Prometheus metrics of backup policies (docs/policies.md, "Metrics and
// alerts"): a snapshot gathered from the run records, the chain folders and
// the targets; a prometheus-cpp Collectable serving the newest snapshots
// (for `barge serve`'s /metrics through prometheus::Exposer); and the same
// text written atomically for node-exporter's textfile collector (one-shot
// runs).
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_catalog.h"
#include "orchestrate/policy/policy_shard.h"

namespace barge::orchestrate {

struct SourceMetrics {
  std::string source;
  std::string kind;            // "image", "domain", "nbd"
  SourceRunStats stats;
  // When the source became known: its first run's start, or the caller's
  // `known_since` when it never ran (so "never succeeded" can alert).
  SysSeconds known_since;
  std::optional<uint64_t> retained_points;  // nullopt: the scan failed
  // Failed finished runs whose backup succeeded but whose offsite copy
  // failed (IsOffsiteFailure); the other failed runs are reason "backup".
  uint64_t offsite_failures = 0;
};

struct TargetMetrics {
  std::string path;
  std::optional<SpaceInfo> space;  // nullopt: the query failed (up 0, as when it is read_only)
};

struct PolicyMetricsSnapshot {
  std::string policy;
  // A sharded worker's snapshot: its sources only, every series labelled
  // shard="I/N" (so the files of several shards never collide); not
  // sharded: no shard label.
  ShardSpec shard;
  std::chrono::seconds max_duration_without_backup{0};
  std::vector<SourceMetrics> sources;
  std::vector<TargetMetrics> targets;
};

// Gathers a snapshot. `known_since`: for sources without any run (a daemon
// passes its start time). `shard`: only the sources that fall to it.
Result<PolicyMetricsSnapshot> CollectPolicyMetrics(const Policy& policy, PolicyCatalog& catalog, Env& env,
                                                   SysSeconds known_since, const ShardSpec& shard = {});

// Whether BargeBackupMissing (deploy/prometheus/barge-rules.yml) holds for
// `source` at `now`: the threshold is on (> 0) and more than it has passed
// since the newest success, or since `known_since` when it never
// succeeded. The one C++ form of that rule (the status page and `barge
// report` show it); policy_metrics_test.cc checks both agree.
bool BackupMissing(const SourceMetrics& source, std::chrono::seconds max_duration_without_backup, SysSeconds now);

// The textfile of shard `shard` for `path`: "barge-p.prom" becomes
// "barge-p.shard-1.prom" (".shard-1" before the last extension, or at the
// end), so that the workers of one policy that share a textfile folder
// write one file each; `path` itself when not sharded.
std::string ShardTextfilePath(const std::string& path, const ShardSpec& shard);

// The metric families of the snapshots (names and labels in
// docs/policies.md).
std::vector<prometheus::MetricFamily> PolicyMetricFamilies(const std::vector<PolicyMetricsSnapshot>& snapshots);

// The Prometheus text exposition format (version 0.0.4).
std::string RenderPolicyMetrics(const std::vector<PolicyMetricsSnapshot>& snapshots);

// Writes the exposition to `path` (node-exporter reads *.prom files of its
// textfile folder) atomically: a scrape sees the old or the new file, never
// a partial one.
Status WritePolicyMetricsTextfile(Env& env, const std::string& path,
                                  const std::vector<PolicyMetricsSnapshot>& snapshots);

// Serves the newest snapshots to a prometheus::Exposer. Thread-safe.
class PolicyMetricsCollector : public prometheus::Collectable {
 public:
  void Update(std::vector<PolicyMetricsSnapshot> snapshots);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable std::mutex mu_;
  std::vector<PolicyMetricsSnapshot> snapshots_;  // guarded by mu_
};

}  // namespace barge::orchestrate
