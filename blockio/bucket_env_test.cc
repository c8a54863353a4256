// BucketEnv's pure parts: how paths map onto keys (the object operations
// are tested against radosgw in tests/s3_chain_test.cc).
#include "blockio/bucket_env.h"

#include <gtest/gtest.h>

namespace barge {
namespace {

TEST(BucketEnvTest, PathsNormalizeToKeys) {
  auto at = BucketPathLocation("s3://backups/chains//vm1/./");
  ASSERT_TRUE(at.ok()) << at.error().ToString();
  EXPECT_EQ(at->bucket, "backups");
  EXPECT_EQ(at->key, "chains/vm1");
  auto root = BucketPathLocation("s3://backups");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->key, "");
  EXPECT_EQ(BucketPathLocation("s3://backups/a/../b").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(BucketPathLocation("/local/path").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(BucketPathLocation("s3://KEY:SECRET@backups/x").error().code(), ErrorCode::kInvalidArgument);
}

TEST(BucketEnvTest, FolderPrefixes) {
  EXPECT_EQ(BucketFolderPrefix(""), "");
  EXPECT_EQ(BucketFolderPrefix("chains/vm1"), "chains/vm1/");
}

TEST(BucketEnvTest, TemporariesPublishTheirFinalKey) {
  EXPECT_EQ(BucketFinalKeyOfTemp("chains/vm1/.0001.qcow2.barge-tmp"), "chains/vm1/0001.qcow2");
  EXPECT_EQ(BucketFinalKeyOfTemp(".manifest.barge-tmp"), "manifest");
  EXPECT_EQ(BucketFinalKeyOfTemp("chains/vm1/0001.qcow2"), "");
  EXPECT_EQ(BucketFinalKeyOfTemp("chains/.barge-tmp"), "");
}

}  // namespace
}  // namespace barge
