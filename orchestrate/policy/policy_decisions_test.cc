// Table tests of the pure policy decisions: due (reasons, coalesced slots,
// runs in progress), full or incremental, placement, retention and forget.
#include "orchestrate/policy/policy_decisions.h"

#include <gtest/gtest.h>

#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {
namespace {

SysSeconds T(const char* s) { return *ParseRfc3339(s); }

Policy MakePolicy(const char* schedule = "0 2 * * *", const char* reason = "") {
  std::string yaml = std::string("name: p\nsources:\n  - image: /d.qcow2\n    bitmap: cbt0\n  - domain: vm1\n"
                                 "  - nbd: nbd://h/e\ntargets: [/a, /b, /c]\nreason: '") +
                     reason + "'\n";
  if (*schedule) yaml += std::string("schedule: '") + schedule + "'\n";
  auto p = ParsePolicy(Env::Default(), yaml);
  EXPECT_TRUE(p.ok()) << p.error().message();
  return *p;
}

TEST(DecideDueTest, Table) {
  struct Case {
    const char* name;
    const char* schedule;
    const char* reason;
    std::optional<const char*> last_attempt;
    std::optional<const char*> last_reason;
    const char* now;
    bool in_progress;
    bool due;
    Trigger trigger;
    size_t coalesced;
    const char* why;
  } cases[] = {
      {"never ran, schedule", "0 2 * * *", "", {}, {}, "2026-11-22T10:00:00Z", false, true, Trigger::kSchedule, 1,
       "never backed up"},
      {"slot not reached", "0 2 * * *", "", "2026-11-22T02:00:05Z", "", "2026-11-22T10:00:00Z", false, false,
       Trigger::kSchedule, 0, "next slot 2026-11-23T02:00:00Z"},
      {"slot passed", "0 2 * * *", "", "2026-11-22T02:00:05Z", "", "2026-11-23T02:00:00Z", false, true,
       Trigger::kSchedule, 1, "slot 2026-11-23T02:00:00Z"},
      {"three missed slots coalesced", "0 2 * * *", "", "2026-11-20T02:00:05Z", "", "2026-11-23T09:00:00Z", false,
       true, Trigger::kSchedule, 3, "slot 2026-11-23T02:00:00Z (3 slots since the last run, coalesced)"},
      {"in progress: nothing", "0 2 * * *", "", "2026-11-20T02:00:05Z", "", "2026-11-23T09:00:00Z", true, false,
       Trigger::kSchedule, 0, "in progress"},
      {"reason changed", "0 2 * * *", "upgrade-1", "2026-11-22T02:00:05Z", "", "2026-11-22T10:00:00Z", false, true,
       Trigger::kReason, 0, "reason changed from '' to 'upgrade-1'"},
      {"reason first set, never ran", "", "r1", {}, {}, "2026-11-22T10:00:00Z", false, true, Trigger::kReason, 0,
       "reason changed"},
      {"reason already run", "", "r1", "2026-11-22T02:00:05Z", "r1", "2026-11-25T10:00:00Z", false, false,
       Trigger::kReason, 0, "no schedule"},
      {"reason changed back to empty", "", "", "2026-11-22T02:00:05Z", "r1", "2026-11-25T10:00:00Z", false, true,
       Trigger::kReason, 0, "from 'r1' to ''"},
      {"reason change wins over slot", "@hourly", "r2", "2026-11-22T02:00:05Z", "r1", "2026-11-22T05:00:00Z", false,
       true, Trigger::kReason, 0, "reason"},
      {"every minute, 90 minutes missed", "* * * * *", "", "2026-11-22T00:00:00Z", "", "2026-11-22T01:30:30Z", false,
       true, Trigger::kSchedule, 90, "(90 slots"},
  };
  for (const auto& c : cases) {
    Policy p = MakePolicy(c.schedule, c.reason);
    SourceState st;
    if (c.last_attempt) st.last_attempt = T(*c.last_attempt);
    if (c.last_reason) st.last_reason = *c.last_reason;
    DueDecision d = DecideDue(p, st, T(c.now), c.in_progress);
    EXPECT_EQ(d.due, c.due) << c.name << ": " << d.why;
    if (c.due) {
      EXPECT_EQ(d.trigger, c.trigger) << c.name;
      EXPECT_EQ(d.coalesced_slots, c.coalesced) << c.name;
    }
    EXPECT_NE(d.why.find(c.why), std::string::npos) << c.name << ": " << d.why;
  }
}

// Issue 18: a failed last attempt is due again at the next run (after
// retry_after), not only at the next slot; a success is not.
TEST(DecideDueTest, FailedLastAttemptIsRetried) {
  Policy daily = MakePolicy("0 2 * * *", "");
  SourceState st;
  st.last_attempt = T("2026-11-22T02:00:05Z");
  st.last_reason = "";
  st.last_failed = true;
  DueDecision d = DecideDue(daily, st, T("2026-11-22T02:10:00Z"), false);
  EXPECT_TRUE(d.due) << d.why;
  EXPECT_EQ(d.trigger, Trigger::kSchedule);
  EXPECT_EQ(d.why, "retry: the last backup (2026-11-22T02:00:05Z) failed");
  // Not before retry_after (serve's wait); a slot still makes it due.
  EXPECT_FALSE(DecideDue(daily, st, T("2026-11-22T02:03:00Z"), false, std::chrono::minutes(5)).due);
  EXPECT_TRUE(DecideDue(daily, st, T("2026-11-22T02:05:05Z"), false, std::chrono::minutes(5)).due);
  DueDecision slot = DecideDue(daily, st, T("2026-11-23T02:00:00Z"), false, std::chrono::hours(48));
  EXPECT_TRUE(slot.due);
  EXPECT_EQ(slot.why, "slot 2026-11-23T02:00:00Z");
  EXPECT_FALSE(DecideDue(daily, st, T("2026-11-22T02:10:00Z"), true).due);  // in progress
  // Without a schedule: the reason's backup is retried.
  Policy manual = MakePolicy("", "r1");
  st.last_reason = "r1";
  DueDecision r = DecideDue(manual, st, T("2026-11-22T02:10:00Z"), false);
  EXPECT_TRUE(r.due);
  EXPECT_EQ(r.trigger, Trigger::kReason);
  // A success waits for the next slot.
  st.last_failed = false;
  EXPECT_FALSE(DecideDue(manual, st, T("2026-11-22T02:10:00Z"), false).due);
  st.last_reason = "";
  EXPECT_FALSE(DecideDue(daily, st, T("2026-11-22T02:10:00Z"), false).due);
}

TEST(DecideBackupTypeTest, Table) {
  Policy p = MakePolicy();
  p.full_every = 3;
  const PolicySource& image = p.sources[0];
  const PolicySource& domain = p.sources[1];
  const PolicySource& nbd = p.sources[2];
  PolicySource plain = image;
  plain.bitmap.clear();
  ChainSummary two{"/a", 2}, three{"/a", 3};
  EXPECT_FALSE(DecideBackupType(p, image, std::nullopt, true).incremental);
  EXPECT_EQ(DecideBackupType(p, image, std::nullopt, true).reason, "first backup of the source");
  EXPECT_TRUE(DecideBackupType(p, image, two, true).incremental);
  EXPECT_TRUE(DecideBackupType(p, domain, two, true).incremental);
  EXPECT_FALSE(DecideBackupType(p, image, three, true).incremental);
  EXPECT_EQ(DecideBackupType(p, image, three, true).reason, "full_every 3 reached");
  auto broken = DecideBackupType(p, image, two, false, "bitmap cbt0 missing");
  EXPECT_FALSE(broken.incremental);
  EXPECT_EQ(broken.reason, "bitmap cbt0 missing");
  EXPECT_FALSE(DecideBackupType(p, nbd, two, true).incremental);
  // An image without a bitmap takes digest incrementals (changed_by
  // digests, ParsePolicy's default for it); "full" asks for fulls.
  plain.changed_by = "digests";
  EXPECT_TRUE(DecideBackupType(p, plain, two, true).incremental);
  EXPECT_FALSE(DecideBackupType(p, plain, three, true).incremental);
  plain.changed_by = "full";
  EXPECT_FALSE(DecideBackupType(p, plain, two, true).incremental);
  EXPECT_EQ(DecideBackupType(p, plain, two, true).reason, "changed_by full: every backup is full");
  p.full_every = 0;  // never forced
  EXPECT_TRUE(DecideBackupType(p, image, ChainSummary{"/a", 1000}, true).incremental);
}

TEST(PlaceBackupTest, Table) {
  auto first = [](size_t) -> size_t { return 0; };
  auto last = [](size_t n) -> size_t { return n - 1; };
  std::vector<TargetState> targets = {
      {"/a", 1000, "", 5}, {"/b", 5000, "", 2}, {"/c", 5000, "", 2}, {"/d", std::nullopt, "Stat: EIO", 0}};
  TypeDecision full{false, "first backup of the source"};
  TypeDecision inc{true, "incremental in the chain on /a"};

  // Fewest successful backups among qualifying targets; ties picked.
  auto p = PlaceBackup(targets, 1000, 2, full, std::nullopt, first);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->target, "/b");
  EXPECT_FALSE(p->incremental);
  EXPECT_NE(p->reason.find("chosen among 2 tied"), std::string::npos);
  EXPECT_EQ(PlaceBackup(targets, 1000, 2, full, std::nullopt, last)->target, "/c");
  // /a does not qualify (1000 < 2 x 1000) even though... it has the most
  // backups anyway; with a small source it qualifies but has more backups.
  EXPECT_EQ(PlaceBackup(targets, 100, 2, full, std::nullopt, first)->target, "/b");
  // The failed target never qualifies; a target with 0 backups wins.
  targets[0].successful_backups = 0;
  EXPECT_EQ(PlaceBackup(targets, 100, 2, full, std::nullopt, first)->target, "/a");

