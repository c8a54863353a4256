// The policy runner end to end on real image files: placement over two
// targets, retention (whole chains removed, fulls merged forward with every
// remaining point still opening and verifying), bitmap incrementals with
// the bitmap cleared after each backup, full targets, max_run_time, the
// policy lock, records and forget.
#include "orchestrate/policy/policy_runner.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "orchestrate/schedule/time_text.h"
#include "pipeline/chain.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using barge::testing::TempDir;

class PolicyRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "t1").ok());
    ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "t2").ok());
  }
  // A raw disk of `mib` MiB with a pattern that depends on `seed`.
  void MakeRaw(const std::string& path, int mib, int seed) {
    std::string data(static_cast<size_t>(mib) << 20, '\0');
    for (size_t i = 0; i < data.size(); i += 4096) data[i] = static_cast<char>(seed + i / 4096);
    ASSERT_TRUE(Env::Default().WriteFileAtomic(path, data, false).ok());
  }
  Policy Parse(const std::string& yaml) {
    auto p = ParsePolicy(Env::Default(), yaml);
    EXPECT_TRUE(p.ok()) << p.error().message();
    return p.ok() ? *p : Policy{};
  }
  RunOptions Options() {
    RunOptions o;
    o.catalog_path = dir_ / "catalog.db";
    o.now = [this] { return now_; };
    o.pick = [](size_t) { return size_t{0}; };
    o.copy.memory_bytes = 16 << 20;
    return o;
  }
  size_t Points(const std::string& chain_dir) {
    auto c = pipeline::LoadChainFolder(PosixEnv(), chain_dir);
    return c.ok() ? c->points.size() : 0;
  }
  // Every point of the chain folder opens, its layers and digests check.
  void ExpectAllRestorable(const std::string& chain_dir) {
    auto c = pipeline::LoadChainFolder(PosixEnv(), chain_dir);
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    for (size_t i = 0; i < c->points.size(); ++i) {
      auto p = pipeline::OpenPoint(PosixEnv(), *c, i);
      EXPECT_TRUE(p.ok()) << chain_dir << " point " << i << ": " << p.error().ToString();
    }
  }

  TempDir dir_;
  SysSeconds now_ = *ParseRfc3339("2026-11-22T10:00:00Z");
};

