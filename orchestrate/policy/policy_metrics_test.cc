// Policy metrics: what a snapshot from real records and folders exposes,
// the atomic textfile, the exposition accepted by `promtool check metrics`,
// and the shipped alerting rules under `promtool test rules`.
#include "orchestrate/policy/policy_metrics.h"

#include <gtest/gtest.h>

#include "orchestrate/schedule/time_text.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using barge::testing::TempDir;

TEST(PolicyMetricsTest, SnapshotTextfileAndPromtool) {
  TempDir dir;
  ASSERT_TRUE(Env::Default().CreateDirs(dir / "t1").ok());
  auto policy = ParsePolicy(Env::Default(), "name: nightly\nsources:\n  - image: /vm/disk.qcow2\n  - image: /vm/new.qcow2\n"
                            "max_duration_without_backup: 26h\ntargets: [" + (dir / "t1") + ", /nonexistent-barge-t]\n");
  ASSERT_TRUE(policy.ok()) << policy.error().message();
  auto catalog = PolicyCatalog::Open(PosixEnv(), dir / "catalog.db");
  ASSERT_TRUE(catalog.ok());
  RunRecord r;
  r.run_id = "x";
  r.policy = "nightly";
  r.source = "disk";
  r.trigger = "schedule";
  r.started_at = "2026-11-22T02:00:00Z";
  auto id = (*catalog)->BeginRun(r);
  ASSERT_TRUE(id.ok());
  r.result = "success";
  r.finished_at = "2026-11-22T02:00:42Z";
  r.duration_seconds = 42;
  r.bytes_read = 1000;
  r.bytes_written = 400;
  ASSERT_TRUE((*catalog)->FinishRun(*id, r).ok());

  auto snap = CollectPolicyMetrics(*policy, **catalog, Env::Default(), *ParseRfc3339("2026-11-24T00:00:00Z"));
  ASSERT_TRUE(snap.ok()) << snap.error().ToString();
  std::string text = RenderPolicyMetrics({*snap});
  for (const char* want : {
           "barge_policy_last_success_timestamp_seconds{policy=\"nightly\",source=\"disk\"} 1795312800",
           "barge_policy_last_success_timestamp_seconds{policy=\"nightly\",source=\"new\"} 0",
           "barge_policy_source_known_since_timestamp_seconds{policy=\"nightly\",source=\"new\"} 1795478400",
           "barge_policy_last_duration_seconds{policy=\"nightly\",source=\"disk\"} 42",
           "barge_policy_last_bytes_written{policy=\"nightly\",source=\"disk\"} 400",
           "barge_policy_runs_total{policy=\"nightly\",source=\"disk\",result=\"success\"} 1",
           "barge_policy_runs_total{policy=\"nightly\",source=\"disk\",result=\"failed\"} 0",
           "barge_policy_max_duration_without_backup_seconds{policy=\"nightly\",source=\"disk\"} 93600",
           "barge_policy_target_up{policy=\"nightly\",target=\"/nonexistent-barge-t\"} 0",
           "# TYPE barge_policy_runs_total counter",
       }) {
    EXPECT_NE(text.find(want), std::string::npos) << want << "\n" << text;
  }
  EXPECT_NE(text.find("barge_policy_target_free_bytes{policy=\"nightly\",target=\"" + (dir / "t1") + "\"}"),
            std::string::npos);
  // A target that cannot be read may hold points: no count, rather than 0.
  EXPECT_EQ(text.find("barge_policy_retained_points"), std::string::npos) << text;
  auto readable = ParsePolicy(Env::Default(), "name: nightly\nsources:\n  - image: /vm/disk.qcow2\ntargets: [" +
                                                  (dir / "t1") + "]\n");
  ASSERT_TRUE(readable.ok());
  auto snap2 = CollectPolicyMetrics(*readable, **catalog, Env::Default(), *ParseRfc3339("2026-11-24T00:00:00Z"));
  ASSERT_TRUE(snap2.ok());
  EXPECT_NE(RenderPolicyMetrics({*snap2}).find("barge_policy_retained_points{policy=\"nightly\",source=\"disk\"} 0"),
            std::string::npos);

  const std::string prom = dir / "barge.prom";
  ASSERT_TRUE(WritePolicyMetricsTextfile(Env::Default(), prom, {*snap}).ok());
  auto back = Env::Default().ReadFile(prom);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);
  EXPECT_FALSE(Env::Default().Exists(TempPathFor(prom)));

  PolicyMetricsCollector collector;
  EXPECT_TRUE(collector.Collect().empty());
  collector.Update({*snap});
  EXPECT_FALSE(collector.Collect().empty());

  BARGE_REQUIRE_TOOL("promtool");
  barge::testing::RunOk("promtool check metrics < " + prom);
}

TEST(PolicyMetricsTest, ShippedAlertingRules) {
  BARGE_REQUIRE_TOOL("promtool");
  const std::string dir = std::string(BARGE_SOURCE_DIR) + "/deploy/prometheus";
  barge::testing::RunOk("promtool check rules " + dir + "/barge-rules.yml");
  std::string out = barge::testing::RunOk("cd " + dir + " && promtool test rules barge-rules.test.yml");
  EXPECT_NE(out.find("SUCCESS"), std::string::npos) << out;
}

}  // namespace
}  // namespace barge::orchestrate
