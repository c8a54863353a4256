// Policy metrics as Prometheus families (orchestrate/policy/policy_metrics.h).
#include "orchestrate/policy/policy_metrics.h"

#include <prometheus/text_serializer.h>

#include <map>

#include "orchestrate/policy/policy_offsite.h"
#include "orchestrate/policy/policy_runner.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

namespace {

double Seconds(SysSeconds t) { return static_cast<double>(t.time_since_epoch().count()); }

class Families {
 public:
  prometheus::MetricFamily& Get(const std::string& name, const std::string& help, prometheus::MetricType type) {
    auto it = index_.find(name);
    if (it != index_.end()) return families_[it->second];
    index_[name] = families_.size();
    families_.push_back({name, help, type, {}});
    return families_.back();
  }
  void Gauge(const std::string& name, const std::string& help, std::vector<prometheus::ClientMetric::Label> labels,
             double value) {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Get(name, help, prometheus::MetricType::Gauge).metric.push_back(std::move(m));
  }
  void Counter(const std::string& name, const std::string& help, std::vector<prometheus::ClientMetric::Label> labels,
               double value) {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Get(name, help, prometheus::MetricType::Counter).metric.push_back(std::move(m));
  }
  std::vector<prometheus::MetricFamily> Take() { return std::move(families_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<prometheus::MetricFamily> families_;
};

}  // namespace

Result<PolicyMetricsSnapshot> CollectPolicyMetrics(const Policy& policy, PolicyCatalog& catalog, Env& env,
                                                   SysSeconds known_since, const ShardSpec& shard) {
  PolicyMetricsSnapshot snap;
  snap.policy = policy.name;
  snap.shard = shard;
  snap.max_duration_without_backup = policy.max_duration_without_backup;
  // A target that cannot be read (moved, unmounted) may hold points: then
  // how many a source keeps is unknown, and no gauge says 0.
  bool every_target_read = true;
  for (const auto& t : policy.targets) {
    TargetMetrics tm{t, std::nullopt};
    auto space = env.Space(t);
    if (space.ok()) tm.space = *space;
    every_target_read = every_target_read && space.ok();
    snap.targets.push_back(std::move(tm));
  }
  for (const auto& s : policy.sources) {
    if (!InShard(shard, s.name)) continue;
    SourceMetrics m;
    m.source = s.name;
    m.kind = std::string(PolicySourceKindName(s.kind));
    BARGE_ASSIGN_OR_RETURN(m.stats, catalog.StatsOf(policy.name, s.name));
    m.known_since = known_since;
    BARGE_ASSIGN_OR_RETURN(auto oldest, catalog.ListRuns({policy.name, s.name, 0}));
    if (!oldest.empty()) {
      auto t = ParseRfc3339(oldest.back().started_at);
      if (t.ok()) m.known_since = *t;
    }
    for (const auto& run : oldest) m.offsite_failures += run.result == "failed" && IsOffsiteFailure(run.error);
    auto points = ScanSource(env, policy, s);
    if (points.ok() && every_target_read) m.retained_points = points->points.size();
    snap.sources.push_back(std::move(m));
  }
  return snap;
}

std::vector<prometheus::MetricFamily> PolicyMetricFamilies(const std::vector<PolicyMetricsSnapshot>& snapshots) {
  Families f;
  for (const auto& snap : snapshots) {
    for (const auto& s : snap.sources) {
      std::vector<prometheus::ClientMetric::Label> l = {{"policy", snap.policy}, {"source", s.source}};
      if (snap.shard.sharded()) l.push_back({"shard", snap.shard.ToString()});
      f.Gauge("barge_policy_last_success_timestamp_seconds",
              "Start of the source's newest successful backup (0: never).", l,
              s.stats.last_success ? Seconds(*s.stats.last_success) : 0);
      f.Gauge("barge_policy_last_attempt_timestamp_seconds", "Start of the source's newest backup run (0: never).", l,
              s.stats.last_attempt ? Seconds(*s.stats.last_attempt) : 0);
      f.Gauge("barge_policy_source_known_since_timestamp_seconds",
              "Start of the source's first run, or when barge first saw the source.", l, Seconds(s.known_since));
      f.Gauge("barge_policy_last_duration_seconds", "Duration of the source's newest finished run.", l,
              s.stats.last_duration_seconds);
      f.Gauge("barge_policy_last_bytes_read", "Bytes read by the source's newest finished run.", l,
              static_cast<double>(s.stats.last_bytes_read));
      f.Gauge("barge_policy_last_bytes_written", "Bytes written by the source's newest finished run.", l,
              static_cast<double>(s.stats.last_bytes_written));
      f.Gauge("barge_policy_consecutive_failures", "Finished runs of the source that failed since its last success.",
              l, static_cast<double>(s.stats.consecutive_failures));
      f.Gauge("barge_policy_max_duration_without_backup_seconds",
              "The policy's max_duration_without_backup (0: the alert is off).", l,
              static_cast<double>(snap.max_duration_without_backup.count()));
      if (s.retained_points) {
        f.Gauge("barge_policy_retained_points", "Restorable points of the source on the policy's targets.", l,
                static_cast<double>(*s.retained_points));
      }
      for (const char* result : {"success", "failed"}) {
        auto it = s.stats.runs_by_result.find(result);
        auto labels = l;
        labels.push_back({"result", result});
        f.Counter("barge_policy_runs_total", "Finished backup runs of the source by result.", labels,
                  it == s.stats.runs_by_result.end() ? 0 : static_cast<double>(it->second));
      }
      // Why runs failed: "offsite" (the point was made, its offsite copy
      // failed) or "backup" (anything else).
      auto failed = s.stats.runs_by_result.find("failed");
      const uint64_t all_failed = failed == s.stats.runs_by_result.end() ? 0 : failed->second;
      for (const auto& [reason, n] : {std::pair<const char*, uint64_t>{"backup", all_failed - std::min(all_failed, s.offsite_failures)},
                                      {"offsite", s.offsite_failures}}) {
        auto labels = l;
        labels.push_back({"reason", reason});
        f.Counter("barge_policy_failed_runs_total", "Finished backup runs of the source that failed, by reason.",
                  labels, static_cast<double>(n));
      }
    }
    for (const auto& t : snap.targets) {
      std::vector<prometheus::ClientMetric::Label> l = {{"policy", snap.policy}, {"target", t.path}};
      if (snap.shard.sharded()) l.push_back({"shard", snap.shard.ToString()});
      f.Gauge("barge_policy_target_up", "1 when the target's free space could be read and it is writable.", l,
              t.space && !t.space->read_only ? 1 : 0);
      // A bucket has no filesystem size (its Env reports no limit).
      if (!t.space || IsBucketTarget(t.path)) continue;
      f.Gauge("barge_policy_target_free_bytes", "Bytes free on the target's filesystem for barge.", l,
              static_cast<double>(t.space->free_bytes));
      f.Gauge("barge_policy_target_size_bytes", "Size of the target's filesystem.", l,
              static_cast<double>(t.space->total_bytes));
    }
  }
  return f.Take();
}

bool BackupMissing(const SourceMetrics& source, std::chrono::seconds max_duration_without_backup, SysSeconds now) {
  if (max_duration_without_backup.count() <= 0) return false;
  const SysSeconds since = source.stats.last_success ? *source.stats.last_success : source.known_since;
  return now - since > max_duration_without_backup;
}

std::string ShardTextfilePath(const std::string& path, const ShardSpec& shard) {
  if (!shard.sharded()) return path;
  const std::string tag = ".shard-" + std::to_string(shard.index);
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  // A dot of the file name, not of a folder, and not a leading one.
  if (dot == std::string::npos || (slash != std::string::npos && dot <= slash + 1) || dot == 0) return path + tag;
  return path.substr(0, dot) + tag + path.substr(dot);
}

std::string RenderPolicyMetrics(const std::vector<PolicyMetricsSnapshot>& snapshots) {
  return prometheus::TextSerializer().Serialize(PolicyMetricFamilies(snapshots));
}

Status WritePolicyMetricsTextfile(Env& env, const std::string& path,
                                  const std::vector<PolicyMetricsSnapshot>& snapshots) {
  return env.WriteFileAtomic(path, RenderPolicyMetrics(snapshots));
}

void PolicyMetricsCollector::Update(std::vector<PolicyMetricsSnapshot> snapshots) {
  std::lock_guard lock(mu_);
  snapshots_ = std::move(snapshots);
}

std::vector<prometheus::MetricFamily> PolicyMetricsCollector::Collect() const {
  std::lock_guard lock(mu_);
  return PolicyMetricFamilies(snapshots_);
}

}  // namespace barge::orchestrate