TEST_F(PolicyRunnerTest, ScheduleSpreadRetentionAndRecords) {
  MakeRaw(dir_ / "a.raw", 2, 1);
  MakeRaw(dir_ / "b.raw", 2, 7);
  Policy p = Parse("name: pol\nsources:\n  - image: " + (dir_ / "a.raw") + "\n    changed_by: full\n  - image: " +
                   (dir_ / "b.raw") + "\n    changed_by: full\nschedule: '* * * * *'\nretention_count: 3\nmax_parallel: 2\ntargets: [" + (dir_ / "t1") +
                   ", " + (dir_ / "t2") + "]\nfree_space_multiple: 1\n");
  RunOptions o = Options();
  for (int run = 0; run < 4; ++run) {
    auto r = RunPolicyOnce(Env::Default(), p, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    ASSERT_EQ(r->ran, 2u) << "run " << run;
    EXPECT_EQ(r->failed, 0u) << r->sources[0].record.error << r->sources[1].record.error;
    // Same minute again: nothing due.
    auto again = RunPolicyOnce(Env::Default(), p, o);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->ran, 0u);
    EXPECT_NE(again->sources[0].due.why.find("next slot"), std::string::npos) << again->sources[0].due.why;
    now_ += std::chrono::minutes(3);  // three slots pass: coalesced into one run
    // Backup ids and manifests tell time to the second; keep runs apart.
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  }
  // Raw sources with changed_by full: every backup is a new chain, spread t1, t2, t1, t2 (fewest
  // present backups first); retention 3: the oldest chain was removed.
  for (const char* src : {"a", "b"}) {
    EXPECT_EQ(Points(dir_ / ("t1/pol/" + std::string(src))) + Points(dir_ / ("t2/pol/" + std::string(src))), 3u)
        << src;
    EXPECT_GE(Points(dir_ / ("t1/pol/" + std::string(src))), 1u);
    EXPECT_GE(Points(dir_ / ("t2/pol/" + std::string(src))), 1u);
  }
  auto catalog = PolicyCatalog::Open(PosixEnv(), o.catalog_path);
  ASSERT_TRUE(catalog.ok());
  auto runs = (*catalog)->ListRuns({"pol", "a", 0});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 4u);
  EXPECT_EQ(runs->back().point_state, "removed");  // the first backup went
  EXPECT_EQ(runs->front().point_state, "present");
  EXPECT_EQ(runs->front().trigger, "schedule");
  EXPECT_NE(runs->front().trigger_detail.find("3 slots since the last run, coalesced"), std::string::npos)
      << runs->front().trigger_detail;
  EXPECT_EQ(runs->front().type, "full");
  EXPECT_EQ(runs->front().result, "success");
  EXPECT_EQ(runs->front().barge_version, BargeVersion());
  EXPECT_FALSE(runs->front().host.empty());
  EXPECT_GT(runs->front().bytes_read, 0u);
  EXPECT_EQ(runs->back().trigger_detail, "never backed up");

  // A changed reason: one more backup at once, then nothing.
  p.reason = "before-upgrade";
  auto r = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->ran, 2u);
  EXPECT_EQ(r->sources[0].record.trigger, "reason");
  EXPECT_EQ(RunPolicyOnce(Env::Default(), p, o)->ran, 0u);

  // forget: dry run first (nothing changes), then for real.
  ForgetOptions fo;
  fo.catalog_path = o.catalog_path;
  fo.dry_run = true;
  fo.only_sources = {"a"};
  auto plan = ForgetPoints(Env::Default(), p, ForgetPolicy{1, 0, 0, 0}, fo);
  ASSERT_TRUE(plan.ok()) << plan.error().ToString();
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].plan.forget.size(), 2u);
  EXPECT_EQ(Points(dir_ / "t1/pol/a") + Points(dir_ / "t2/pol/a"), 3u);
  fo.dry_run = false;
  ASSERT_TRUE(ForgetPoints(Env::Default(), p, ForgetPolicy{1, 0, 0, 0}, fo).ok());
  EXPECT_EQ(Points(dir_ / "t1/pol/a") + Points(dir_ / "t2/pol/a"), 1u);
  fo.only_sources = {"zzz"};
  EXPECT_EQ(ForgetPoints(Env::Default(), p, ForgetPolicy{1, 0, 0, 0}, fo).error().code(), ErrorCode::kNotFound);
}

TEST_F(PolicyRunnerTest, BitmapIncrementalsAndMergeForward) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  const std::string img = dir_ / "vm.qcow2";
  barge::testing::RunOk("qemu-img create -q -f qcow2 " + img + " 8M && qemu-io -f qcow2 -c 'write -P 0x11 0 4M' " +
                        img + " >/dev/null && qemu-img bitmap --add --enable " + img + " cbt0");
  Policy p = Parse("name: inc\nsources:\n  - image: " + img + "\n    bitmap: cbt0\nretention_count: 3\ntargets: [" +
                   (dir_ / "t1") + "]\n");
  RunOptions o = Options();
  o.manual = true;
  const std::string chain = dir_ / "t1/inc/vm";
  std::vector<std::string> types;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) {
      barge::testing::RunOk("qemu-io -f qcow2 -c 'write -P " + std::to_string(0x20 + i) + " " + std::to_string(i) +
                            "M 64k' " + img + " >/dev/null");
    }
    auto r = RunPolicyOnce(Env::Default(), p, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    ASSERT_EQ(r->failed, 0u) << r->sources[0].record.error;
    types.push_back(r->sources[0].record.type);
    EXPECT_TRUE(r->sources[0].record.error.empty()) << r->sources[0].record.error;  // bitmap cleared
    ExpectAllRestorable(chain);
    now_ += std::chrono::minutes(1);
  }
  EXPECT_EQ(types, (std::vector<std::string>{"full", "incremental", "incremental", "incremental", "incremental"}));
  // retention 3: the full was merged forward twice; one chain of 3 points.
  auto c = pipeline::LoadChainFolder(PosixEnv(), chain);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->points.size(), 3u);
  EXPECT_EQ(c->points[0].manifest.type, formats::BackupType::kFull);
  EXPECT_NE(c->points[0].manifest.reason.find("merged"), std::string::npos);
  // The newest point holds what the image holds now.
  auto restored = dir_ / "restored.raw";
  barge::testing::RunOk("qemu-img convert -O raw " + chain + "/" + c->points[2].manifest.image + " " + restored +
                        " && qemu-img compare -q -f raw -F qcow2 " + restored + " " + img);
  barge::testing::RunOk("qemu-img check -q " + img);

  // A lost bitmap means a full, and the bitmap comes back.
  barge::testing::RunOk("qemu-img bitmap --remove " + img + " cbt0");
  auto r = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->sources[0].record.type, "full");
  EXPECT_NE(r->sources[0].record.type_reason.find("bitmap cbt0 missing"), std::string::npos)
      << r->sources[0].record.type_reason;
  EXPECT_NE(barge::testing::RunOk("qemu-img info " + img).find("cbt0"), std::string::npos);
}

