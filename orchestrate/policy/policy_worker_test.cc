// A `barge run` worker's records file and source selection.
#include "orchestrate/policy/policy_worker.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

TEST(PolicyWorkerTest, AFolderHoldsOneCatalogPerPolicyAndShard) {
  barge::testing::TempDir dir;
  const std::string folder = dir / "records";
  ASSERT_TRUE(PosixEnv().CreateDir(folder).ok());
  auto plain = RecordsCatalogPath(PosixEnv(), folder + "//", "nightly", ShardSpec{});
  ASSERT_TRUE(plain.ok()) << plain.error().ToString();
  EXPECT_EQ(*plain, folder + "/nightly.db");
  auto sharded = RecordsCatalogPath(PosixEnv(), folder, "nightly", ShardSpec{2, 3});
  ASSERT_TRUE(sharded.ok()) << sharded.error().ToString();
  EXPECT_EQ(*sharded, folder + "/nightly.shard-2.db");
  // A file is the catalog itself, as every command reads --catalog.
  auto file = RecordsCatalogPath(PosixEnv(), dir / "catalog.db", "nightly", ShardSpec{2, 3});
  ASSERT_TRUE(file.ok()) << file.error().ToString();
  EXPECT_EQ(*file, dir / "catalog.db");
}

TEST(PolicyWorkerTest, SourcesOutsideTheShardAreRefused) {
  EXPECT_TRUE(CheckSourcesInShard({"a", "b", "c"}, ShardSpec{}, "p.yaml").ok());
  const ShardSpec shard{0, 2};
  std::string outside;
  for (const char* name : {"a", "b", "c", "d", "e", "f"}) {
    if (!InShard(shard, name)) outside = name;
  }
  ASSERT_FALSE(outside.empty());
  Status s = CheckSourcesInShard({outside}, shard, "p.yaml");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.error().message(), "source '" + outside + "' falls to shard 1/2, not to this worker's 0/2 (barge policy "
                                 "shards p.yaml --shards 2)");
}

}  // namespace
}  // namespace barge::orchestrate