  // An incremental follows its chain when the chain's target qualifies...
  ChainSummary chain{"/a", 3};
  auto i = PlaceBackup(targets, 100, 2, inc, chain, first);
  ASSERT_TRUE(i.ok());
  EXPECT_EQ(i->target, "/a");
  EXPECT_TRUE(i->incremental);
  // ...even when another target has fewer backups...
  targets[0].successful_backups = 9;
  EXPECT_EQ(PlaceBackup(targets, 100, 2, inc, chain, first)->target, "/a");
  // ...and starts a new chain elsewhere when it does not.
  auto moved = PlaceBackup(targets, 1000, 2, inc, chain, first);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->target, "/b");
  EXPECT_FALSE(moved->incremental);
  EXPECT_NE(moved->reason.find("the chain's target /a lacks space"), std::string::npos) << moved->reason;
  // A multiple of 0 disables the space check (but not a failed query).
  EXPECT_EQ(PlaceBackup({{"/x", 0, "", 0}}, 1 << 30, 0, full, std::nullopt, first)->target, "/x");

  // No target qualifies: kNoSpace with every target's state.
  auto none = PlaceBackup(targets, 10000, 2, full, std::nullopt, first);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(none.error().message().find("each needs 20000 bytes free"), std::string::npos) << none.error().message();
  EXPECT_NE(none.error().message().find("/b: 5000 bytes free"), std::string::npos);
  EXPECT_NE(none.error().message().find("/d: Stat: EIO"), std::string::npos);

  // No target usable at all (issue 18): the targets' own error, not
  // NoSpace (a missing target is NotFound).
  auto missing = PlaceBackup({{"/gone", std::nullopt, "NotFound: /gone: statvfs", 0, ErrorCode::kNotFound},
                              {"/ro", std::nullopt, "IoError: /ro: statvfs", 0, ErrorCode::kIoError}},
                             100, 0, full, std::nullopt, first);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(missing.error().message(),
            "no target can be used; /gone: NotFound: /gone: statvfs; /ro: IoError: /ro: statvfs");
}