// A backend that blocks until cancelled (or fails on demand).
class FakeBackend : public SourceBackend {
 public:
  Result<uint64_t> AllocatedBytes(const PolicySource&) override { return uint64_t{1} << 20; }
  Result<std::string> IncrementalBlocker(const PolicySource&, const std::string&, const std::string&) override {
    return std::string();
  }
  Result<SourceBackupResult> Backup(const SourceBackupRequest& r) override {
    ++started;
    if (r.source->name == "bad") return Error::IoError("injected failure");
    while (!r.copy.cancel->load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return Error::Cancelled("copy cancelled");
  }
  std::atomic<int> started{0};
};

// Issue 18: two sources of one run claim a policy folder that did not
// exist. Each decided on its own whether it had created the folder, before
// claiming it, so a source failing while the other was between its claim
// and its chain folder removed the folder under it. Now the folder goes
// only when its last claimant fails.
class ClaimRaceEnv final : public EnvWrapper {
 public:
  ClaimRaceEnv(Env& target, std::string dir) : EnvWrapper(target), dir_(std::move(dir)) {}
  // The first two looks at the policy folder meet (or the first gives up
  // after half a second: one source looks while it holds the claim), so
  // both sources see it missing when both look before claiming.
  Result<FileStat> Stat(const std::string& path) override {
    auto st = EnvWrapper::Stat(path);
    if (path == dir_) {
      std::unique_lock lock(mu_);
      if (++looks_ <= 2) {
        cv_.notify_all();
        cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return looks_ >= 2; });
      }
    }
    return st;
  }

 private:
  const std::string dir_;
  std::mutex mu_;
  std::condition_variable cv_;
  int looks_ = 0;  // guarded by mu_
};

