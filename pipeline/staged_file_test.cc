// StagedFile: the temporary is locked while written (a sweep keeps it) and
// registered; commit publishes with link (never replacing a file that
// appeared meanwhile) or rename; abandon and failures remove the temporary.
#include "pipeline/staged_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "blockio/fault_env.h"
#include "tests/testing/env_wrappers.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(StagedFileTest, CommitPublishesAndSweepsKeepALiveWriter) {
  TempDir dir;
  Env& env = PosixEnv();
  const std::string out = dir / "out.raw";
  auto staged = StagedFile::Create(env, out);
  ASSERT_TRUE(staged.ok()) << staged.error().ToString();
  EXPECT_EQ((*staged)->temp_path(), TempPathFor(out));
  ASSERT_TRUE((*staged)->sink().WriteAt(0, Bytes("data")).ok());
  // A live writer's temporary survives a sweep, and a second writer is busy.
  auto swept = SweepStaleTemporaries(env, dir.path().string());
  ASSERT_TRUE(swept.ok());
  EXPECT_TRUE(swept->empty());
  EXPECT_EQ(StagedFile::Create(env, out).error().code(), ErrorCode::kBusy);
  EXPECT_FALSE(env.Exists(out));
  ASSERT_TRUE((*staged)->Commit().ok());
  EXPECT_EQ(*env.ReadFile(out), "data");
  EXPECT_FALSE(env.Exists(TempPathFor(out)));
  EXPECT_EQ(StagedFile::Create(env, out).error().code(), ErrorCode::kInvalidArgument);  // exists
}

TEST(StagedFileTest, LinkNeverReplacesAFileThatAppeared) {
  TempDir dir;
  Env& env = PosixEnv();
  const std::string out = dir / "out.raw";
  auto staged = StagedFile::Create(env, out);
  ASSERT_TRUE(staged.ok());
  {
    // Another writer creates the final name meanwhile (not WriteFileAtomic:
    // it uses the same temporary name, ours, and would be refused Busy).
    auto theirs = env.OpenSink(out, SinkMode::kCreateNew);
    ASSERT_TRUE(theirs.ok());
    ASSERT_TRUE((*theirs)->WriteAt(0, Bytes("theirs")).ok());
  }
  Status s = (*staged)->Commit();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().errno_value(), EEXIST);
  EXPECT_EQ(*env.ReadFile(out), "theirs");
  EXPECT_FALSE(env.Exists(TempPathFor(out)));

  auto replacing = StagedFile::Create(env, out, /*overwrite=*/true);
  ASSERT_TRUE(replacing.ok());
  ASSERT_TRUE((*replacing)->sink().WriteAt(0, Bytes("ours")).ok());
  ASSERT_TRUE((*replacing)->Commit().ok());
  EXPECT_EQ(*env.ReadFile(out), "ours");
}

TEST(StagedFileTest, AbandonAndDestructorRemoveTheTemporary) {
  TempDir dir;
  Env& env = PosixEnv();
  {
    auto staged = StagedFile::Create(env, dir / "a");
    ASSERT_TRUE(staged.ok());
    EXPECT_TRUE(env.Exists(TempPathFor(dir / "a")));
    EXPECT_TRUE((*staged)->Abandon().ok());
    EXPECT_FALSE(env.Exists(TempPathFor(dir / "a")));
    EXPECT_TRUE((*staged)->Abandon().ok());  // twice: nothing left to do
    EXPECT_EQ((*staged)->Commit().error().code(), ErrorCode::kInvalidArgument);
  }
  {
    auto staged = StagedFile::Create(env, dir / "b");
    ASSERT_TRUE(staged.ok());
  }
  EXPECT_FALSE(env.Exists(TempPathFor(dir / "b")));
  EXPECT_FALSE(env.Exists(dir / "b"));
}

