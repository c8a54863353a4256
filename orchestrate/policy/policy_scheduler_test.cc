// The scheduler loop under a fake clock: a first pass at once, sleeping
// until the next slot, missed slots coalesced, a replaced policy (changed
// reason) run at once, metrics kept fresh, another process's lock retried,
// and Stop() ending a run in progress with its records failed.
#include "orchestrate/policy/policy_scheduler.h"

#include <gtest/gtest.h>

#include <thread>

#include "orchestrate/schedule/time_text.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using barge::testing::TempDir;
using namespace std::chrono_literals;

class FakeClock final : public SchedulerClock {
 public:
  explicit FakeClock(SysSeconds t) : now_(t.time_since_epoch().count()) {}
  SysSeconds Now() override { return SysSeconds(std::chrono::seconds(now_.load())); }
  void Set(SysSeconds t) { now_ = t.time_since_epoch().count(); }
  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, SysSeconds deadline,
                 const std::function<bool()>& wake) override {
    ++waits_;
    while (!wake() && Now() < deadline) cv.wait_for(lock, 2ms);
  }
  int waits() const { return waits_.load(); }

 private:
  std::atomic<int64_t> now_;
  std::atomic<int> waits_{0};
};

// Succeeds at once, or blocks until cancelled for sources named "slow".
class FakeBackend final : public SourceBackend {
 public:
  Result<uint64_t> AllocatedBytes(const PolicySource&) override { return uint64_t{1}; }
  Result<std::string> IncrementalBlocker(const PolicySource&, const std::string&, const std::string&) override {
    return std::string();
  }
  Result<SourceBackupResult> Backup(const SourceBackupRequest& r) override {
    ++backups;
    if (r.source->name == "bad" && fail_bad) return Error::IoError("injected read failure");
    if (r.source->name == "slow") {
      blocked = true;
      while (!r.copy.cancel->load()) std::this_thread::sleep_for(5ms);
      return Error::Cancelled("copy cancelled");
    }
    SourceBackupResult out;
    out.type = "full";
    return out;
  }
  std::atomic<int> backups{0};
  std::atomic<bool> blocked{false};
  std::atomic<bool> fail_bad{true};
};

// Polls `done` for up to 10 s.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

class PolicySchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "t").ok()); }
  Policy Parse(const std::string& extra) {
    auto p = ParsePolicy(Env::Default(), "name: sched\nsources:\n  - nbd: nbd://h/one\ntargets: [" + (dir_ / "t") + "]\n" + extra);
    EXPECT_TRUE(p.ok()) << p.error().message();
    return p.ok() ? *p : Policy{};
  }
  SchedulerOptions Options() {
    SchedulerOptions o;
    o.run.catalog_path = dir_ / "catalog.db";
    o.run.backend = &backend_;
    o.clock = &clock_;
    o.refresh = std::chrono::hours(1);
    o.metrics = &collector_;
    o.on_run = [this](const RunReport& r) {
      std::lock_guard lock(mu_);
      reports_.push_back(r);
    };
    return o;
  }
  size_t Reports() {
    std::lock_guard lock(mu_);
    return reports_.size();
  }
  RunReport Report(size_t i) {
    std::lock_guard lock(mu_);
    return reports_.at(i);
  }

  TempDir dir_;
  FakeClock clock_{*ParseRfc3339("2026-11-22T10:00:30Z")};
  FakeBackend backend_;
  PolicyMetricsCollector collector_;
  std::mutex mu_;
  std::vector<RunReport> reports_;
};