class ClaimRaceBackend final : public SourceBackend {
 public:
  // Both sources start placing at once (up to 10 s).
  Result<uint64_t> AllocatedBytes(const PolicySource&) override {
    ++placing;
    for (int i = 0; i < 1000 && placing < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return uint64_t{1};
  }
  Result<std::string> IncrementalBlocker(const PolicySource&, const std::string&, const std::string&) override {
    return std::string();
  }
  // "bad" fails once "good" holds its claim; "good" then gives the failure
  // time to remove the folder before it writes its chain folder there.
  Result<SourceBackupResult> Backup(const SourceBackupRequest& r) override {
    if (r.source->name == "bad") {
      while (!good_in) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return Error::IoError("injected failure");
    }
    good_in = true;
    for (int i = 0; i < 100 && PosixEnv().Exists(r.target_dir); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    folder_kept = PosixEnv().Exists(r.target_dir);
    SourceBackupResult out;
    out.type = "full";
    return out;
  }
  std::atomic<int> placing{0};
  std::atomic<bool> good_in{false};
  std::atomic<bool> folder_kept{false};
};

TEST_F(PolicyRunnerTest, FailingSourceKeepsTheFolderAnotherSourceClaimed) {
  Policy p = Parse("name: race\nsources:\n  - nbd: nbd://h/good\n  - nbd: nbd://h/bad\nmax_parallel: 2\ntargets: [" +
                   (dir_ / "t1") + "]\nfree_space_multiple: 0\n");
  p.file = dir_ / "race.yaml";
  ClaimRaceEnv env(Env::Default(), dir_ / "t1/race");
  ClaimRaceBackend backend;
  RunOptions o = Options();
  o.backend = &backend;
  o.manual = true;
  auto r = RunPolicyOnce(env, p, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->failed, 1u);
  EXPECT_TRUE(backend.folder_kept.load());
  EXPECT_TRUE(PosixEnv().Exists(PolicyOwnerPath(dir_ / "t1", "race")));
}

TEST_F(PolicyRunnerTest, MaxRunTimeFailuresAndLock) {
  Policy p = Parse("name: slow\nsources:\n  - nbd: nbd://h/bad\n  - nbd: nbd://h/one\n  - nbd: nbd://h/two\n"
                   "  - nbd: nbd://h/three\nmax_parallel: 2\nmax_run_time: 1s\ntargets: [" + (dir_ / "t1") + "]\n");
  FakeBackend backend;
  RunOptions o = Options();
  o.backend = &backend;
  o.manual = true;

  // A second run of the policy is refused while one holds the lock.
  ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "locks/policies").ok());
  auto held = Env::Default().LockFile(PolicyLockPath(o.catalog_path, "slow"));
  ASSERT_TRUE(held.ok());
  auto busy = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code(), ErrorCode::kBusy);
  held->reset();

  auto t0 = std::chrono::steady_clock::now();
  auto r = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(r->stopped);
  EXPECT_EQ(r->stop_reason, "stopped: max_run_time 1s exceeded");
  EXPECT_EQ(r->ran, 4u);
  EXPECT_EQ(r->failed, 4u);
  EXPECT_EQ(backend.started.load(), 3);  // "bad" failed alone; two ran until stopped; one never started
  for (const auto& s : r->sources) {
    if (s.source == "bad") {
      EXPECT_NE(s.record.error.find("injected failure"), std::string::npos) << s.record.error;
    } else {
      EXPECT_NE(s.record.error.find("stopped: max_run_time 1s exceeded"), std::string::npos) << s.record.error;
    }
  }
  auto catalog = PolicyCatalog::Open(PosixEnv(), o.catalog_path);
  auto stats = (*catalog)->StatsOf("slow", "one");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->runs_by_result["failed"], 1u);
  EXPECT_FALSE(stats->last_success);

  // Hooks need a hook runner.
  p.pre_hook = PolicyHook{"true", std::chrono::seconds(5)};
  EXPECT_EQ(RunPolicyOnce(Env::Default(), p, o).error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(PolicyRunnerTest, NoQualifyingTargetFailsWithTheReason) {
  MakeRaw(dir_ / "a.raw", 1, 3);
  Policy p = Parse("name: full\nsources:\n  - image: " + (dir_ / "a.raw") + "\n    changed_by: full\ntargets: [" + (dir_ / "t1") +
                   ", /nonexistent-barge-target]\nfree_space_multiple: 1000\n");
  RunOptions o = Options();
  o.manual = true;
  // Allocated bytes of a 1 MiB file x 1000 exceed a scratch filesystem only
  // when it has under 1 GiB free: make the need certain with a huge multiple.
  p.free_space_multiple = 1000 * 1000;
  auto r = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->failed, 1u);
  const std::string& e = r->sources[0].record.error;
  EXPECT_NE(e.find("NoSpace"), std::string::npos) << e;
  EXPECT_NE(e.find("no target qualifies"), std::string::npos) << e;
  EXPECT_NE(e.find("/nonexistent-barge-target: "), std::string::npos) << e;
  EXPECT_EQ(Points(dir_ / "t1/full/a"), 0u);
}

