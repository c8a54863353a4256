// backup inside its hooks (orchestrate/vm/hooked_backup.h): the hook
// environment and the one post-hook rule (issue 19): a failing post-hook
// after a good backup is a warning and the point is kept; after a failed
// backup it joins the error; a failing pre-hook backs up nothing.
#include "orchestrate/vm/hooked_backup.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

namespace fs = std::filesystem;

pipeline::BackupRequest Request(const testing::TempDir& tmp) {
  const std::string raw = tmp / "disk.raw";
  if (!fs::exists(raw)) testing::WriteFile(raw, testing::RandomBytes(1 << 20, 19));
  pipeline::BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = tmp / "target";
  req.disk_name = "vda";
  req.copy.memory_bytes = 8 << 20;
  req.copy.threads = 2;
  return req;
}

size_t Images(const std::string& folder) {
  size_t n = 0;
  if (!fs::exists(folder)) return 0;
  for (const auto& e : fs::directory_iterator(folder)) n += e.path().extension() == ".qcow2" ? 1 : 0;
  return n;
}

TEST(HookedBackupTest, EnvironmentAndAFailingPostHookIsAWarningThePointKept) {
  testing::TempDir tmp;
  const std::string log = tmp / "hooks.log";
  HookSpec hooks;
  hooks.pre = "echo \"$BARGE_HOOK_PHASE $BARGE_OPERATION $BARGE_DISK $BARGE_IMAGE\" >> " + log;
  hooks.post = "echo \"$BARGE_HOOK_PHASE $BARGE_HOOK_STATUS\" >> " + log + "; echo cannot resume >&2; exit 6";
  pipeline::BackupRequest req = Request(tmp);
  HookedResult hooked;
  auto r = RunBackupWithHooks(PosixEnv(), req, hooks, hooked);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(hooked.warnings.size(), 1u);
  EXPECT_NE(hooked.warnings[0].find("post-hook"), std::string::npos) << hooked.warnings[0];
  EXPECT_NE(hooked.warnings[0].find("exited with 6: cannot resume"), std::string::npos) << hooked.warnings[0];
  EXPECT_EQ(hooked.runs.size(), 2u);
  EXPECT_TRUE(fs::exists(r->manifest_path));
  EXPECT_EQ(Images(req.target_dir + "/vda"), 1u);
  EXPECT_EQ(*Env::Default().ReadFile(log), "pre backup vda " + req.source.location + "\npost ok\n");
}

TEST(HookedBackupTest, FailingPreHookBacksUpNothing) {
  testing::TempDir tmp;
  const std::string log = tmp / "hooks.log";
  HookSpec hooks;
  hooks.pre = "exit 5";
  hooks.post = "echo \"$BARGE_HOOK_STATUS\" >> " + log + "; exit 1";
  pipeline::BackupRequest req = Request(tmp);
  HookedResult hooked;
  auto r = RunBackupWithHooks(PosixEnv(), req, hooks, hooked);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCancelled);
  EXPECT_NE(r.error().message().find("pre-hook"), std::string::npos) << r.error().message();
  // The post-hook's own failure is added to the error, not a warning.
  EXPECT_NE(r.error().message().find("post-hook"), std::string::npos) << r.error().message();
  EXPECT_TRUE(hooked.warnings.empty());
  EXPECT_EQ(Images(req.target_dir + "/vda"), 0u);
  EXPECT_EQ(*Env::Default().ReadFile(log), "aborted\n");
}

TEST(HookedBackupTest, FailedBackupKeepsItsErrorAndAddsThePostHooks) {
  testing::TempDir tmp;
  HookSpec hooks;
  hooks.post = "exit 3";
  pipeline::BackupRequest req = Request(tmp);
  req.source.location = tmp / "missing.raw";
  HookedResult hooked;
  auto plain = pipeline::RunBackup(PosixEnv(), req);
  ASSERT_FALSE(plain.ok());
  auto r = RunBackupWithHooks(PosixEnv(), req, hooks, hooked);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), plain.error().code()) << r.error().ToString();
  EXPECT_NE(r.error().message().find(plain.error().message()), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("exited with 3"), std::string::npos) << r.error().message();
  EXPECT_TRUE(hooked.warnings.empty());
}

TEST(PostHookRuleTest, OneRule) {
  std::vector<std::string> warnings;
  EXPECT_TRUE(ApplyPostHookRule(OkStatus(), OkStatus(), warnings).ok());
  EXPECT_TRUE(warnings.empty());
  EXPECT_TRUE(ApplyPostHookRule(OkStatus(), Error::IoError("post-hook 'x' exited with 1"), warnings).ok());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "post-hook 'x' exited with 1");
  Status failed = ApplyPostHookRule(Error::NoSpace("full"), Error::IoError("post-hook 'x' exited with 1"), warnings);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(failed.error().message().find("exited with 1"), std::string::npos);
  EXPECT_EQ(warnings.size(), 1u);
}

}  // namespace
}  // namespace barge::orchestrate
