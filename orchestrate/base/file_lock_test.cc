// TryLockFile: exclusive while held, free again once released; ProcessOwner:
// encoding, and which owners count as gone (dead, zombie, reused pid,
// rebooted) and which do not (alive, another host).
#include "orchestrate/base/file_lock.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/policy/policy_runner.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

// The one lock-name scheme: <catalog folder>/locks/<kind>/<escaped>.lock.
TEST(CatalogLockPathTest, OneSchemeForEveryKind) {
  EXPECT_EQ(CatalogLockPath("/c/state.db", LockKind::kDomain, "web1"), "/c/locks/domains/web1.lock");
  EXPECT_EQ(CatalogLockPath("/c/state.db", LockKind::kImage, "base"), "/c/locks/images/base.lock");
  EXPECT_EQ(CatalogLockPath("/c/state.db", LockKind::kPolicy, "nightly"), "/c/locks/policies/nightly.lock");
  EXPECT_EQ(CatalogLockPath("/c/state.db", LockKind::kSnapshotApply, "00ff"), "/c/locks/snapshot-apply/00ff.lock");
  // A domain named like another kind's old file name no longer meets it.
  EXPECT_NE(CatalogLockPath("/c/state.db", LockKind::kDomain, "policy-x"),
            CatalogLockPath("/c/state.db", LockKind::kPolicy, "x"));
  // The named shortcuts go through it.
  EXPECT_EQ(DomainLockPath("/c/state.db", "a/b"), "/c/locks/domains/a%2Fb.lock");
  EXPECT_EQ(PolicyLockPath("/c/state.db", "p"), "/c/locks/policies/p.lock");
}

TEST(CatalogLockPathTest, EscapesTheSameWay) {
  EXPECT_EQ(EscapeLockName("web-1.prod_x+y:z@h=v,w"), "web-1.prod_x+y:z@h=v,w");
  EXPECT_EQ(EscapeLockName("a/b"), "a%2Fb");
  EXPECT_EQ(EscapeLockName("a b%"), "a%20b%25");
  EXPECT_EQ(EscapeLockName(".."), "%2E.");
  EXPECT_EQ(EscapeLockName(".hidden"), "%2Ehidden");
  EXPECT_EQ(EscapeLockName(""), "%");
  EXPECT_EQ(EscapeLockName("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(EscapeLockName(std::string("a\0b", 3)), "a%00b");
  // Distinct names, distinct files: '%' itself is escaped.
  EXPECT_NE(EscapeLockName("a%2Fb"), EscapeLockName("a/b"));
}

TEST(TryLockFileTest, ExclusiveUntilReleased) {
  barge::testing::TempDir dir;
  std::string path = dir / "locks/sub/x.lock";
  auto first = TryLockFile(PosixEnv(), path, "x is busy");
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  EXPECT_EQ((*first)->path(), path);

  // A second open file description conflicts, even in the same process.
  auto second = TryLockFile(PosixEnv(), path, "x is busy");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy);
  EXPECT_TRUE(second.error().retryable());
  EXPECT_EQ(second.error().message(), "x is busy");
  EXPECT_EQ(second.error().path(), path);

  // Another file is independent.
  EXPECT_TRUE(TryLockFile(PosixEnv(), dir / "locks/sub/y.lock", "y is busy").ok());

  first->reset();
  EXPECT_TRUE(TryLockFile(PosixEnv(), path, "x is busy").ok());
}

TEST(TryLockFileTest, DiesWithItsProcess) {
  barge::testing::TempDir dir;
  std::string path = dir / "x.lock";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    auto lock = TryLockFile(PosixEnv(), path, "busy");
    char c = lock.ok() ? 1 : 0;
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1);
  EXPECT_FALSE(TryLockFile(PosixEnv(), path, "busy").ok());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(TryLockFile(PosixEnv(), path, "busy").ok());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(ProcessOwnerTest, EncodeParse) {
  ProcessOwner self = ProcessOwner::Self(PosixEnv());
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_GT(self.start_ticks, 0u);
  std::string text = self.Encode();
  EXPECT_EQ(text.rfind("pid=" + std::to_string(::getpid()) + " start=", 0), 0u) << text;
  auto parsed = ProcessOwner::Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  EXPECT_EQ(parsed->pid, self.pid);
  EXPECT_EQ(parsed->start_ticks, self.start_ticks);
  EXPECT_EQ(parsed->boot_id, self.boot_id);
  EXPECT_EQ(parsed->host, self.host);
  for (const char* bad : {"", "pid=1", "pid=x start=1 boot=b host=h", "pid=0 start=1 boot=b host=h",
                          "pid=1 start=1 boot= host=h", "garbage"}) {
    EXPECT_FALSE(ProcessOwner::Parse(bad).ok()) << bad;
  }
}

TEST(ProcessOwnerTest, WhichOwnersAreGone) {
  ProcessOwner self = ProcessOwner::Self(PosixEnv());
  EXPECT_FALSE(OwnerIsGone(PosixEnv(), self.Encode()));
  // Nothing a live barge writes: older versions stored no owner.
  EXPECT_TRUE(OwnerIsGone(PosixEnv(), ""));
  EXPECT_TRUE(OwnerIsGone(PosixEnv(), "not an owner"));

  ProcessOwner reused = self;  // our pid, another start time
  reused.start_ticks += 1;
  EXPECT_TRUE(OwnerIsGone(PosixEnv(), reused.Encode()));
  ProcessOwner rebooted = self;
  rebooted.boot_id = "00000000-0000-0000-0000-000000000000";
  EXPECT_TRUE(OwnerIsGone(PosixEnv(), rebooted.Encode()));
  // Another machine: this one cannot tell, so never "gone".
  ProcessOwner remote = reused;
  remote.host = self.host + "-elsewhere";
  EXPECT_FALSE(OwnerIsGone(PosixEnv(), remote.Encode()));

  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  auto owner = ProcessOwner::Of(PosixEnv(), child);
  ASSERT_TRUE(owner.ok()) << owner.error().ToString();
  EXPECT_FALSE(OwnerIsGone(PosixEnv(), owner->Encode()));
  ::kill(child, SIGKILL);
  // Killed but not reaped yet: a zombie is gone too.
  for (int i = 0; i < 1000 && !OwnerIsGone(PosixEnv(), owner->Encode()); ++i) ::usleep(1000);
  EXPECT_TRUE(OwnerIsGone(PosixEnv(), owner->Encode()));
  ::waitpid(child, nullptr, 0);
  EXPECT_TRUE(OwnerIsGone(PosixEnv(), owner->Encode()));
  EXPECT_FALSE(ProcessOwner::Of(PosixEnv(), child).ok());
}

}  // namespace
}  // namespace barge::orchestrate
