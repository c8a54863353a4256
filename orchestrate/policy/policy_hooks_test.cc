// Policy hooks: the command runner (environment, exit status, output in the
// error, timeout stopping the whole process group, cancel) and what the
// policy runner does with it (a failing pre hook skips the backup and is
// recorded; the post hook runs in every case).
#include "orchestrate/policy/policy_hooks.h"

#include <gtest/gtest.h>

#include <thread>

#include "orchestrate/schedule/time_text.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using barge::testing::TempDir;

HookContext Context(const std::string& phase) {
  HookContext c;
  c.policy = "nightly";
  c.source = "vm1";
  c.phase = phase;
  c.target = "/backups/a";
  if (phase == "post") c.result = "success";
  return c;
}

TEST(PolicyHooksTest, EnvironmentAndExitStatus) {
  TempDir dir;
  auto runner = NewPolicyHookRunner();
  const std::string out = dir / "env.txt";
  PolicyHook hook{"echo \"$BARGE_POLICY $BARGE_SOURCE $BARGE_TARGET $BARGE_HOOK_PHASE ${BARGE_HOOK_STATUS-none}\" > " +
                      out,
                  std::chrono::seconds(10)};
  ASSERT_TRUE(runner->Run(hook, Context("pre"), nullptr).ok());
  EXPECT_EQ(*Env::Default().ReadFile(out), "nightly vm1 /backups/a pre none\n");
  HookContext post = Context("post");
  post.result = "failed";
  post.error = "IoError: boom";
  hook.command = "echo \"$BARGE_HOOK_PHASE $BARGE_HOOK_STATUS $BARGE_HOOK_ERROR\" > " + out;
  ASSERT_TRUE(runner->Run(hook, post, nullptr).ok());
  EXPECT_EQ(*Env::Default().ReadFile(out), "post failed IoError: boom\n");

  auto failed = runner->Run({"echo first; echo 'disk busy' >&2; exit 3", std::chrono::seconds(10)}, Context("pre"),
                            nullptr);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), ErrorCode::kIoError);
  EXPECT_NE(failed.error().message().find("pre-hook 'echo first"), std::string::npos) << failed.error().message();
  EXPECT_NE(failed.error().message().find("exited with 3: disk busy"), std::string::npos) << failed.error().message();
}

TEST(PolicyHooksTest, TimeoutStopsTheProcessGroup) {
  TempDir dir;
  auto runner = NewPolicyHookRunner();
  const std::string pid_file = dir / "child.pid";
  // A child of the hook's shell that would outlive it: the whole group goes.
  const auto t0 = std::chrono::steady_clock::now();
  auto r = runner->Run({"sleep 60 & echo $! > " + pid_file + "; wait", std::chrono::seconds(1)}, Context("pre"),
                       nullptr);
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("timed out after"), std::string::npos) << r.error().message();
  EXPECT_LT(took, std::chrono::seconds(8));
  auto pid = Env::Default().ReadFile(pid_file);
  ASSERT_TRUE(pid.ok());
  // The sleep is gone (or a zombie of init's about to be reaped).
  for (int i = 0; i < 50; ++i) {
    auto st = barge::testing::Run("ps -o stat= -p " + *pid);
    if (st.exit_code != 0 || st.output.find('Z') != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  auto st = barge::testing::Run("ps -o stat= -p " + *pid);
  EXPECT_TRUE(st.exit_code != 0 || st.output.find('Z') != std::string::npos) << st.output;
}

// A backend that records what it was asked and succeeds.
class CountingBackend : public SourceBackend {
 public:
  Result<uint64_t> AllocatedBytes(const PolicySource&) override { return uint64_t{1}; }
  Result<std::string> IncrementalBlocker(const PolicySource&, const std::string&, const std::string&) override {
    return std::string();
  }
  Result<SourceBackupResult> Backup(const SourceBackupRequest&) override {
    ++backups;
    SourceBackupResult out;
    out.type = "full";
    return out;
  }
  std::atomic<int> backups{0};
};

TEST(PolicyHooksTest, FailingPreHookSkipsTheBackupAndPostHookStillRuns) {
  TempDir dir;
  ASSERT_TRUE(Env::Default().CreateDirs(dir / "t").ok());
  const std::string log = dir / "hooks.log";
  auto p = ParsePolicy(Env::Default(), "name: hooked\nsources:\n  - nbd: nbd://h/good\n  - nbd: nbd://h/bad\ntargets: [" + (dir / "t") +
                       "]\npre_hook: 'echo pre $BARGE_SOURCE >> " + log +
                       "; test $BARGE_SOURCE != bad || { echo cannot freeze >&2; exit 5; }'\n"
                       "post_hook: {command: 'echo post $BARGE_SOURCE $BARGE_HOOK_STATUS >> " + log +
                       "', timeout: 10s}\n");
  ASSERT_TRUE(p.ok()) << p.error().message();
  CountingBackend backend;
  auto hooks = NewPolicyHookRunner();
  RunOptions o;
  o.catalog_path = dir / "catalog.db";
  o.backend = &backend;
  o.hooks = hooks.get();
  o.manual = true;
  auto r = RunPolicyOnce(Env::Default(), *p, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(backend.backups.load(), 1);
  EXPECT_EQ(r->failed, 1u);
  for (const auto& s : r->sources) {
    if (s.source == "bad") {
      EXPECT_EQ(s.record.result, "failed");
      EXPECT_NE(s.record.error.find("pre_hook (backup skipped)"), std::string::npos) << s.record.error;
      EXPECT_NE(s.record.error.find("exited with 5: cannot freeze"), std::string::npos) << s.record.error;
    } else {
      EXPECT_EQ(s.record.result, "success") << s.record.error;
    }
  }
  std::string text = *Env::Default().ReadFile(log);
  EXPECT_NE(text.find("pre good\n"), std::string::npos) << text;
  EXPECT_NE(text.find("post good ok\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pre bad\n"), std::string::npos) << text;
  EXPECT_NE(text.find("post bad aborted\n"), std::string::npos) << text;
}

// Issue 19, the one rule for a failing post hook: after a good backup it is
// a warning on a successful record (the point kept), as for backup, vm
// backup and snapshots; before, it failed the record.
TEST(PolicyHooksTest, FailingPostHookAfterAGoodBackupIsAWarning) {
  TempDir dir;
  ASSERT_TRUE(Env::Default().CreateDirs(dir / "t").ok());
  auto p = ParsePolicy(Env::Default(), "name: hooked\nsources:\n  - nbd: nbd://h/good\ntargets: [" + (dir / "t") +
                                           "]\npost_hook: 'echo cannot thaw >&2; exit 4'\n");
  ASSERT_TRUE(p.ok()) << p.error().message();
  CountingBackend backend;
  auto hooks = NewPolicyHookRunner();
  RunOptions o;
  o.catalog_path = dir / "catalog.db";
  o.backend = &backend;
  o.hooks = hooks.get();
  o.manual = true;
  auto r = RunPolicyOnce(Env::Default(), *p, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(backend.backups.load(), 1);
  EXPECT_EQ(r->failed, 0u);
  ASSERT_EQ(r->sources.size(), 1u);
  EXPECT_EQ(r->sources[0].record.result, "success") << r->sources[0].record.error;
  EXPECT_NE(r->sources[0].record.error.find("post_hook"), std::string::npos) << r->sources[0].record.error;
  EXPECT_NE(r->sources[0].record.error.find("exited with 4: cannot thaw"), std::string::npos)
      << r->sources[0].record.error;
}

}  // namespace
}  // namespace barge::orchestrate