// Issue 18: retention runs only after the new point is committed and
// verified. Two points, retention_count 2: a backup stopped by
// max_run_time, one with the source gone, one with no target qualifying,
// and a "successful" backup whose point does not open each leave both
// points; a real backup then keeps the new point and the newest other.
class StallingBackend : public SourceBackend {
 public:
  explicit StallingBackend(SourceBackend& real) : real_(real) {}
  Result<uint64_t> AllocatedBytes(const PolicySource& s) override { return real_.AllocatedBytes(s); }
  Result<std::string> IncrementalBlocker(const PolicySource& s, const std::string& a, const std::string& b) override {
    return real_.IncrementalBlocker(s, a, b);
  }
  Result<SourceBackupResult> Backup(const SourceBackupRequest& r) override {
    if (mode == "stall") {
      while (!r.copy.cancel->load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return Error::Cancelled("copy cancelled");
    }
    if (mode == "bogus") {  // says it made a point it did not
      SourceBackupResult out;
      out.points.push_back({r.target_dir + "/" + r.source->name, "full-20991231T000000Z"});
      out.type = "full";
      return out;
    }
    return real_.Backup(r);
  }
  std::string mode = "real";

 private:
  SourceBackend& real_;
};

TEST_F(PolicyRunnerTest, FailedOrStoppedBackupKeepsEveryPoint) {
  MakeRaw(dir_ / "a.raw", 1, 9);
  Policy p = Parse("name: keep\nsources:\n  - image: " + (dir_ / "a.raw") + "\n    changed_by: full\ntargets: [" + (dir_ / "t1") +
                   "]\nretention_count: 2\nfree_space_multiple: 0\nmax_run_time: 1s\n");
  auto real = NewDefaultSourceBackend(Env::Default());
  StallingBackend backend(*real);
  RunOptions o = Options();
  o.manual = true;
  o.backend = &backend;
  const std::string chain = dir_ / "t1/keep/a";
  auto run = [&](const std::string& mode) {
    backend.mode = mode;
    auto r = RunPolicyOnce(Env::Default(), p, o);
    EXPECT_TRUE(r.ok()) << r.error().ToString();
    now_ += std::chrono::minutes(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    return r.ok() ? r->sources.at(0) : SourceOutcome{};
  };
  for (int i = 0; i < 2; ++i) ASSERT_EQ(run("real").record.result, "success");
  ASSERT_EQ(Points(chain), 2u);

  SourceOutcome stopped = run("stall");
  EXPECT_EQ(stopped.record.result, "failed");
  EXPECT_NE(stopped.record.error.find("max_run_time"), std::string::npos) << stopped.record.error;
  EXPECT_EQ(Points(chain), 2u) << stopped.retention;

  SourceOutcome bogus = run("bogus");
  EXPECT_EQ(bogus.record.result, "failed");
  EXPECT_NE(bogus.record.error.find("does not verify; retention skipped"), std::string::npos) << bogus.record.error;
  EXPECT_EQ(Points(chain), 2u) << bogus.retention;

  ASSERT_EQ(::rename((dir_ / "a.raw").c_str(), (dir_ / "moved.raw").c_str()), 0);
  SourceOutcome gone = run("real");
  EXPECT_EQ(gone.record.result, "failed");
  EXPECT_NE(gone.record.error.find("NotFound"), std::string::npos) << gone.record.error;
  EXPECT_EQ(Points(chain), 2u) << gone.retention;
  ASSERT_EQ(::rename((dir_ / "moved.raw").c_str(), (dir_ / "a.raw").c_str()), 0);

  p.free_space_multiple = 1e12;
  SourceOutcome full = run("real");
  EXPECT_NE(full.record.error.find("NoSpace"), std::string::npos) << full.record.error;
  EXPECT_EQ(Points(chain), 2u) << full.retention;
  p.free_space_multiple = 0;

  auto before = pipeline::LoadChainFolder(PosixEnv(), chain);
  ASSERT_TRUE(before.ok());
  SourceOutcome ok = run("real");
  ASSERT_EQ(ok.record.result, "success") << ok.record.error;
  EXPECT_EQ(ok.retention, "1 point(s) removed");
  auto after = pipeline::LoadChainFolder(PosixEnv(), chain);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->points.size(), 2u);
  EXPECT_EQ(after->points[0].manifest.id, before->points[1].manifest.id);
  EXPECT_EQ(after->points[1].manifest.id, ok.record.points.at(0).id);
}

// A retention removal or merge that committed on disk before the process
// died (or before an error) never marked its records: the next run finds
// the points gone from their folder and marks them removed, while a record
// whose folder is missing (a target not mounted) stays as it was. Found by
// the reliability campaign (policy-run: power loss during the retention
// merge left the folded full backup's record "present").
TEST_F(PolicyRunnerTest, RecordsOfPointsAnInterruptedRetentionRemovedAreMarked) {
  MakeRaw(dir_ / "a.raw", 1, 5);
  Policy p = Parse("name: rec\nsources:\n  - image: " + (dir_ / "a.raw") + "\n    changed_by: full\ntargets: [" + (dir_ / "t1") +
                   "]\nretention_count: 10\nfree_space_multiple: 0\n");
  RunOptions o = Options();
  o.manual = true;
  for (int run = 0; run < 2; ++run) {
    auto r = RunPolicyOnce(Env::Default(), p, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    ASSERT_EQ(r->failed, 0u) << r->sources[0].record.error;
    now_ += std::chrono::minutes(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  }
  auto catalog = PolicyCatalog::Open(PosixEnv(), o.catalog_path);
  ASSERT_TRUE(catalog.ok());
  auto runs = (*catalog)->ListRuns({"rec", "a", 0});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 2u);
  // The oldest point goes as retention removes one (manifest, image,
  // digests), with no record update: the process died there.
  const PointPart gone = runs->back().points.at(0);
  for (const char* ext : {".json", ".qcow2", ".digests"}) {
    Status s = PosixEnv().Unlink(gone.chain_dir + "/" + gone.id + ext);
    ASSERT_TRUE(s.ok() || s.error().code() == ErrorCode::kNotFound) << s.error().ToString();
  }
  auto r = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->failed, 0u) << r->sources[0].record.error;
  runs = (*catalog)->ListRuns({"rec", "a", 0});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ(runs->back().point_state, "removed");
  EXPECT_EQ((*runs)[1].point_state, "present");
  EXPECT_EQ(runs->front().point_state, "present");

  // A folder that is not there (the target unmounted) proves nothing.
  ASSERT_EQ(::rename((dir_ / "t1").c_str(), (dir_ / "t1-away").c_str()), 0);
  ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "t1").ok());
  auto away = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(away.ok()) << away.error().ToString();
  runs = (*catalog)->ListRuns({"rec", "a", 0});
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 4u);
  EXPECT_EQ((*runs)[1].point_state, "present");
  EXPECT_EQ((*runs)[2].point_state, "present");
}

}  // namespace
}  // namespace barge::orchestrate

