// s3:// objects as read-only sources of the real CLI, against the binary's
// one Ceph radosgw (tests/testing/radosgw.h): a qcow2 uploaded by a second
// client (aws s3 cp) is converted by ranged, signed GETs and equals the
// original (qemu-img compare); wrong keys and a missing bucket are one
// clear line naming the bucket; the secret shows in no output.
#include <gtest/gtest.h>

#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"

namespace barge {
namespace {

using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Q;
using ::barge::testing::Radosgw;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;

class S3SourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    bucket_ = "src" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : bucket_) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bucket_ = bucket_.substr(0, 60);
    img_ = dir_ / "disk.qcow2";
    testing::RunOk("qemu-img create -q -f qcow2 " + Q(img_) + " 32M && qemu-io -c 'write -P 0x33 0 2M' -c "
                   "'write -P 0x7e 20M 3M' -c 'write -z 24M 1M' " + Q(img_) + " >/dev/null");
    testing::RunOk(Aws("s3 mb s3://" + bucket_) + " && " + Aws("s3 cp " + Q(img_) + " s3://" + bucket_ + "/img.qcow2"));
    ASSERT_FALSE(HasFailure());
  }
  // The second client, with the radosgw's keys and no config files.
  std::string Aws(const std::string& args) const {
    return rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " " + args + " >/dev/null";
  }
  // barge COMMAND ARGS with the keys in the environment, as a user gives
  // them, and --s3-endpoint after the command.
  std::string BargeS3(const std::string& args, const std::string& secret = "") const {
    return "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ACCESS_KEY_ID=" + rgw_->access_key() +
           " AWS_SECRET_ACCESS_KEY=" + (secret.empty() ? rgw_->secret_key() : secret) + " " +
           Barge(args.substr(0, args.find(' ')) + " --s3-endpoint " + rgw_->endpoint() + args.substr(args.find(' ')));
  }
  Radosgw* rgw_ = nullptr;
  TempDir dir_;
  std::string bucket_, img_;
};

TEST_F(S3SourceTest, ConvertReadsAQcow2InABucketByRanges) {
  const std::string out = dir_ / "out.raw";
  CommandResult r = Sh(BargeS3("convert --json s3://" + bucket_ + "/img.qcow2 " + Q(out)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  testing::RunOk("qemu-img compare -q " + Q(img_) + " " + Q(out));
  EXPECT_EQ(r.output.find(rgw_->secret_key()), std::string::npos) << r.output;
  const std::string q = dir_ / "out.qcow2";
  testing::RunOk(BargeS3("convert -O qcow2 s3://" + bucket_ + "/img.qcow2 " + Q(q)));
  testing::RunOk("qemu-img check -q " + Q(q) + " && qemu-img compare -q " + Q(img_) + " " + Q(q));
}

TEST_F(S3SourceTest, WrongSecretIsOneClearLineWithoutTheSecret) {
  const std::string secret = "WrongSecretXyz" + rgw_->secret_key().substr(0, 10);
  for (const std::string json : {"", "--json "}) {
    CommandResult r = Sh(BargeS3("convert " + json + "s3://" + bucket_ + "/img.qcow2 " + Q(dir_ / "o.raw"), secret));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(bucket_), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(secret), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find(rgw_->secret_key()), std::string::npos) << r.output;
    if (json.empty()) {
      EXPECT_EQ(r.stderr_text.find('\n'), r.stderr_text.size() - 1) << r.stderr_text;
      EXPECT_NE(r.stderr_text.find("barge: InvalidArgument: s3://" + bucket_ + "/img.qcow2: "), std::string::npos)
          << r.stderr_text;
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "o.raw"));
}

TEST_F(S3SourceTest, MissingBucketAndKeyAreNotFound) {
  CommandResult r = Sh(BargeS3("convert s3://no-such-" + bucket_.substr(0, 40) + "/img.qcow2 " + Q(dir_ / "o.raw")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("barge: NotFound: s3://no-such-"), std::string::npos) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("does not exist"), std::string::npos) << r.stderr_text;
  r = Sh(BargeS3("convert s3://" + bucket_ + "/nothing.qcow2 " + Q(dir_ / "o.raw")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.stderr_text.find("barge: NotFound: s3://" + bucket_ + "/nothing.qcow2"), std::string::npos)
      << r.stderr_text;
}

}  // namespace
}  // namespace barge