// A failed flush leaves no temporary; a failed folder sync comes after the
// publish and leaves the file (the caller decides).
TEST(StagedFileTest, FailuresGoThroughTheEnv) {
  TempDir dir;
  testing::FaultFilesEnv env(PosixEnv(), [](const std::string&, FaultInjector& faults) {
    faults.AddRule(FaultRule::Always(FaultOp::kFlush, EIO));
  });
  auto staged = StagedFile::Create(env, dir / "c");
  ASSERT_TRUE(staged.ok());
  Status s = (*staged)->Commit();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIoError);
  EXPECT_FALSE(PosixEnv().Exists(dir / "c"));
  EXPECT_FALSE(PosixEnv().Exists(TempPathFor(dir / "c")));

  testing::StopEnv stop(PosixEnv());
  stop.StopAfter(1, [](EnvOp op, const std::string&) { return op == EnvOp::kSyncDir; });
  auto published = StagedFile::Create(stop, dir / "d");
  ASSERT_TRUE(published.ok());
  EXPECT_FALSE((*published)->Commit().ok());
  EXPECT_TRUE(stop.stopped());
  EXPECT_TRUE(PosixEnv().Exists(dir / "d"));
}

TEST(StagedFileTest, SecondWriterOfALiveTemporaryIsBusyAndRemovesNothing) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  auto first = StagedFile::Create(Env::Default(), out, true);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  ASSERT_TRUE((*first)->sink().WriteAt(0, Bytes("first")).ok());
  auto second = StagedFile::Create(Env::Default(), out, true);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy) << second.error().ToString();
  EXPECT_EQ(second.error().path(), out);
  // The live writer's temporary is intact and commits.
  ASSERT_TRUE((*first)->Commit().ok());
  EXPECT_EQ(*Env::Default().ReadFile(out), "first");
}

TEST(StagedFileTest, KilledRunsLeftoverIsTakenOverAndSwept) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  testing::WriteFile(TempPathFor(out), testing::RandomBytes(8192, 1));  // nobody holds it
  auto writer = StagedFile::Create(Env::Default(), out, true);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  ASSERT_TRUE((*writer)->sink().WriteAt(0, Bytes("new")).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(*Env::Default().ReadFile(out), "new");  // truncated, not appended to

  testing::WriteFile(TempPathFor(dir / "other.raw"), testing::RandomBytes(4096, 2));
  auto swept = SweepStaleTemporaries(Env::Default(), dir.path().string());
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(*swept, std::vector<std::string>{".other.raw.barge-tmp"});
}