namespace barge::orchestrate {
namespace {

// Sharded runs (issue 21): each shard runs its own sources only, under its
// own lock (a run of shard 0 does not keep shard 1 out; a second run of
// shard 0 is refused), and its records say which shard made them.
TEST_F(PolicyRunnerTest, ShardsRunTheirSourcesUnderTheirOwnLocks) {
  std::string yaml = "name: fleet\nsources:\n";
  for (int i = 0; i < 8; ++i) yaml += "  - nbd: nbd://h/s" + std::to_string(i) + "\n    name: s" + std::to_string(i) + "\n";
  Policy p = Parse(yaml + "targets: [" + (dir_ / "t1") + "]\n");
  FakeBackend backend;
  RunOptions o = Options();
  o.backend = &backend;
  o.manual = true;
  o.only_sources = {"bad"};  // not in the policy: nothing runs (FakeBackend would wait for a cancel)

  ASSERT_TRUE(Env::Default().CreateDirs(dir_ / "locks/policies").ok());
  auto held = Env::Default().LockFile(PolicyLockPath(o.catalog_path, "fleet", 0));
  ASSERT_TRUE(held.ok());
  o.shard = {0, 2};
  auto busy = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code(), ErrorCode::kBusy);
  EXPECT_NE(busy.error().message().find("shard 0 of policy fleet"), std::string::npos) << busy.error().message();
  // Shard 1 and an unsharded run are not held back by shard 0's lock.
  o.shard = {1, 2};
  auto other = RunPolicyOnce(Env::Default(), p, o);
  ASSERT_TRUE(other.ok()) << other.error().ToString();
  EXPECT_EQ(other->shard, (ShardSpec{1, 2}));
  EXPECT_EQ(other->sources.size(), 0u);
  held->reset();

  // Which sources each shard considers: its own, every source once.
  o.only_sources.clear();
  o.manual = false;  // nothing is due without a schedule or reason: no backup starts
  size_t seen = 0;
  for (uint32_t i = 0; i < 2; ++i) {
    o.shard = {i, 2};
    auto r = RunPolicyOnce(Env::Default(), p, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    for (const auto& s : r->sources) {
      EXPECT_EQ(ShardOfSource(s.source, 2), i) << s.source;
      ++seen;
    }
  }
  EXPECT_EQ(seen, 8u);
  EXPECT_EQ(backend.started.load(), 0);
}

}  // namespace
}  // namespace barge::orchestrate
