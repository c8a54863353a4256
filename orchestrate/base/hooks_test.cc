// Hook runner: environment and phases, captured output, exit codes,
// timeouts that stop the whole process group, and the pre/body/post rules.
#include "orchestrate/base/hooks.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "blockio/env.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

using namespace std::chrono_literals;

std::string Slurp(const std::string& path) {
  auto text = Env::Default().ReadFile(path);
  return text.ok() ? *text : "";
}

TEST(Hooks, EnvironmentOutputAndExitCode) {
  auto run = RunHookCommand("pre", "echo \"$BARGE_DISK/$BARGE_SNAPSHOT\"; echo oops >&2; exit 3",
                            {{"BARGE_DISK", "vda"}, {"BARGE_SNAPSHOT", "s1"}}, 10s);
  ASSERT_TRUE(run.ok()) << run.error().ToString();
  EXPECT_EQ(run->exit_code, 3);
  EXPECT_FALSE(run->ok());
  EXPECT_NE(run->output.find("vda/s1"), std::string::npos);
  EXPECT_NE(run->output.find("oops"), std::string::npos);
  EXPECT_EQ(run->Describe(), "pre-hook 'echo \"$BARGE_DISK/$BARGE_SNAPSHOT\"; echo oops >&2; exit 3' exited with 3: oops");
}

TEST(Hooks, TimeoutStopsTheWholeGroup) {
  testing::TempDir dir;
  const std::string marker = dir / "late";
  const auto start = std::chrono::steady_clock::now();
  auto run = RunHookCommand("pre", "(sleep 1; touch " + marker + ") & sleep 30", {}, 300ms);
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(run->timed_out);
  EXPECT_FALSE(run->ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_NE(run->Describe().find("timed out"), std::string::npos);
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(Env::Default().Exists(marker)) << "a child of the hook outlived the timeout";
}

// barge killed by SIGKILL (a scheduler ending a task, the OOM killer) left
// its hook and everything the hook started running. A forked child stands
// in for barge: it runs a hook and is killed mid-hook.
TEST(Hooks, KilledBargeTakesItsHookWithIt) {
  testing::TempDir dir;
  const std::string started = dir / "started", marker = dir / "late";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    (void)RunHookCommand("pre", "(sleep 2; touch " + marker + ") & touch " + started + "; sleep 30", {}, 60s);
    ::_exit(0);
  }
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!Env::Default().Exists(started) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(Env::Default().Exists(started)) << "the hook did not start";
  ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::this_thread::sleep_for(3s);
  EXPECT_FALSE(Env::Default().Exists(marker)) << "a child of the hook outlived a killed barge";
}

// A policy run's stop (max_run_time, SIGTERM) reaches a hook in progress:
// the cancel flag stops its whole group as the timeout does.
TEST(Hooks, CancelStopsTheWholeGroup) {
  testing::TempDir dir;
  const std::string marker = dir / "late";
  std::atomic<bool> cancel{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(200ms);
    cancel = true;
  });
  const auto start = std::chrono::steady_clock::now();
  auto run = RunHookCommand("pre", "(sleep 1; touch " + marker + ") & sleep 30", {}, 60s, &cancel);
  stopper.join();
  ASSERT_TRUE(run.ok());
  EXPECT_TRUE(run->cancelled);
  EXPECT_FALSE(run->timed_out);
  EXPECT_FALSE(run->ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_NE(run->Describe().find("cancelled"), std::string::npos);
  std::this_thread::sleep_for(1500ms);
  EXPECT_FALSE(Env::Default().Exists(marker)) << "a child of the hook outlived the cancel";
}

TEST(Hooks, PreFailureAbortsAndPostStillRuns) {
  testing::TempDir dir;
  const std::string log = dir / "log";
  HookSpec hooks;
  hooks.pre = "echo pre:$BARGE_HOOK_PHASE >> " + log + "; exit 1";
  hooks.post = "echo post:$BARGE_HOOK_PHASE:$BARGE_HOOK_STATUS >> " + log;
  bool called = false;
  HookedResult result;
  Status s = RunWithHooks(hooks, {}, [&] {
    called = true;
    return OkStatus();
  }, &result);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCancelled);
  EXPECT_NE(s.error().message().find("pre-hook"), std::string::npos);
  EXPECT_FALSE(called);
  EXPECT_EQ(Slurp(log), "pre:pre\npost:post:aborted\n");
  EXPECT_EQ(result.runs.size(), 2u);
}

// `barge backup --pre-hook` stopped by SIGTERM waited for the pre-hook
// (about 30 s, until the forced exit): the job's stop reaches the pre-hook
// through HookSpec::cancel; the post-hook still runs (it may thaw).
TEST(Hooks, TheJobsStopEndsThePreHookAndThePostHookStillRuns) {
  testing::TempDir dir;
  const std::string log = dir / "log";
  std::atomic<bool> cancel{false};
  HookSpec hooks;
  hooks.pre = "echo pre >> " + log + "; sleep 30";
  hooks.post = "echo post:$BARGE_HOOK_STATUS >> " + log;
  hooks.cancel = &cancel;
  std::thread stopper([&] {
    std::this_thread::sleep_for(300ms);
    cancel = true;
  });
  bool called = false;
  const auto start = std::chrono::steady_clock::now();
  Status s = RunWithHooks(hooks, {}, [&] {
    called = true;
    return OkStatus();
  });
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCancelled);
  EXPECT_NE(s.error().message().find("cancelled"), std::string::npos) << s.error().message();
  EXPECT_FALSE(called);
  EXPECT_EQ(Slurp(log), "pre\npost:aborted\n");
}

TEST(Hooks, PostRunsAfterAFailedBodyAndItsFailureIsAWarningAfterAGoodOne) {
  testing::TempDir dir;
  const std::string log = dir / "log";
  HookSpec hooks;
  hooks.post = "echo \"$BARGE_HOOK_STATUS $BARGE_HOOK_ERROR\" >> " + log + "; exit 4";
  Status failed = RunWithHooks(hooks, {}, [] { return Status(Error::NoSpace("full")); });
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(failed.error().message().find("post-hook"), std::string::npos);
  HookedResult result;
  Status ok = RunWithHooks(hooks, {}, [] { return OkStatus(); }, &result);
  ASSERT_TRUE(ok.ok());
  ASSERT_EQ(result.warnings.size(), 1u);
  EXPECT_NE(result.warnings[0].find("exited with 4"), std::string::npos);
  EXPECT_EQ(Slurp(log), "failed NoSpace: full\nok \n");
}

TEST(Hooks, NoHooksJustRunsTheBody) {
  int calls = 0;
  ASSERT_TRUE(RunWithHooks({}, {}, [&] {
                ++calls;
                return OkStatus();
              }).ok());
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace barge::orchestrate
