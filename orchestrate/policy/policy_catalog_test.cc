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

}  // namespace
}  // namespace barge::orchestrate