// ---- retention ----

// A chain folder "dir" with points "0000".."000N", one restore point each,
// a day apart from `start` (point i at day i).
struct Fixture {
  std::vector<RestorePoint> points;
  std::vector<ChainView> chains;
  void Chain(const std::string& dir, int first_day, int count) {
    ChainView c{.chain_dir = dir};
    for (int i = 0; i < count; ++i) {
      std::string id = dir + std::to_string(i);
      c.ids.push_back(id);
      points.push_back({id, T("2026-01-01T02:00:00Z") + std::chrono::days(first_day + i), {{dir, id}}});
    }
    chains.push_back(c);
  }
};

std::string Describe(const RetentionPlan& plan) {
  std::string s;
  for (const auto& a : plan.actions) {
    s += std::string(RetentionActionKindName(a.kind)) + "(" + a.chain_dir + ":";
    for (const auto& id : a.ids) s += " " + id;
    if (!a.through.empty()) s += " -> " + a.through;
    s += ") ";
  }
  for (const auto& [k, why] : plan.kept_anyway) s += "anyway(" + k + ") ";
  return s;
}

TEST(RetentionTest, CountRuleMergesTheOldestForward) {
  Fixture f;
  f.Chain("A", 0, 5);  // A0 full, A1..A4 increments
  // retention_count 5 with 5 points: keep 4 before the next backup.
  auto plan = PlanRetention(f.points, f.chains, KeepNewest(f.points, 4));
  EXPECT_EQ(Describe(plan), "merge(A: A0 -> A1) ");
  EXPECT_EQ(plan.forget, std::vector<std::string>{"A0"});
  EXPECT_EQ(plan.keep.size(), 4u);
  EXPECT_EQ(plan.keep.front(), "A4");
  // Fewer points than the count: nothing to do.
  EXPECT_TRUE(PlanRetention(f.points, f.chains, KeepNewest(f.points, 15)).empty());
}

