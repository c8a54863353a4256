// Run records of backup policies (docs/policies.md, "Records"): one row per
// source per run in the catalog's SQLite file (the file the backup catalog
// uses; tables policy_runs and policy_run_points), the state the due
// decision reads (last attempt, last reason), and the numbers metrics
// show.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/policy/policy_decisions.h"
#include "orchestrate/policy/policy_shard.h"
#include "orchestrate/base/sqlite_db.h"

namespace barge::orchestrate {

struct RunRecord {
  int64_t id = 0;
  std::string run_id;         // shared by the sources of one policy run
  std::string policy;
  std::string source;
  std::string source_kind;    // "image", "domain", "nbd"
  std::string trigger;        // "reason", "schedule", "manual"
  std::string trigger_detail; // why it was due ("slot ...", "reason changed ...")
  std::string reason;         // the policy's reason value at this run
  std::string host;
  std::string target;         // the policy target used ("" if none was chosen)
  std::string type;           // "full", "incremental" ("" before it is known)
  std::string type_reason;
  std::string started_at;     // RFC 3339 UTC
  std::string finished_at;    // "" while running
  double duration_seconds = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  std::string result;         // "running", "success", "failed"
  std::string error;          // why it failed
  std::string barge_version;
  // The shard of a sharded run (`--shard I/N`) that made this record; not
  // sharded (count 0) otherwise.
  ShardSpec shard;
  std::vector<PointPart> points;  // what it made (success only)
  // Per entry of `points` (ListRuns): "present", "removed", or "merged into
  // ID" (retention or forget folded it into the full of ID).
  std::vector<std::string> point_states;
  // "present", "removed" (retention or forget removed or merged every
  // part), "partly removed", "" when it made no point.
  std::string point_state;
};

struct RunFilter {
  std::string policy;  // "" = every policy
  std::string source;  // "" = every source
  size_t limit = 0;    // 0 = no limit; newest first
};

// Per source numbers for metrics.
struct SourceRunStats {
  std::optional<SysSeconds> last_success;  // start of the newest successful run
  std::optional<SysSeconds> last_attempt;  // start of the newest run
  double last_duration_seconds = 0;        // of the newest finished run
  uint64_t last_bytes_read = 0;
  uint64_t last_bytes_written = 0;
  std::map<std::string, uint64_t> runs_by_result;  // finished runs: "success", "failed"
  uint64_t consecutive_failures = 0;       // finished runs since the last success
};

// One connection; one thread at a time (the runner serialises its writes).
class PolicyCatalog {
 public:
  // Opens (creating) the catalog file and its policy tables.
  static Result<std::unique_ptr<PolicyCatalog>> Open(Env& env, const std::string& path);
  const std::string& path() const { return db_->path(); }

  // Inserts a "running" record (its points are ignored); returns its id.
  Result<int64_t> BeginRun(const RunRecord& record);
  // Finishes record `id`: end time, result, bytes, error, points.
  Status FinishRun(int64_t id, const RunRecord& record);
  // Records of `policy` made by shard index `shard_index` of a sharded run
  // (nullopt: by runs that were not sharded) still "running" belong to a
  // process that is gone (the caller holds that shard's policy lock,
  // PolicyLockPath): they become "failed" with "interrupted: the run's
  // process ended". Records of the other shards are left alone: their
  // workers may be running. Returns how many.
  Result<size_t> FailInterrupted(const std::string& policy, std::optional<uint32_t> shard_index = std::nullopt);

  // `shard`: only the records of this shard (index and count); nullopt =
  // all; ShardSpec{} (count 0) = those of runs that were not sharded.
  Result<std::vector<RunRecord>> ListRuns(const RunFilter& filter = {},
                                          const std::optional<ShardSpec>& shard = std::nullopt);
  Result<SourceState> StateOf(const std::string& policy, const std::string& source);
  Result<SourceRunStats> StatsOf(const std::string& policy, const std::string& source);
  // Successful runs whose points are still present, per target.
  Result<std::map<std::string, uint64_t>> SuccessCounts(const std::string& policy, const std::string& source);

  // A point part is gone: `state` is "removed" or "merged into ID". Records
  // whose every part is gone read as "removed". Returns rows changed.
  Result<size_t> MarkPointRemoved(const std::string& chain_dir, const std::string& id, const std::string& state);

 private:
  explicit PolicyCatalog(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
  Result<std::vector<RunRecord>> Query(const std::string& where, const std::vector<std::string>& args,
                                       size_t limit);
  std::unique_ptr<SqliteDb> db_;
};

}  // namespace barge::orchestrate