// In a shared folder, another user's file planted under the temporary's
// name was taken over as a killed run's leftover: barge wrote the output
// into a file that user owns (and may read), then published it.
TEST(StagedFileTest, AnotherUsersFileAtTheTemporaryNameIsNeverWrittenThrough) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  TempDir dir;
  const std::string out = dir / "out.raw";
  const std::string temp = TempPathFor(out);
  testing::WriteFile(temp, testing::RandomBytes(4096, 7));
  ASSERT_EQ(::chown(temp.c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(temp.c_str(), 0666), 0);
  auto writer = StagedFile::Create(Env::Default(), out, true);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  ASSERT_TRUE((*writer)->sink().WriteAt(0, Bytes("ours")).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  struct stat st {};
  ASSERT_EQ(::stat(out.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, ::geteuid()) << "the output is the planted file";
  EXPECT_EQ(*Env::Default().ReadFile(out), "ours");
}

TEST(StagedFileTest, ForcedExitRemovesTheTemporary) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  auto writer = StagedFile::Create(Env::Default(), out, true);
  ASSERT_TRUE(writer.ok());
  EXPECT_GE(RemoveRegisteredTemporaries(), 1u);
  EXPECT_FALSE(fs::exists(TempPathFor(out)));
}

TEST(StagedFileTest, SymlinkAtTheTemporaryNameIsNotWrittenThrough) {
  TempDir dir;
  const std::string victim = dir / "victim";
  testing::WriteFile(victim, testing::RandomBytes(4096, 3));
  const std::string out = dir / "out.raw";
  fs::create_symlink(victim, TempPathFor(out));
  auto writer = StagedFile::Create(Env::Default(), out, true);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(fs::file_size(victim), 4096u);
}

// Issue 13 (found by the reliability campaign): errors of a staged output
// named its hidden temporary (".0001-...qcow2.barge-tmp"), a name the user
// never gave. Every failure, from the open to the publish, names the output.
TEST(StagedFileTest, Issue13ErrorsNameTheOutputNotTheTemporary) {
  TempDir dir;
  FaultEnv env(PosixEnv(), dir / "stash");
  for (bool overwrite : {false, true}) {
    for (EnvOp op : {EnvOp::kOpen, EnvOp::kWrite, EnvOp::kSync, EnvOp::kLink, EnvOp::kRename, EnvOp::kUnlink}) {
      for (int err : {EIO, ENOSPC}) {
        SCOPED_TRACE(std::string(EnvOpName(op)) + (overwrite ? " overwrite" : " link") + " errno " +
                     std::to_string(err));
        const std::string out = dir / "out.qcow2";
        ASSERT_TRUE(PosixEnv().UnlinkIfExists(out).ok());
        env.ClearFaults();
        env.ResetCounters();
        env.FailCall(op, 1, err);
        Status s = [&]() -> Status {
          BARGE_ASSIGN_OR_RETURN(auto staged, StagedFile::Create(env, out, overwrite));
          EXPECT_EQ(staged->sink().name(), out);
          BARGE_RETURN_IF_ERROR(staged->sink().WriteAt(0, Bytes("data")));
          return staged->Commit();
        }();
        if (env.calls(op) == 0) continue;  // not a call this path makes (link vs rename)
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.error().path(), out) << s.error().ToString();
        EXPECT_EQ(s.error().errno_value(), err) << s.error().ToString();
        EXPECT_EQ(s.error().ToString().find(".barge-tmp"), std::string::npos) << s.error().ToString();
        // (A failed removal of the temporary itself leaves it: unlocked, a
        // sweep's to remove.)
        if (op != EnvOp::kUnlink) {
          EXPECT_FALSE(PosixEnv().Exists(TempPathFor(out)));
        }
        ASSERT_TRUE(PosixEnv().UnlinkIfExists(TempPathFor(out)).ok());
      }
    }
  }
}

// Found by the reliability campaign (issue 13): when the removal of the
// temporary's name failed after the output was linked into place, the
// temporary (a second name of the output) stayed for good in a folder no
// backup or merge sweeps; running convert, restore or overlay create again
// was refused ("exists") and left it. The next writer of the same name
// removes it, and never a live writer's.
TEST(StagedFileTest, Issue13LeftoverOfAFailedRemovalGoesWithTheNextWriter) {
  TempDir dir;
  FaultEnv env(PosixEnv(), dir / "stash");
  const std::string out = dir / "out.raw";
  auto staged = StagedFile::Create(env, out);
  ASSERT_TRUE(staged.ok());
  ASSERT_TRUE((*staged)->sink().WriteAt(0, Bytes("data")).ok());
  env.FailCall(EnvOp::kUnlink, 1, EIO);
  Status committed = (*staged)->Commit();
  ASSERT_FALSE(committed.ok());
  EXPECT_EQ(committed.error().path(), out);
  env.ClearFaults();
  EXPECT_EQ(*PosixEnv().ReadFile(out), "data");
  ASSERT_TRUE(PosixEnv().Exists(TempPathFor(out)));
  // The next run is refused (the output exists) and takes the leftover.
  auto again = StagedFile::Create(PosixEnv(), out);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(PosixEnv().Exists(TempPathFor(out)));
  EXPECT_EQ(*PosixEnv().ReadFile(out), "data");
  // A live writer's temporary of an existing name stays.
  const std::string other = dir / "other.raw";
  {
    auto existing = PosixEnv().OpenSink(other, SinkMode::kCreateNew);
    ASSERT_TRUE(existing.ok());
  }
  auto live = StagedFile::Create(PosixEnv(), other, /*overwrite=*/true);
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(StagedFile::Create(PosixEnv(), other).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(PosixEnv().Exists(TempPathFor(other)));
  ASSERT_TRUE((*live)->Commit().ok());
}

}  // namespace
}  // namespace barge::pipeline
