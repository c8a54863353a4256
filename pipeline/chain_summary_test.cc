// FindChainFolders: what `list TARGET` finds below a target, broken chain
// folders included; SummarizeChain: the sums `list` shows; ListChain: the
// whole view `list` prints.
#include "pipeline/chain_summary.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pipeline/backup.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;

// A one-point chain folder TARGET/<name>/ of a 1 MiB raw disk; with
// `incremental`, a point added to it (nothing changed).
void BackUp(const testing::TempDir& tmp, const std::string& target, const std::string& name,
            bool incremental = false) {
  const std::string raw = tmp / (name + ".raw");
  if (!incremental) testing::WriteFile(raw, testing::RandomBytes(1 << 20, 11));
  BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = target;
  req.disk_name = name;
  if (incremental) {
    req.incremental = true;
    req.dirty_ranges = RangeList{};
    req.dirty_description = "nothing";
  }
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

TEST(ListChainTest, PointsChainsParentsAndTheFolderTotals) {
  testing::TempDir tmp;
  const std::string target = tmp / "t";
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "vda"));
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "vda", /*incremental=*/true));
  auto l = ListChain(PosixEnv(), target + "/vda");
  ASSERT_TRUE(l.ok()) << l.error().ToString();
  EXPECT_EQ(l->chain_dir, target + "/vda");
  EXPECT_TRUE(l->warnings.empty());
  EXPECT_TRUE(l->below.empty());
  ASSERT_EQ(l->points.size(), 2u);
  const PointView& full = l->points[0];
  const PointView& inc = l->points[1];
  EXPECT_EQ(l->chain_order, std::vector<std::string>{full.manifest.id});
  EXPECT_EQ(full.chain, full.manifest.id);
  EXPECT_EQ(inc.chain, full.manifest.id);
  EXPECT_EQ(inc.position, 1u);
  EXPECT_FALSE(full.parent_position);
  EXPECT_EQ(inc.parent_position, 0u);
  ASSERT_TRUE(full.image && inc.image);
  EXPECT_EQ(l->image_bytes, full.image->size_bytes + inc.image->size_bytes);
  EXPECT_EQ(l->virtual_size, 1u << 20);
  EXPECT_TRUE(full.duration_seconds);
  EXPECT_FALSE(full.verification);

  // A point named by its manifest lists its folder.
  auto by_manifest = ListChain(PosixEnv(), target + "/vda/" + inc.manifest.id + ".json");
  ASSERT_TRUE(by_manifest.ok()) << by_manifest.error().ToString();
  EXPECT_EQ(by_manifest->points.size(), 2u);
}

TEST(ListChainTest, MissingImagesAndBrokenLinksAreWarningsInOrder) {
  testing::TempDir tmp;
  const std::string target = tmp / "t";
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "vda"));
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "vda", /*incremental=*/true));
  auto chain = LoadChainFolder(PosixEnv(), target + "/vda");
  ASSERT_TRUE(chain.ok()) << chain.error().ToString();
  const std::string full_manifest = chain->points[0].manifest_path;
  const std::string inc_image = chain->PathOf(chain->points[1].manifest.image);
  fs::remove(inc_image);
  fs::remove(full_manifest);  // the increment's parent is gone

  auto l = ListChain(PosixEnv(), target + "/vda");
  ASSERT_TRUE(l.ok()) << l.error().ToString();
  ASSERT_EQ(l->points.size(), 1u);
  const PointView& p = l->points[0];
  EXPECT_FALSE(p.image);
  EXPECT_TRUE(p.chain.empty());
  EXPECT_FALSE(p.broken.empty());
  EXPECT_FALSE(p.parent_position);
  EXPECT_TRUE(l->chain_order.empty());
  EXPECT_EQ(l->image_bytes, 0u);
  ASSERT_EQ(l->warnings.size(), 2u);
  EXPECT_EQ(l->warnings[0].path, inc_image);
  EXPECT_NE(l->warnings[0].message.find("is missing"), std::string::npos) << l->warnings[0].message;
  EXPECT_EQ(l->warnings[1].path, chain->points[1].manifest_path);
  EXPECT_NE(l->warnings[1].message.find("cannot be restored: " + p.broken), std::string::npos)
      << l->warnings[1].message;
}

TEST(ListChainTest, ATargetListsTheChainFoldersBelowAndWarnsOfBrokenOnes) {
  testing::TempDir tmp;
  const std::string target = tmp / "t";
  ASSERT_NO_FATAL_FAILURE(BackUp(tmp, target, "vda"));
  fs::create_directories(target + "/broken");
  { std::ofstream(target + "/broken/0000-20200101T000000Z.json") << "{ not a manifest"; }
  auto l = ListChain(PosixEnv(), target);
  ASSERT_TRUE(l.ok()) << l.error().ToString();
  EXPECT_TRUE(l->points.empty());
  EXPECT_EQ(l->virtual_size, 0u);
  ASSERT_EQ(l->below.size(), 2u);
  EXPECT_EQ(l->below[1].relative, "vda");
  ASSERT_EQ(l->warnings.size(), 1u);
  EXPECT_EQ(l->warnings[0].path, target + "/broken");
  EXPECT_EQ(l->warnings[0].message.rfind("chain folder broken cannot be loaded: ", 0), 0u) << l->warnings[0].message;

  auto missing = ListChain(PosixEnv(), tmp / "nothing-here");
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace barge::pipeline