TEST(RetentionTest, WholeChainPastRetentionIsRemoved) {
  Fixture f;
  f.Chain("A", 0, 3);
  f.Chain("B", 3, 3);
  auto plan = PlanRetention(f.points, f.chains, KeepNewest(f.points, 3));
  EXPECT_EQ(Describe(plan), "remove-chain(A: A0 A1 A2) ");
  plan = PlanRetention(f.points, f.chains, KeepNewest(f.points, 2));
  EXPECT_EQ(Describe(plan), "remove-chain(A: A0 A1 A2) merge(B: B0 -> B1) ");
  plan = PlanRetention(f.points, f.chains, KeepNewest(f.points, 4));
  EXPECT_EQ(Describe(plan), "merge(A: A0 A1 -> A2) ");
}

TEST(RetentionTest, MiddlePointsStayAndNewestGo) {
  Fixture f;
  f.Chain("A", 0, 6);
  // Keep A1 and A4 only: A0 merged into A1, A2 and A3 needed by A4, A5 removed.
  auto plan = PlanRetention(f.points, f.chains, {"A1", "A4"});
  EXPECT_EQ(Describe(plan), "remove-newest(A: A5) merge(A: A0 -> A1) anyway(A2) anyway(A3) ");
  EXPECT_EQ(plan.forget, (std::vector<std::string>{"A5", "A0"}));
  EXPECT_EQ(plan.keep, (std::vector<std::string>{"A4", "A3", "A2", "A1"}));
}

TEST(RetentionTest, BaseOfOtherChainsIsNeverRemovedOrFolded) {
  Fixture f;
  f.Chain("A", 0, 5);
  f.chains[0].pinned["A1"] = "base of 2 chains";
  // Keep the newest only: A1 stays (kept anyway, saying why), so the merge
  // folds only A0 into it and A2, A3 stay as the points between.
  auto plan = PlanRetention(f.points, f.chains, {"A4"});
  EXPECT_EQ(Describe(plan), "merge(A: A0 -> A1) anyway(A1) anyway(A2) anyway(A3) ");
  ASSERT_FALSE(plan.kept_anyway.empty());
  bool said = false;
  for (const auto& [key, why] : plan.kept_anyway) said |= key == "A1" && why.find("base of 2 chains") != std::string::npos;
  EXPECT_TRUE(said);
  // A chain past retention keeps its base point: the points after it go,
  // those before are merged into it.
  f.Chain("B", 5, 2);
  plan = PlanRetention(f.points, f.chains, {"B0", "B1"});
  EXPECT_EQ(plan.forget, (std::vector<std::string>{"A4", "A3", "A2", "A0"}));
}

