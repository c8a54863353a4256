// StagedFile (issue 12, "Interrupts and leftovers"): the temporary is
// locked and registered while written, so a sweep never removes a live
// writer's file, a second writer is refused instead of removing it, a
// killed run's leftover is taken over, and a forced exit removes it.
#include "pipeline/staged_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "blockio/env.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

TEST(StagedFileTest, SecondWriterOfALiveTemporaryIsBusyAndRemovesNothing) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  auto first = StagedFile::Create(out, true);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  ASSERT_TRUE((*first)->sink().WriteAt(0, Bytes("first")).ok());
  auto second = StagedFile::Create(out, true);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy) << second.error().ToString();
  EXPECT_EQ(second.error().path(), out);
  // The live writer's temporary is intact and commits.
  ASSERT_TRUE((*first)->Commit().ok());
  EXPECT_EQ(*Env::Default().ReadFile(out), "first");
}

TEST(StagedFileTest, SweepNeverRemovesALiveWritersTemporary) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  auto writer = StagedFile::Create(out, true);
  ASSERT_TRUE(writer.ok());
  auto swept = SweepStaleTemporaries(Env::Default(), dir.path().string());
  ASSERT_TRUE(swept.ok());
  EXPECT_TRUE(swept->empty());
  EXPECT_TRUE(fs::exists((*writer)->temp_path()));
  writer->reset();  // abandoned: removed
  EXPECT_FALSE(fs::exists(StagedTempPath(out)));
}

TEST(StagedFileTest, KilledRunsLeftoverIsTakenOverAndSwept) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  testing::WriteFile(StagedTempPath(out), testing::RandomBytes(8192, 1));  // nobody holds it
  auto writer = StagedFile::Create(out, true);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  ASSERT_TRUE((*writer)->sink().WriteAt(0, Bytes("new")).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(*Env::Default().ReadFile(out), "new");  // truncated, not appended to

  testing::WriteFile(StagedTempPath(dir / "other.raw"), testing::RandomBytes(4096, 2));
  auto swept = SweepStaleTemporaries(Env::Default(), dir.path().string());
  ASSERT_TRUE(swept.ok());
  EXPECT_EQ(*swept, std::vector<std::string>{".other.raw.barge-tmp"});
}

TEST(StagedFileTest, ForcedExitRemovesTheTemporary) {
  TempDir dir;
  const std::string out = dir / "out.raw";
  auto writer = StagedFile::Create(out, true);
  ASSERT_TRUE(writer.ok());
  EXPECT_GE(RemoveRegisteredTemporaries(), 1u);
  EXPECT_FALSE(fs::exists(StagedTempPath(out)));
}

TEST(StagedFileTest, SymlinkAtTheTemporaryNameIsNotWrittenThrough) {
  TempDir dir;
  const std::string victim = dir / "victim";
  testing::WriteFile(victim, testing::RandomBytes(4096, 3));
  const std::string out = dir / "out.raw";
  fs::create_symlink(victim, StagedTempPath(out));
  auto writer = StagedFile::Create(out, true);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(fs::file_size(victim), 4096u);
}

}  // namespace
}  // namespace barge::pipeline
