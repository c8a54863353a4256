// FindChainFolders: what `list TARGET` finds below a target, broken chain
// folders included; SummarizeChain: the sums `list` shows.
#include "pipeline/chain_summary.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pipeline/backup.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;

// A one-point chain folder TARGET/<name>/ of a 1 MiB raw disk.
void BackUp(const testing::TempDir& tmp, const std::string& target, const std::string& name) {
  const std::string raw = tmp / (name + ".raw");
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 11));
  BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = target;
  req.disk_name = name;
  req.copy.memory_bytes = 8 << 20;
  req.copy.threads = 2;
  auto r = RunBackup(PosixEnv(), req);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
}

TEST(FindChainFoldersTest, ChainFoldersUpToThreeLevelsAndBrokenOnesReported) {
  testing::TempDir tmp;
  const std::string target = tmp / "t";
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target + "/nightly/vm1", "vda"));
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "plain"));
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target + "/a/b/c", "too-deep"));
  // A chain folder whose manifest does not decode, with a chain folder
  // below it that is not searched.
  fs::create_directories(target + "/broken");
  { std::ofstream(target + "/broken/0000-20200101T000000Z.json") << "{ not a manifest"; }
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target + "/broken", "below"));
  fs::create_directories(target + "/.hidden");
  { std::ofstream(target + "/file.txt") << "not a folder"; }

  auto found = FindChainFolders(PosixEnv(), target);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].relative, "broken");
  EXPECT_EQ(found[0].path, target + "/broken");
  ASSERT_FALSE(found[0].summary.ok());
  EXPECT_NE(found[0].summary.error().path().find("0000-20200101T000000Z.json"), std::string::npos)
      << found[0].summary.error().ToString();
  EXPECT_EQ(found[1].relative, "nightly/vm1/vda");
  EXPECT_EQ(found[2].relative, "plain");
  for (size_t i : {1, 2}) {
    ASSERT_TRUE(found[i].summary.ok()) << found[i].summary.error().ToString();
    const ChainSummary& s = *found[i].summary;
    EXPECT_EQ(s.points, 1u);
    EXPECT_FALSE(s.latest.empty());
    ASSERT_EQ(s.images.size(), 1u);
    ASSERT_TRUE(s.images[0].ok());
    EXPECT_EQ(s.image_bytes, s.images[0]->size_bytes);
    EXPECT_GT(s.image_bytes, 0u);
  }
  EXPECT_EQ(FindChainFolders(PosixEnv(), target, 4).size(), 4u);  // a/b/c/too-deep
}

TEST(SummarizeChainTest, AMissingImageIsNotCounted) {
  testing::TempDir tmp;
  const std::string target = tmp / "t";
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "vda"));
  auto chain = LoadChainFolder(PosixEnv(), target + "/vda");
  ASSERT_TRUE(chain.ok()) << chain.error().ToString();
  fs::remove(chain->PathOf(chain->points[0].manifest.image));
  ChainSummary s = SummarizeChain(PosixEnv(), *chain);
  EXPECT_EQ(s.points, 1u);
  EXPECT_EQ(s.latest, chain->points[0].manifest.id);
  ASSERT_EQ(s.images.size(), 1u);
  ASSERT_FALSE(s.images[0].ok());
  EXPECT_EQ(s.images[0].error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(s.image_bytes, 0u);
}

}  // namespace
}  // namespace barge::pipeline