TEST(RetentionTest, DomainPointsStayWhole) {
  // Two disks; vdb's chain restarted (a full at point 2), vda's did not.
  std::vector<RestorePoint> points;
  std::vector<ChainView> chains = {{.chain_dir = "vda", .ids = {"a0", "a1", "a2", "a3"}},
                                   {.chain_dir = "vdb", .ids = {"b0", "b1"}},
                                   {.chain_dir = "vdb", .ids = {"b2", "b3"}}};
  for (int i = 0; i < 4; ++i) {
    points.push_back({"cp" + std::to_string(i), T("2026-01-01T00:00:00Z") + std::chrono::hours(i),
                      {{"vda", "a" + std::to_string(i)}, {"vdb", "b" + std::to_string(i)}}});
  }
  // Keep cp1 and cp3: vda needs a2 between them, so cp2 stays whole
  // (its vdb part b2 too); cp0 merges into cp1 on vda and vdb.
  auto plan = PlanRetention(points, chains, {"cp1", "cp3"});
  EXPECT_EQ(Describe(plan), "merge(vda: a0 -> a1) merge(vdb: b0 -> b1) anyway(cp2) ");
  EXPECT_EQ(plan.forget, std::vector<std::string>{"cp0"});
}

TEST(RetentionTest, UnknownPointsAreNeverRemoved) {
  Fixture f;
  f.Chain("A", 0, 3);
  f.chains[0].ids.insert(f.chains[0].ids.begin(), "stray");  // in the folder, no restore point
  auto plan = PlanRetention(f.points, f.chains, KeepNewest(f.points, 1));
  // The stray full is "kept", so A0 and A1 sit between kept points.
  EXPECT_EQ(Describe(plan), "anyway(A0) anyway(A1) ");
}

// The points SelectForgetWhy keeps.
Result<std::set<std::string>> SelectedKeys(const std::vector<RestorePoint>& points, const ForgetPolicy& policy) {
  BARGE_ASSIGN_OR_RETURN(ForgetSelection why, SelectForgetWhy(points, policy));
  return KeysOf(why);
}

TEST(ForgetTest, ResticStyleSelection) {
  // Two points a day (02:00 and 14:00) for 60 days from Thu 2026-01-01.
  std::vector<RestorePoint> points;
  for (int d = 0; d < 60; ++d) {
    for (int h : {2, 14}) {
      auto t = T("2026-01-01T00:00:00Z") + std::chrono::days(d) + std::chrono::hours(h);
      points.push_back({FormatRfc3339(t), t, {}});
    }
  }
  auto last = SelectedKeys(points, {3, 0, 0, 0});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(*last, (std::set<std::string>{"2026-03-01T14:00:00Z", "2026-03-01T02:00:00Z", "2026-02-28T14:00:00Z"}));
  auto daily = SelectedKeys(points, {0, 2, 0, 0});
  EXPECT_EQ(*daily, (std::set<std::string>{"2026-03-01T14:00:00Z", "2026-02-28T14:00:00Z"}));
  // Weekly: the newest point of each ISO week (Mon-Sun). 2026-03-01 is a
  // Sunday; the week before ends Sunday 2026-02-22.
  auto weekly = SelectedKeys(points, {0, 0, 2, 0});
  EXPECT_EQ(*weekly, (std::set<std::string>{"2026-03-01T14:00:00Z", "2026-02-22T14:00:00Z"}));
  auto monthly = SelectedKeys(points, {0, 0, 0, 3});
  EXPECT_EQ(*monthly, (std::set<std::string>{"2026-03-01T14:00:00Z", "2026-02-28T14:00:00Z",
                                             "2026-01-31T14:00:00Z"}));
  // Union of rules.
  auto both = SelectedKeys(points, {1, 2, 0, 1});
  EXPECT_EQ(both->size(), 2u);
  EXPECT_FALSE(SelectedKeys(points, {}).ok());
  // With one chain of these points, forget keeps everything restorable.
  ChainView c{.chain_dir = "A"};
  for (const auto& p : points) c.ids.push_back(p.key);
  for (auto& p : points) p.parts = {{"A", p.key}};
  auto plan = PlanRetention(points, {c}, *monthly);
  ASSERT_EQ(plan.actions.size(), 1u);
  EXPECT_EQ(plan.actions[0].kind, RetentionActionKind::kMergeThrough);
  EXPECT_EQ(plan.actions[0].through, "2026-01-31T14:00:00Z");
  EXPECT_EQ(plan.keep.size() + plan.forget.size(), points.size());
}


