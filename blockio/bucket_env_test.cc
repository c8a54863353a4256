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

// The chain level finds the bucket store behind Env::Default() to ask for
// retention (pipeline/object_lock.h): through a RoutingEnv and wrappers,
// never for a local path. Making the BucketEnv sends no request.
TEST(BucketEnvTest, BucketEnvForFindsTheStoreOfS3PathsOnly) {
  HttpOptions http;
  http.s3.endpoint = "http://127.0.0.1:9";
  http.s3.region = "us-east-1";
  http.s3.access_key_id = "AKIDTEST";
  http.s3.secret_access_key = "secret";
  RoutingEnv routing(PosixEnv(), [http] { return http; });
  EnvWrapper wrapped(static_cast<Env&>(routing));  // not the copy constructor
  auto local = BucketEnvFor(wrapped, "/var/backups/vm1");
  ASSERT_TRUE(local.ok()) << local.error().ToString();
  EXPECT_EQ(*local, nullptr);
  auto bucket = BucketEnvFor(wrapped, "s3://backups/chains/vm1");
  ASSERT_TRUE(bucket.ok()) << bucket.error().ToString();
  ASSERT_NE(*bucket, nullptr);
  auto again = BucketEnvFor(routing, "s3://other/x");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *bucket);  // one BucketEnv per RoutingEnv
  auto direct = BucketEnvFor(**bucket, "s3://backups/x");
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(*direct, *bucket);
  EXPECT_EQ(*BucketEnvFor(PosixEnv(), "s3://backups/x"), nullptr);
}

}  // namespace
}  // namespace barge
