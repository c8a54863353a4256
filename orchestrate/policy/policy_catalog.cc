// SQLite rows for policy runs (orchestrate/policy/policy_catalog.h).
#include "orchestrate/policy/policy_catalog.h"

#include "blockio/nbd.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS policy_runs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  run_id TEXT NOT NULL,
  policy TEXT NOT NULL,
  source TEXT NOT NULL,
  source_kind TEXT NOT NULL DEFAULT '',
  trigger TEXT NOT NULL,
  trigger_detail TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  host TEXT NOT NULL DEFAULT '',
  target TEXT NOT NULL DEFAULT '',
  type TEXT NOT NULL DEFAULT '',
  type_reason TEXT NOT NULL DEFAULT '',
  started_at TEXT NOT NULL,
  finished_at TEXT NOT NULL DEFAULT '',
  duration_seconds REAL NOT NULL DEFAULT 0,
  bytes_read INTEGER NOT NULL DEFAULT 0,
  bytes_written INTEGER NOT NULL DEFAULT 0,
  result TEXT NOT NULL,
  error TEXT NOT NULL DEFAULT '',
  barge_version TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS policy_runs_by_source ON policy_runs(policy, source, started_at);
CREATE TABLE IF NOT EXISTS policy_run_points (
  run INTEGER NOT NULL REFERENCES policy_runs(id) ON DELETE CASCADE,
  chain_dir TEXT NOT NULL,
  point_id TEXT NOT NULL,
  state TEXT NOT NULL DEFAULT 'present'
);
CREATE INDEX IF NOT EXISTS policy_run_points_by_point ON policy_run_points(chain_dir, point_id);
)sql";

constexpr const char* kColumns =
    "id, run_id, policy, source, source_kind, trigger, trigger_detail, reason, host, target, type, type_reason, "
    "started_at, finished_at, duration_seconds, bytes_read, bytes_written, result, error, barge_version, "
    "shard_index, shard_count";

// Creates the tables, and adds the columns older versions lacked
// (shard_index, shard_count: 0 and 0 for runs that were not sharded), in one
// transaction so that two processes opening an old catalog at once do not
// both alter it.
Status CreateOrMigrate(SqliteDb& db) {
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(db));
  BARGE_RETURN_IF_ERROR(db.Exec(kSchema));
  for (const char* column : {"shard_index", "shard_count"}) {
    bool has = false;
    {
      BARGE_ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT 1 FROM pragma_table_info('policy_runs') WHERE name = ?"));
      st.Bind(1, std::string(column));
      BARGE_ASSIGN_OR_RETURN(has, st.Step());
    }
    if (!has) {
      BARGE_RETURN_IF_ERROR(
          db.Exec(std::string("ALTER TABLE policy_runs ADD COLUMN ") + column + " INTEGER NOT NULL DEFAULT 0"));
    }
  }
  return tx->Commit();
}

std::optional<SysSeconds> Time(const std::string& text) {
  auto t = ParseRfc3339(text);
  if (!t.ok()) return std::nullopt;
  return *t;
}

}  // namespace

Result<std::unique_ptr<PolicyCatalog>> PolicyCatalog::Open(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(env, path));
  BARGE_RETURN_IF_ERROR(CreateOrMigrate(*db));
  return std::unique_ptr<PolicyCatalog>(new PolicyCatalog(std::move(db)));
}

Result<int64_t> PolicyCatalog::BeginRun(const RunRecord& r) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "INSERT INTO policy_runs (run_id, policy, source, source_kind, trigger, trigger_detail, reason, host, "
      "target, type, type_reason, started_at, result, barge_version, shard_index, shard_count) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?)"));
  st.Bind(1, r.run_id).Bind(2, r.policy).Bind(3, r.source).Bind(4, r.source_kind).Bind(5, r.trigger)
      .Bind(6, r.trigger_detail).Bind(7, r.reason).Bind(8, r.host).Bind(9, r.target).Bind(10, r.type)
      .Bind(11, r.type_reason).Bind(12, r.started_at).Bind(13, r.barge_version)
      .Bind(14, static_cast<int64_t>(r.shard.index)).Bind(15, static_cast<int64_t>(r.shard.count));
  BARGE_RETURN_IF_ERROR(st.Run());
  return db_->LastInsertRowId();
}