// Issue 18: restic's full rule set (hourly, yearly, within) and the reason
// each point is kept.
TEST(ForgetTest, HourlyYearlyWithinAndWhy) {
  // Every 20 minutes from 2024-12-31T22:00Z to 2025-01-01T02:00Z, then one
  // point on 2023-06-01 and one on 2026-11-25T10:00Z (the newest).
  std::vector<RestorePoint> points;
  auto add = [&](SysSeconds t) { points.push_back({FormatRfc3339(t), t, {}}); };
  add(T("2023-06-01T12:00:00Z"));
  for (int m = 0; m <= 240; m += 20) add(T("2024-12-31T22:00:00Z") + std::chrono::minutes(m));
  add(T("2026-11-25T10:00:00Z"));

  ForgetPolicy hourly;
  hourly.keep_hourly = 3;
  auto h = SelectForgetWhy(points, hourly);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, (ForgetSelection{{"2026-11-25T10:00:00Z", {"hourly 2026-11-25T10"}},
                                 {"2025-01-01T02:00:00Z", {"hourly 2025-01-01T02"}},
                                 {"2025-01-01T01:40:00Z", {"hourly 2025-01-01T01"}}}));

  ForgetPolicy yearly;
  yearly.keep_yearly = 5;  // only 4 years have points: each keeps its newest
  auto y = SelectForgetWhy(points, yearly);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (ForgetSelection{{"2026-11-25T10:00:00Z", {"yearly 2026"}},
                                 {"2025-01-01T02:00:00Z", {"yearly 2025"}},
                                 {"2024-12-31T23:40:00Z", {"yearly 2024"}},
                                 {"2023-06-01T12:00:00Z", {"yearly 2023"}}}));

  // Within: relative to the newest point, not to now; strictly later than
  // newest - within.
  std::vector<RestorePoint> recent;
  for (int i = 0; i < 6; ++i) {
    auto t = T("2026-11-20T00:00:00Z") + std::chrono::hours(12 * i);  // ... 11-22T12:00
    recent.push_back({FormatRfc3339(t), t, {}});
  }
  ForgetPolicy within;
  within.keep_within = std::chrono::hours(36);
  auto w = SelectForgetWhy(recent, within);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (ForgetSelection{{"2026-11-22T12:00:00Z", {"within 1d12h"}},
                                 {"2026-11-22T00:00:00Z", {"within 1d12h"}},
                                 {"2026-11-21T12:00:00Z", {"within 1d12h"}}}));

  // Rules combine by union; a point kept by several lists each, in rule
  // order. ISO week labels use the ISO year (2024-12-31 is in 2025-W01).
  ForgetPolicy mixed;
  mixed.keep_last = 2;
  mixed.keep_daily = 2;
  mixed.keep_weekly = 2;
  mixed.keep_within = std::chrono::hours(1);
  auto m = SelectForgetWhy(points, mixed);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, (ForgetSelection{
                    {"2026-11-25T10:00:00Z", {"last 2", "daily 2026-11-25", "weekly 2026-W48", "within 1h"}},
                    {"2025-01-01T02:00:00Z", {"last 2", "daily 2025-01-01", "weekly 2025-W01"}}}));
  EXPECT_EQ(SelectedKeys(points, mixed)->size(), 2u);
  // No rule at all is refused (it would forget everything).
  EXPECT_EQ(SelectForgetWhy(points, ForgetPolicy{}).error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace barge::orchestrate