TEST_F(PolicySchedulerTest, SlotsCoalescingReplaceAndMetrics) {
  PolicyScheduler sched(Env::Default(), Parse("schedule: '*/5 * * * *'\n"), Options());
  std::thread loop([&] { sched.Loop(); });

  // Never backed up: due at once; then asleep until the 10:05 slot.
  ASSERT_TRUE(Eventually([&] { return Reports() == 1 && sched.status().next_pass.has_value(); }));
  EXPECT_EQ(Report(0).sources[0].record.trigger, "schedule");
  EXPECT_EQ(Report(0).sources[0].record.started_at, "2026-11-22T10:00:30Z");
  EXPECT_EQ(FormatRfc3339(*sched.status().next_pass), "2026-11-22T10:05:00Z");
  EXPECT_FALSE(collector_.Collect().empty());

  clock_.Set(*ParseRfc3339("2026-11-22T10:04:59Z"));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Reports(), 1u);
  clock_.Set(*ParseRfc3339("2026-11-22T10:05:00Z"));
  ASSERT_TRUE(Eventually([&] { return Reports() == 2; }));
  EXPECT_EQ(Report(1).sources[0].due.why, "slot 2026-11-22T10:05:00Z");

  // Two slots missed (10:10, 10:15): one run. (The clock may move before
  // the 10:05 pass ended: a slot that passed during a pass is not skipped.)
  clock_.Set(*ParseRfc3339("2026-11-22T10:17:00Z"));
  ASSERT_TRUE(Eventually([&] { return Reports() == 3; }));
  EXPECT_NE(Report(2).sources[0].due.why.find("2 slots since the last run, coalesced"), std::string::npos)
      << Report(2).sources[0].due.why;
  ASSERT_TRUE(Eventually([&] { return sched.status().next_pass.has_value() &&
                                      FormatRfc3339(*sched.status().next_pass) == "2026-11-22T10:20:00Z"; }));

  // A new policy with another reason runs at once, without waiting for a slot.
  Policy changed = sched.policy();
  changed.reason = "before-upgrade";
  sched.Replace(changed);
  ASSERT_TRUE(Eventually([&] { return Reports() == 4; }));
  EXPECT_EQ(Report(3).sources[0].record.trigger, "reason");
  EXPECT_EQ(backend_.backups.load(), 4);

  SchedulerStatus st = sched.status();
  EXPECT_EQ(st.policy, "sched");
  EXPECT_EQ(st.runs, 4u);
  EXPECT_EQ(st.failed_runs, 0u);
  EXPECT_TRUE(st.last_error.empty()) << st.last_error;
  sched.Stop("stopped by test");
  loop.join();
  EXPECT_TRUE(sched.status().stopping);
}

// Issue 18: /healthz's last_error shows a failing source, also after a
// pass with nothing due, until its next backup succeeds.
TEST_F(PolicySchedulerTest, LastErrorShowsAFailingSourceUntilItSucceeds) {
  auto p = ParsePolicy(Env::Default(), "name: sched\nsources:\n  - nbd: nbd://h/one\n  - nbd: nbd://h/bad\n"
                                       "targets: [" + (dir_ / "t") + "]\nschedule: '*/5 * * * *'\n");
  ASSERT_TRUE(p.ok());
  PolicyScheduler sched(Env::Default(), *p, Options());
  std::thread loop([&] { sched.Loop(); });
  ASSERT_TRUE(Eventually([&] { return Reports() == 1 && sched.status().last_pass.has_value(); }));
  EXPECT_EQ(sched.status().last_error, "source bad: IoError: injected read failure");
  // A pass with nothing due (the same policy again) keeps it.
  sched.Replace(*p);
  ASSERT_TRUE(Eventually([&] { return clock_.waits() >= 2 && !sched.status().running; }));
  EXPECT_EQ(Reports(), 1u);
  EXPECT_EQ(sched.status().last_error, "source bad: IoError: injected read failure");
  // The next slot's backup succeeds: all is well again.
  backend_.fail_bad = false;
  clock_.Set(*ParseRfc3339("2026-11-22T10:05:00Z"));
  ASSERT_TRUE(Eventually([&] { return Reports() == 2; }));
  ASSERT_TRUE(Eventually([&] { return !sched.status().running; }));
  EXPECT_EQ(sched.status().last_error, "");
  sched.Stop("done");
  loop.join();
}

// A failed source is retried retry_failed_after later: the loop wakes
// then, not at the next slot or metrics refresh.
TEST_F(PolicySchedulerTest, FailedSourceWakesTheLoopForItsRetry) {
  auto o = Options();
  o.retry_failed_after = 60s;
  auto p = ParsePolicy(Env::Default(), "name: sched\nsources:\n  - nbd: nbd://h/bad\ntargets: [" + (dir_ / "t") +
                                       "]\nschedule: '@daily'\n");
  ASSERT_TRUE(p.ok());
  PolicyScheduler sched(Env::Default(), *p, o);
  std::thread loop([&] { sched.Loop(); });
  ASSERT_TRUE(Eventually([&] { return Reports() == 1 && sched.status().next_pass.has_value(); }));
  EXPECT_EQ(Report(0).sources[0].record.result, "failed");
  EXPECT_EQ(FormatRfc3339(*sched.status().next_pass), "2026-11-22T10:01:30Z");
  backend_.fail_bad = false;
  clock_.Set(*ParseRfc3339("2026-11-22T10:01:30Z"));
  ASSERT_TRUE(Eventually([&] { return Reports() == 2; }));
  EXPECT_EQ(Report(1).sources[0].due.why.rfind("retry: the last backup", 0), 0u) << Report(1).sources[0].due.why;
  EXPECT_EQ(Report(1).sources[0].record.result, "success");
  sched.Stop("done");
  loop.join();
}

