// Policy run records: begin/finish, the state the due decision reads,
// metrics numbers, interrupted runs, and removed points.
#include "orchestrate/policy/policy_catalog.h"

#include <gtest/gtest.h>

#include "orchestrate/schedule/time_text.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

RunRecord NewRun(const std::string& source, const std::string& started, const std::string& reason = "") {
  RunRecord r;
  r.run_id = "p-" + started;
  r.policy = "p";
  r.source = source;
  r.source_kind = "image";
  r.trigger = "schedule";
  r.reason = reason;
  r.host = "h";
  r.started_at = started;
  r.barge_version = "0.1.0";
  return r;
}

TEST(PolicyCatalogTest, RecordsStateAndStats) {
  barge::testing::TempDir dir;
  auto c = PolicyCatalog::Open(PosixEnv(), dir / "catalog.db");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  auto& cat = **c;
  EXPECT_FALSE(cat.StateOf("p", "disk")->last_attempt);

  RunRecord a = NewRun("disk", "2026-11-20T02:00:00Z");
  auto id = cat.BeginRun(a);
  ASSERT_TRUE(id.ok());
  a.target = "/t1";
  a.type = "full";
  a.result = "success";
  a.finished_at = "2026-11-20T02:01:00Z";
  a.duration_seconds = 60;
  a.bytes_read = 100;
  a.bytes_written = 50;
  a.points = {{"/t1/p/disk", "0000-20261120T020000Z"}};
  ASSERT_TRUE(cat.FinishRun(*id, a).ok());

  for (const char* t : {"2026-11-21T02:00:00Z", "2026-11-22T02:00:00Z"}) {
    RunRecord f = NewRun("disk", t, "r1");
    auto fid = cat.BeginRun(f);
    ASSERT_TRUE(fid.ok());
    f.result = "failed";
    f.error = "NoSpace: no target qualifies";
    f.finished_at = t;
    ASSERT_TRUE(cat.FinishRun(*fid, f).ok());
  }
  auto state = cat.StateOf("p", "disk");
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(FormatRfc3339(*state->last_attempt), "2026-11-22T02:00:00Z");
  EXPECT_EQ(*state->last_reason, "r1");

  auto stats = cat.StatsOf("p", "disk");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(FormatRfc3339(*stats->last_success), "2026-11-20T02:00:00Z");
  EXPECT_EQ(stats->runs_by_result["success"], 1u);
  EXPECT_EQ(stats->runs_by_result["failed"], 2u);
  EXPECT_EQ(stats->consecutive_failures, 2u);
  EXPECT_EQ((*cat.SuccessCounts("p", "disk"))["/t1"], 1u);

  auto runs = cat.ListRuns({"p", "", 0});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ(runs->back().point_state, "present");
  EXPECT_EQ(runs->back().points.size(), 1u);
  EXPECT_EQ(runs->front().result, "failed");
  EXPECT_EQ(cat.ListRuns({"other", "", 0})->size(), 0u);
  EXPECT_EQ(cat.ListRuns({"", "", 1})->size(), 1u);

  // Removing the point marks its record; it no longer counts for placement.
  EXPECT_EQ(*cat.MarkPointRemoved("/t1/p/disk", "0000-20261120T020000Z", "removed"), 1u);
  EXPECT_EQ(cat.ListRuns({"p", "", 0})->back().point_state, "removed");
  EXPECT_TRUE(cat.SuccessCounts("p", "disk")->empty());

  // A run left "running" by a dead process is failed by the next run.
  ASSERT_TRUE(cat.BeginRun(NewRun("disk", "2026-11-23T02:00:00Z")).ok());
  EXPECT_EQ(*cat.FailInterrupted("p"), 1u);
  EXPECT_NE(cat.ListRuns({"p", "", 1})->front().error.find("interrupted"), std::string::npos);
}

// Sharded runs: each record keeps its shard; ListRuns filters by shard;
// a shard's run settles only its own shard's interrupted records.
TEST(PolicyCatalogTest, ShardsOfRecords) {
  barge::testing::TempDir dir;
  auto c = PolicyCatalog::Open(PosixEnv(), dir / "catalog.db");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  auto& cat = **c;
  for (uint32_t i = 0; i < 3; ++i) {
    RunRecord r = NewRun("s" + std::to_string(i), "2026-11-23T02:00:0" + std::to_string(i) + "Z");
    r.shard = {i, 3};
    ASSERT_TRUE(cat.BeginRun(r).ok());
  }
  ASSERT_TRUE(cat.BeginRun(NewRun("plain", "2026-11-23T02:00:09Z")).ok());
  auto one = cat.ListRuns({}, ShardSpec{1, 3});
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ(one->front().source, "s1");
  EXPECT_EQ(one->front().shard, (ShardSpec{1, 3}));
  EXPECT_EQ(cat.ListRuns({}, ShardSpec{})->front().source, "plain");
  EXPECT_EQ(cat.ListRuns({}, ShardSpec{1, 4})->size(), 0u);
  EXPECT_EQ(cat.ListRuns()->size(), 4u);

  // Shard 1's next run: only s1's record was its.
  EXPECT_EQ(*cat.FailInterrupted("p", 1u), 1u);
  auto after = cat.ListRuns();
  ASSERT_TRUE(after.ok());
  for (const auto& r : *after) EXPECT_EQ(r.result, r.source == "s1" ? "failed" : "running") << r.source;
  // An unsharded run settles the unsharded records only.
  EXPECT_EQ(*cat.FailInterrupted("p"), 1u);
  EXPECT_EQ(cat.ListRuns({}, ShardSpec{})->front().result, "failed");
  EXPECT_EQ(cat.ListRuns({}, ShardSpec{0, 3})->front().result, "running");
}

// A catalog from before shards gains the columns; its records read as
// not sharded.
TEST(PolicyCatalogTest, OldCatalogGainsShardColumns) {
  barge::testing::TempDir dir;
  const std::string path = dir / "old.db";
  {
    auto db = SqliteDb::Open(PosixEnv(), path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("CREATE TABLE policy_runs (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, "
                            "policy TEXT NOT NULL, source TEXT NOT NULL, source_kind TEXT NOT NULL DEFAULT '', "
                            "trigger TEXT NOT NULL, trigger_detail TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL "
                            "DEFAULT '', host TEXT NOT NULL DEFAULT '', target TEXT NOT NULL DEFAULT '', type TEXT "
                            "NOT NULL DEFAULT '', type_reason TEXT NOT NULL DEFAULT '', started_at TEXT NOT NULL, "
                            "finished_at TEXT NOT NULL DEFAULT '', duration_seconds REAL NOT NULL DEFAULT 0, "
                            "bytes_read INTEGER NOT NULL DEFAULT 0, bytes_written INTEGER NOT NULL DEFAULT 0, "
                            "result TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', barge_version TEXT NOT NULL "
                            "DEFAULT ''); INSERT INTO policy_runs (run_id, policy, source, trigger, started_at, "
                            "result) VALUES ('r', 'p', 'old', 'manual', '2026-11-01T00:00:00Z', 'success');")
                    .ok());
  }
  auto c = PolicyCatalog::Open(PosixEnv(), path);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  auto runs = (*c)->ListRuns();
  ASSERT_TRUE(runs.ok()) << runs.error().ToString();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_FALSE(runs->front().shard.sharded());
}

}  // namespace
}  // namespace barge::orchestrate
