// StagedFile: the temporary is locked while written (a sweep keeps it) and
// registered; commit publishes with link (never replacing a file that
// appeared meanwhile) or rename; abandon and failures remove the temporary.
#include "pipeline/staged_file.h"

#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace barge::pipeline