TEST_F(PolicySchedulerTest, StopEndsTheRunInProgressAndFailsItsRecords) {
  auto o = Options();
  auto p = ParsePolicy(Env::Default(), "name: sched\nsources:\n  - nbd: nbd://h/slow\ntargets: [" + (dir_ / "t") +
                       "]\nschedule: '@daily'\n");
  ASSERT_TRUE(p.ok());
  PolicyScheduler sched(Env::Default(), *p, o);
  std::thread loop([&] { sched.Loop(); });
  ASSERT_TRUE(Eventually([&] { return backend_.blocked.load(); }));
  EXPECT_TRUE(sched.status().running);
  sched.Stop("stopped by SIGTERM");
  loop.join();
  ASSERT_EQ(Reports(), 1u);
  const RunReport report = Report(0);
  const RunRecord& r = report.sources[0].record;
  EXPECT_EQ(r.result, "failed");
  EXPECT_EQ(r.error.rfind("stopped by SIGTERM", 0), 0u) << r.error;
  auto catalog = PolicyCatalog::Open(PosixEnv(), dir_ / "catalog.db");
  ASSERT_TRUE(catalog.ok());
  auto runs = (*catalog)->ListRuns({"sched", "", 0});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].result, "failed");
  EXPECT_FALSE(sched.status().running);
}

TEST_F(PolicySchedulerTest, AnotherProcessHoldingTheLockIsRetried) {
  auto o = Options();
  o.busy_retry = 10s;
  std::vector<std::string> errors;
  std::mutex errors_mu;
  o.on_error = [&](const Error& e) {
    std::lock_guard lock(errors_mu);
    errors.push_back(e.ToString());
  };
  ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "locks/policies").ok());
  auto held = Env::Default().LockFile(PolicyLockPath(o.run.catalog_path, "sched"));
  ASSERT_TRUE(held.ok());
  PolicyScheduler sched(Env::Default(), Parse("schedule: '@daily'\n"), o);
  std::thread loop([&] { sched.Loop(); });
  ASSERT_TRUE(Eventually([&] { return sched.status().next_pass.has_value(); }));
  EXPECT_EQ(FormatRfc3339(*sched.status().next_pass), "2026-11-22T10:00:40Z");
  EXPECT_NE(sched.status().last_error.find("in progress"), std::string::npos) << sched.status().last_error;
  EXPECT_EQ(Reports(), 0u);
  held->reset();
  clock_.Set(*ParseRfc3339("2026-11-22T10:00:40Z"));
  ASSERT_TRUE(Eventually([&] { return Reports() == 1; }));
  sched.Stop("done");
  loop.join();
  std::lock_guard lock(errors_mu);
  ASSERT_FALSE(errors.empty());
  EXPECT_NE(errors[0].find("Busy"), std::string::npos) << errors[0];
}

TEST_F(PolicySchedulerTest, SourceNeverRunKnownSinceFirstSeen) {
  // No schedule, reason unchanged: nothing runs; the metric says since when
  // the daemon knows the source (so a missing-backup alert can fire).
  auto o = Options();
  o.metrics_textfile = dir_ / "barge.prom";
  PolicyScheduler sched(Env::Default(), Parse("max_duration_without_backup: 1h\n"), o);
  std::thread loop([&] { sched.Loop(); });
  ASSERT_TRUE(Eventually([&] { return sched.status().last_pass.has_value(); }));
  sched.Stop("done");
  loop.join();
  EXPECT_EQ(Reports(), 0u);
  auto text = Env::Default().ReadFile(dir_ / "barge.prom");
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("barge_policy_source_known_since_timestamp_seconds{policy=\"sched\",source=\"one\"} " +
                       std::to_string(ParseRfc3339("2026-11-22T10:00:30Z")->time_since_epoch().count())),
            std::string::npos)
      << *text;
}

}  // namespace
}  // namespace barge::orchestrate