Status PolicyCatalog::FinishRun(int64_t id, const RunRecord& r) {
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
  {
    BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "UPDATE policy_runs SET target = ?, type = ?, type_reason = ?, finished_at = ?, duration_seconds = ?, "
        "bytes_read = ?, bytes_written = ?, result = ?, error = ? WHERE id = ?"));
    st.Bind(1, r.target).Bind(2, r.type).Bind(3, r.type_reason).Bind(4, r.finished_at)
        .BindReal(5, r.duration_seconds).Bind(6, static_cast<int64_t>(r.bytes_read))
        .Bind(7, static_cast<int64_t>(r.bytes_written)).Bind(8, r.result).Bind(9, RedactUrisIn(r.error))
        .Bind(10, id);  // a record never holds a credential
    BARGE_RETURN_IF_ERROR(st.Run());
    if (db_->Changes() != 1) return Error::NotFound("no policy run record " + std::to_string(id));
  }
  for (const auto& p : r.points) {
    BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "INSERT INTO policy_run_points (run, chain_dir, point_id) VALUES (?, ?, ?)"));
    st.Bind(1, id).Bind(2, p.chain_dir).Bind(3, p.id);
    BARGE_RETURN_IF_ERROR(st.Run());
  }
  return tx->Commit();
}

Result<size_t> PolicyCatalog::FailInterrupted(const std::string& policy, std::optional<uint32_t> shard_index) {
  // Not sharded: shard_count 0. Sharded: that index, whatever the count
  // (PolicyLockPath locks by index, so a worker of I/N and one of I/M
  // exclude each other).
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "UPDATE policy_runs SET result = 'failed', error = 'interrupted: the run''s process ended', "
      "finished_at = ? WHERE policy = ? AND result = 'running' AND "
      "(CASE WHEN ? THEN shard_count > 0 AND shard_index = ? ELSE shard_count = 0 END)"));
  st.Bind(1, FormatRfc3339(NowSeconds())).Bind(2, policy).Bind(3, static_cast<int64_t>(shard_index ? 1 : 0))
      .Bind(4, static_cast<int64_t>(shard_index.value_or(0)));
  BARGE_RETURN_IF_ERROR(st.Run());
  return static_cast<size_t>(db_->Changes());
}

Result<std::vector<RunRecord>> PolicyCatalog::Query(const std::string& where, const std::vector<std::string>& args,
                                                    size_t limit) {
  std::string sql = std::string("SELECT ") + kColumns + " FROM policy_runs" + (where.empty() ? "" : " WHERE " + where) +
                    " ORDER BY started_at DESC, id DESC";
  if (limit > 0) sql += " LIMIT " + std::to_string(limit);
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(sql));
  for (size_t i = 0; i < args.size(); ++i) st.Bind(static_cast<int>(i + 1), args[i]);
  std::vector<RunRecord> out;
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    RunRecord r;
    int c = 0;
    r.id = st.Int(c++);
    r.run_id = st.Text(c++);
    r.policy = st.Text(c++);
    r.source = st.Text(c++);
    r.source_kind = st.Text(c++);
    r.trigger = st.Text(c++);
    r.trigger_detail = st.Text(c++);
    r.reason = st.Text(c++);
    r.host = st.Text(c++);
    r.target = st.Text(c++);
    r.type = st.Text(c++);
    r.type_reason = st.Text(c++);
    r.started_at = st.Text(c++);
    r.finished_at = st.Text(c++);
    r.duration_seconds = st.Real(c++);
    r.bytes_read = static_cast<uint64_t>(st.Int(c++));
    r.bytes_written = static_cast<uint64_t>(st.Int(c++));
    r.result = st.Text(c++);
    r.error = st.Text(c++);
    r.barge_version = st.Text(c++);
    r.shard.index = static_cast<uint32_t>(st.Int(c++));
    r.shard.count = static_cast<uint32_t>(st.Int(c++));
    out.push_back(std::move(r));
  }
  for (auto& r : out) {
    BARGE_ASSIGN_OR_RETURN(auto pst, db_->Prepare(
        "SELECT chain_dir, point_id, state FROM policy_run_points WHERE run = ? ORDER BY rowid"));
    pst.Bind(1, r.id);
    size_t present = 0, total = 0;
    while (true) {
      BARGE_ASSIGN_OR_RETURN(bool row, pst.Step());
      if (!row) break;
      r.points.push_back({pst.Text(0), pst.Text(1)});
      r.point_states.push_back(pst.Text(2));
      ++total;
      if (pst.Text(2) == "present") ++present;
    }
    r.point_state = total == 0 ? "" : present == total ? "present" : present == 0 ? "removed" : "partly removed";
  }
  return out;
}

