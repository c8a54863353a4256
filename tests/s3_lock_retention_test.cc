// S3 Object Lock (issue 40 section 3): buckets created with it, objects
// published with COMPLIANCE retention through S3Upload, retention read,
// extended and (refused) shortened, locked versions that a second client
// (aws s3api) cannot delete; a plain bucket refuses retention with a clear
// error. Against a real radosgw (tests/testing/radosgw.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <ctime>

#include "blockio/s3_client.h"
#include "blockio/s3_upload.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

using testing::Radosgw;

constexpr int64_t kDay = 86400;

class S3LockRetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_RADOSGW(rgw_);
    auto c = S3Client::Create(rgw_->s3_options());
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    client_ = std::move(*c);
    static std::atomic<int> n{0};
    bucket_ = "lock" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  }

  // Runs `aws s3api ARGS` against the radosgw.
  testing::CommandResult S3api(const std::string& args) {
    return testing::Run(rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " s3api " + args);
  }

  // Publishes `bytes` under `key` through S3Upload with `options`.
  Status Publish(const std::string& key, const std::vector<std::byte>& bytes, S3UploadOptions options) {
    auto up = S3Upload::Start(*client_, {bucket_, key}, options);
    if (!up.ok()) return up.error();
    BARGE_RETURN_IF_ERROR((*up)->WriteAt(0, bytes));
    return (*up)->Publish(/*if_absent=*/true);
  }

  // The version id of the current version of `key` (aws s3api).
  std::string VersionOf(const std::string& key) {
    auto r = S3api("list-object-versions --bucket " + bucket_ + " --prefix " + key +
                   " --query 'Versions[0].VersionId' --output text");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::string v = r.stdout_text;
    while (!v.empty() && (v.back() == '\n' || v.back() == '\r')) v.pop_back();
    return v;
  }

  Radosgw* rgw_ = nullptr;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

TEST_F(S3LockRetentionTest, CompliancePublishedObjectCannotBeDeletedNorShortened) {
  BARGE_REQUIRE_TOOL("aws");
  ASSERT_TRUE(client_->CreateBucket(bucket_, /*object_lock=*/true).ok());
  auto enabled = client_->GetObjectLockEnabled(bucket_);
  ASSERT_TRUE(enabled.ok()) << enabled.error().ToString();
  EXPECT_TRUE(*enabled);

  const int64_t until = static_cast<int64_t>(::time(nullptr)) + kDay;
  const auto bytes = testing::RandomBytes(5000, 40);
  S3UploadOptions options;
  options.retention = S3Retention{S3LockMode::kCompliance, until};
  Status st = Publish("chain/manifest.json", bytes, options);
  ASSERT_TRUE(st.ok()) << st.error().ToString();
  const S3Location at{bucket_, "chain/manifest.json"};
  const std::string version = VersionOf(at.key);
  ASSERT_FALSE(version.empty());

  // A second client sees the retention.
  auto shown = S3api("get-object-retention --bucket " + bucket_ + " --key " + at.key + " --output text");
  EXPECT_EQ(shown.exit_code, 0) << shown.output;
  EXPECT_NE(shown.stdout_text.find("COMPLIANCE"), std::string::npos) << shown.output;
  EXPECT_NE(shown.stdout_text.find(S3IsoTime(until).substr(0, 16)), std::string::npos) << shown.output;

  // Ours too.
  auto got = client_->GetRetention(at, version);
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  EXPECT_EQ(got->mode, S3LockMode::kCompliance);
  EXPECT_EQ(got->until_unix, until);

  // The version cannot be deleted, by the second client or by us; it stays readable.
  auto del = S3api("delete-object --bucket " + bucket_ + " --key " + at.key + " --version-id " + version);
  EXPECT_NE(del.exit_code, 0) << del.output;
  EXPECT_NE(del.output.find("AccessDenied"), std::string::npos) << del.output;
  Status ours = client_->DeleteVersion(at, version);
  ASSERT_FALSE(ours.ok());
  EXPECT_EQ(ours.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ours.error().message(),
            at.shown() + " is locked until " + S3IsoTime(until) + " (COMPLIANCE)");
  std::vector<std::byte> back(bytes.size());
  ASSERT_TRUE(client_->Get(at, 0, back).ok());
  EXPECT_EQ(back, bytes);

  // Extending works; shortening COMPLIANCE retention is refused.
  st = client_->PutRetention(at, {S3LockMode::kCompliance, until + kDay}, version);
  ASSERT_TRUE(st.ok()) << st.error().ToString();
  got = client_->GetRetention(at, version);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->until_unix, until + kDay);
  st = client_->PutRetention(at, {S3LockMode::kCompliance, until}, version);
  EXPECT_FALSE(st.ok());
  got = client_->GetRetention(at);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->until_unix, until + kDay);
  // The bucket stays: its locked version cannot go before the retention ends
  // (the cluster goes with the test process).
}

TEST_F(S3LockRetentionTest, MultipartUploadCarriesRetention) {
  ASSERT_TRUE(client_->CreateBucket(bucket_, /*object_lock=*/true).ok());
  const int64_t until = static_cast<int64_t>(::time(nullptr)) + kDay;
  S3UploadOptions options;
  options.test_part_bytes = 5 << 20;
  options.retention = S3Retention{S3LockMode::kCompliance, until};
  const auto bytes = testing::RandomBytes(12 << 20, 41);
  Status st = Publish("chain/disk.qcow2", bytes, options);
  ASSERT_TRUE(st.ok()) << st.error().ToString();
  auto got = client_->GetRetention({bucket_, "chain/disk.qcow2"});
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  EXPECT_EQ(got->mode, S3LockMode::kCompliance);
  EXPECT_EQ(got->until_unix, until);
  // An object published without retention has none.
  ASSERT_TRUE(Publish("chain/other.json", bytes, S3UploadOptions{}).ok());
  got = client_->GetRetention({bucket_, "chain/other.json"});
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(got.error().message(), "the object has no retention");
  ASSERT_TRUE(client_->Delete({bucket_, "chain/other.json"}).ok());
}

TEST_F(S3LockRetentionTest, PlainBucketRefusesRetentionClearly) {
  ASSERT_TRUE(client_->CreateBucket(bucket_).ok());
  auto enabled = client_->GetObjectLockEnabled(bucket_);
  ASSERT_TRUE(enabled.ok()) << enabled.error().ToString();
  EXPECT_FALSE(*enabled);
  const std::string expected = "bucket " + bucket_ + " was not created with Object Lock";
  S3UploadOptions options;
  options.retention = S3Retention{S3LockMode::kCompliance, static_cast<int64_t>(::time(nullptr)) + kDay};
  Status st = Publish("m.json", testing::RandomBytes(100, 1), options);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message().find(expected), std::string::npos) << st.error().ToString();

  const S3Location at{bucket_, "plain.json"};
  ASSERT_TRUE(client_->Put(at, testing::RandomBytes(100, 2)).ok());
  st = client_->PutRetention(at, {S3LockMode::kCompliance, static_cast<int64_t>(::time(nullptr)) + kDay});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message().find(expected), std::string::npos) << st.error().ToString();
  auto none = client_->GetRetention(at);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message().find(expected), std::string::npos) << none.error().ToString();
  ASSERT_TRUE(client_->Delete(at).ok());
}

}  // namespace
}  // namespace barge
