// The policy texts a person reads: check's summary and problem lines, the
// --source typo message, shards, a run's lines, forget's plan, runs list.
#include "orchestrate/policy/policy_text.h"

#include <gtest/gtest.h>

#include "orchestrate/policy/policy_shard.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {
namespace {

constexpr const char* kPolicy = R"(name: nightly
sources:
  - image: /var/lib/vm/disk.qcow2
    bitmap: cbt0
  - domain: vm1
    quiesce: false
schedule: "CRON_TZ=Europe/Berlin 30 2 * * *"
max_duration_without_backup: 26h
retention_count: 15
targets: [/backups/a, /backups/b]
free_space_multiple: 2
)";

Policy Parse(const char* yaml) {
  auto p = ParsePolicy(Env::Default(), yaml, "nightly.yaml");
  EXPECT_TRUE(p.ok()) << p.error().message();
  return p.ok() ? *p : Policy{};
}

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(PolicyTextTest, ProblemsAreCompilerStyle) {
  std::vector<PolicyProblem> problems(2);
  problems[0].line = 3;
  problems[0].column = 5;
  problems[0].message = "unknown key";
  problems[1].message = "no sources";
  EXPECT_EQ(PolicyProblemsText("p.yaml", problems),
            "p.yaml:3:5: unknown key\np.yaml: no sources\n");
}

TEST(PolicyTextTest, CheckSaysEachSourceAndTheNextRunsInTheZone) {
  const Policy p = Parse(kPolicy);
  auto t = ParseRfc3339("2026-01-10T00:00:00Z");
  ASSERT_TRUE(t.ok());
  const std::string text = PolicyCheckText("nightly.yaml", p, 1, NextRunTimes(p, *t, 2));
  EXPECT_EQ(text.rfind("policy nightly (nightly.yaml) is valid, with 1 warning(s) above\n", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "  source disk: image /var/lib/vm/disk.qcow2, incrementals from bitmap cbt0\n")) << text;
  EXPECT_TRUE(Has(text, ", tracker nightly, not quiesced (quiesce: false)\n")) << text;
  EXPECT_TRUE(Has(text, "  targets: /backups/a, /backups/b (free space >= 2x a source's allocated bytes)\n")) << text;
  EXPECT_TRUE(Has(text, "  alert: after ")) << text;
  ASSERT_TRUE(p.schedule.has_value());
  EXPECT_TRUE(Has(text, "  schedule: " + p.schedule->expression() + " (Europe/Berlin)\n")) << text;
  // 02:30 in Berlin is 01:30 UTC in winter.
  EXPECT_TRUE(Has(text, "    2026-01-10T01:30:00Z (02:30 Europe/Berlin)\n")) << text;
}

TEST(PolicyTextTest, CheckWithoutSchedule) {
  std::string yaml = kPolicy;
  yaml.erase(yaml.find("schedule:"), yaml.find("max_duration") - yaml.find("schedule:"));
  const Policy p = Parse(yaml.c_str());
  const std::string text = PolicyCheckText("nightly.yaml", p, 0, {});
  EXPECT_EQ(text.rfind("policy nightly (nightly.yaml) is valid\n", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "  no schedule: backups run when the reason changes or with barge run --force\n")) << text;
}

TEST(PolicyTextTest, UnknownSourceSuggestsTheClosestName) {
  const Policy p = Parse(kPolicy);
  EXPECT_EQ(UnknownSourceMessage(p, {"disk", "vm2"}),
            "policy nightly has no source 'vm2'; did you mean 'vm1'? (sources: disk, vm1)");
  EXPECT_EQ(UnknownSourceMessage(p, {"elsewhere"}), "policy nightly has no source 'elsewhere' (sources: disk, vm1)");
  EXPECT_EQ(UnknownSourceMessage(p, {"disk", "vm1"}), "");
}

TEST(PolicyTextTest, ShardsFollowShardOfSource) {
  const Policy p = Parse(kPolicy);
  const PolicyShards s = ShardPolicySources(p, 3);
  ASSERT_EQ(s.per.size(), 3u);
  ASSERT_EQ(s.sources.size(), 2u);
  EXPECT_EQ(s.sources[0].first, "disk");
  EXPECT_EQ(s.sources[0].second, ShardOfSource("disk", 3));
  EXPECT_EQ(s.sources[1].second, ShardOfSource("vm1", 3));
  size_t listed = 0;
  for (const auto& names : s.per) listed += names.size();
  EXPECT_EQ(listed, 2u);
  const std::string text = ShardsText(p, s);
  EXPECT_EQ(text.rfind("policy nightly over 3 shard(s) (rendezvous hashing of source names)\n", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "(no source)")) << text;  // 2 sources, 3 shards
}

TEST(PolicyTextTest, RunReportLinesAndSummary) {
  const Policy p = Parse(kPolicy);
  RunReport report;
  SourceOutcome idle;
  idle.source = "disk";
  idle.due.why = "not yet";
  SourceOutcome failed;
  failed.source = "vm1";
  failed.ran = true;
  failed.record.result = "failed";
  failed.record.error = "no space";
  report.sources = {idle, failed};
  report.ran = 1;
  report.failed = 1;
  EXPECT_EQ(RunReportText(p, report),
            "  disk    not due   (not yet)\n"
            "  vm1     FAILED    no space\n"
            "policy nightly: 0 of 1 backup(s) succeeded, 1 failed\n");
  EXPECT_EQ(RunReportText(p, RunReport{}), "nothing due for policy nightly\n");
}

TEST(PolicyTextTest, ForgetSaysWhyEachPointStays) {
  ForgetSourceReport r;
  r.source = "disk";
  r.plan.keep = {"/b/disk|p3", "/b/disk|p2"};
  r.plan.forget = {"/b/disk|p1"};
  r.plan.kept_anyway = {{"/b/disk|p2", "p3 needs it"}};
  r.plan.actions = {{RetentionActionKind::kMergeThrough, "/b/disk", {"p1"}, "p2"}};
  r.why_kept["/b/disk|p3"] = {"last", "daily"};
  EXPECT_EQ(ForgetSourceText(r, true),
            "disk: keep 2, would remove 1, kept anyway 1\n"
            "  keep p3: last, daily\n"
            "  keep p2: kept anyway, p3 needs it\n"
            "  would remove p1\n"
            "  would " + std::string(RetentionActionKindName(RetentionActionKind::kMergeThrough)) +
                " /b/disk: p1 (into p2)\n");
}

TEST(PolicyTextTest, RunsListNamesTheCatalogOnlyOfSeveral) {
  EXPECT_EQ(RunsListText({}, "nightly", false), "no runs recorded for policy nightly\n");
  RunRecord r;
  r.id = 4;
  r.started_at = "2026-01-10T01:30:00Z";
  r.policy = "nightly";
  r.source = "disk";
  r.result = "failed";
  r.trigger = "schedule";
  r.error = "no space";
  const std::vector<std::pair<RunRecord, std::string>> runs = {{r, "/c/a.db"}};
  EXPECT_EQ(RunsListText(runs, "", false),
            "2026-01-10T01:30:00Z  nightly/disk  failed  schedule  [record 4]\n    no space\n");
  EXPECT_TRUE(Has(RunsListText(runs, "", true), "[record 4 of /c/a.db]"));
}

}  // namespace
}  // namespace barge::orchestrate