Result<std::vector<RunRecord>> PolicyCatalog::ListRuns(const RunFilter& filter,
                                                       const std::optional<ShardSpec>& shard) {
  std::string where;
  std::vector<std::string> args;
  if (!filter.policy.empty()) {
    where = "policy = ?";
    args.push_back(filter.policy);
  }
  if (!filter.source.empty()) {
    where += std::string(where.empty() ? "" : " AND ") + "source = ?";
    args.push_back(filter.source);
  }
  if (shard) {
    // Numbers of our own making: no binding needed.
    where += std::string(where.empty() ? "" : " AND ") + "shard_count = " + std::to_string(shard->count) +
             (shard->sharded() ? " AND shard_index = " + std::to_string(shard->index) : "");
  }
  return Query(where, args, filter.limit);
}

Result<SourceState> PolicyCatalog::StateOf(const std::string& policy, const std::string& source) {
  BARGE_ASSIGN_OR_RETURN(auto runs, Query("policy = ? AND source = ?", {policy, source}, 1));
  SourceState s;
  if (!runs.empty()) {
    s.last_attempt = Time(runs[0].started_at);
    s.last_reason = runs[0].reason;
    s.last_failed = runs[0].result == "failed";
  }
  return s;
}

Result<SourceRunStats> PolicyCatalog::StatsOf(const std::string& policy, const std::string& source) {
  SourceRunStats s;
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "SELECT result, COUNT(*) FROM policy_runs WHERE policy = ? AND source = ? AND result != 'running' "
      "GROUP BY result"));
  st.Bind(1, policy).Bind(2, source);
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    s.runs_by_result[st.Text(0)] = static_cast<uint64_t>(st.Int(1));
  }
  BARGE_ASSIGN_OR_RETURN(auto latest, Query("policy = ? AND source = ?", {policy, source}, 1));
  if (!latest.empty()) s.last_attempt = Time(latest[0].started_at);
  BARGE_ASSIGN_OR_RETURN(auto ok, Query("policy = ? AND source = ? AND result = 'success'", {policy, source}, 1));
  if (!ok.empty()) s.last_success = Time(ok[0].started_at);
  BARGE_ASSIGN_OR_RETURN(auto done, Query("policy = ? AND source = ? AND result != 'running'", {policy, source}, 1));
  if (!done.empty()) {
    s.last_duration_seconds = done[0].duration_seconds;
    s.last_bytes_read = done[0].bytes_read;
    s.last_bytes_written = done[0].bytes_written;
  }
  BARGE_ASSIGN_OR_RETURN(auto fails, db_->Prepare(
      "SELECT COUNT(*) FROM policy_runs WHERE policy = ? AND source = ? AND result = 'failed' AND "
      "started_at > COALESCE((SELECT MAX(started_at) FROM policy_runs WHERE policy = ? AND source = ? AND "
      "result = 'success'), '')"));
  fails.Bind(1, policy).Bind(2, source).Bind(3, policy).Bind(4, source);
  BARGE_ASSIGN_OR_RETURN(bool row, fails.Step());
  if (row) s.consecutive_failures = static_cast<uint64_t>(fails.Int(0));
  return s;
}

Result<std::map<std::string, uint64_t>> PolicyCatalog::SuccessCounts(const std::string& policy,
                                                                     const std::string& source) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "SELECT target, COUNT(*) FROM policy_runs r WHERE policy = ? AND source = ? AND result = 'success' AND "
      "EXISTS (SELECT 1 FROM policy_run_points p WHERE p.run = r.id AND p.state = 'present') GROUP BY target"));
  st.Bind(1, policy).Bind(2, source);
  std::map<std::string, uint64_t> out;
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out[st.Text(0)] = static_cast<uint64_t>(st.Int(1));
  }
  return out;
}

Result<size_t> PolicyCatalog::MarkPointRemoved(const std::string& chain_dir, const std::string& id,
                                               const std::string& state) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "UPDATE policy_run_points SET state = ? WHERE chain_dir = ? AND point_id = ? AND state = 'present'"));
  st.Bind(1, state).Bind(2, chain_dir).Bind(3, id);
  BARGE_RETURN_IF_ERROR(st.Run());
  return static_cast<size_t>(db_->Changes());
}

}  // namespace barge::orchestrate
