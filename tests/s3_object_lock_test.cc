// Immutable points (issue 40, section 3): `barge backup --object-lock-days`
// into a bucket with S3 Object Lock, against the binary's one Ceph radosgw
// (tests/testing/radosgw.h). Every object of a full and an incremental
// point carries COMPLIANCE retention that a second client (aws s3api)
// reads, the full retained at least as long as the incremental that
// depends on it, and not deletable by version; forget and merge refuse the
// locked points up front with the date (exit 1) and the chain still
// verifies; a shorter period on a later point never shortens the earlier
// ones; a bucket without Object Lock is one clear error and no object.
// COMPLIANCE objects cannot be removed before they expire: the locked
// buckets stay in the test radosgw (memstore, thrown away at exit).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <sstream>

#include "blockio/s3_client.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"

namespace barge {
namespace {

using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Has;
using ::barge::testing::Q;
using ::barge::testing::Radosgw;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;

constexpr int64_t kDay = 86400;

class S3ObjectLockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    static std::atomic<int> n{0};
    bucket_ = "objlock" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    chain_ = "s3://" + bucket_ + "/chains/vm1";
    disk_ = dir_ / "disk.raw";
    testing::RunOk("qemu-img create -q -f raw " + Q(disk_) + " 16M && qemu-io -f raw -c 'write -P 0x33 0 2M' " +
                   Q(disk_) + " >/dev/null");
  }
  void TearDown() override {
    // A bucket with locked objects cannot be removed before they expire.
    if (rgw_ != nullptr && rgw_->ok() && !bucket_.empty() && !locked_) {
      testing::Run(Aws("s3 rb --force s3://" + bucket_));
    }
  }
  void MakeBucket(bool object_lock) {
    locked_ = object_lock;
    testing::RunOk(Aws("s3api create-bucket --bucket " + bucket_ +
                       (object_lock ? " --object-lock-enabled-for-bucket" : "")) + " >/dev/null");
  }
  std::string Aws(const std::string& args) const {
    return rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " " + args;
  }
  std::string BargeS3(const std::string& args) const {
    return "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ACCESS_KEY_ID=" + rgw_->access_key() +
           " AWS_SECRET_ACCESS_KEY=" + rgw_->secret_key() + " AWS_ENDPOINT_URL=" + rgw_->endpoint() + " " +
           Barge(args);
  }
  // A backup with EXTRA flags; the keys of the point's objects (image,
  // manifest, digest tables) from its result event.
  std::vector<std::string> Backup(const std::string& extra) {
    CommandResult r = Sh(BargeS3("backup --json --source " + Q(disk_) + " --target s3://" + bucket_ +
                                 "/chains --name vm1 " + extra));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> keys;
    std::istringstream in(r.stdout_text);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || j.value("event", "") != "result") continue;
      EXPECT_TRUE(j.contains("object_lock")) << line;
      for (const char* field : {"image", "manifest", "digest_table", "strong_digest_table"}) {
        if (!j.contains(field)) continue;
        std::string path = j[field];
        keys.push_back(path.substr(("s3://" + bucket_ + "/").size()));
      }
    }
    EXPECT_GE(keys.size(), 3u) << r.output;
    return keys;
  }
  // The object's retention as aws s3api reads it: mode and until (unix).
  std::pair<std::string, int64_t> Retention(const std::string& key) {
    CommandResult r = Sh(Aws("s3api get-object-retention --bucket " + bucket_ + " --key " + key));
    EXPECT_EQ(r.exit_code, 0) << key << ": " << r.output;
    auto j = nlohmann::json::parse(r.stdout_text, nullptr, false);
    if (!j.is_object() || !j.contains("Retention")) return {"", 0};
    // aws CLI v1 (Debian's) writes "+00:00" where v2 and S3's XML write "Z".
    std::string text = j["Retention"].value("RetainUntilDate", "");
    if (text.ends_with("+00:00")) text = text.substr(0, text.size() - 6) + "Z";
    auto until = ParseS3IsoTime(text);
    EXPECT_TRUE(until.has_value()) << r.stdout_text;
    return {j["Retention"].value("Mode", ""), until.value_or(0)};
  }
  std::string Keys() { return Sh(Aws("s3 ls --recursive s3://" + bucket_ + "/")).output; }

  Radosgw* rgw_ = nullptr;
  TempDir dir_;
  std::string bucket_, chain_, disk_;
  bool locked_ = false;
};

TEST_F(S3ObjectLockTest, LockedPointsAreRetainedAndForgetAndMergeRefuse) {
  MakeBucket(/*object_lock=*/true);
  const int64_t start = static_cast<int64_t>(::time(nullptr));
  const std::vector<std::string> full = Backup("--changed-by digests --object-lock-days 1");
  testing::RunOk("qemu-io -f raw -c 'write -P 0x5a 8M 1M' " + Q(disk_) + " >/dev/null");
  const std::vector<std::string> incremental = Backup("--incremental --changed-by digests --object-lock-days 1");
  ASSERT_FALSE(HasFailure());

  int64_t incremental_until = 0;
  for (const auto& key : incremental) {
    auto [mode, until] = Retention(key);
    EXPECT_EQ(mode, "COMPLIANCE") << key;
    EXPECT_GE(until, start + kDay - 5) << key;
    EXPECT_LE(until, start + kDay + 600) << key;
    incremental_until = std::max(incremental_until, until);
  }
  for (const auto& key : full) {
    auto [mode, until] = Retention(key);
    EXPECT_EQ(mode, "COMPLIANCE") << key;
    EXPECT_GE(until, incremental_until) << key << ": the full must be retained as long as the incremental";
  }

  // A second client cannot delete the full's image version.
  const std::string image = full.front();
  CommandResult version = Sh(Aws("s3api list-object-versions --bucket " + bucket_ + " --prefix " + image +
                                 " --query 'Versions[0].VersionId' --output text"));
  ASSERT_EQ(version.exit_code, 0) << version.output;
  std::string id = version.stdout_text;
  while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
  CommandResult del = Sh(Aws("s3api delete-object --bucket " + bucket_ + " --key " + image + " --version-id " + id));
  EXPECT_NE(del.exit_code, 0) << del.output;
  EXPECT_TRUE(Has(del.output, "AccessDenied")) << del.output;

  // forget and merge refuse up front, naming the date; nothing changes.
  const std::string before = Keys();
  CommandResult forget = Sh(BargeS3("forget --keep-last 1 " + chain_));
  EXPECT_EQ(forget.exit_code, 1) << forget.output;
  EXPECT_TRUE(Has(forget.output, "locked until 20")) << forget.output;
  EXPECT_TRUE(Has(forget.output, "COMPLIANCE")) << forget.output;
  CommandResult merge = Sh(BargeS3("merge --through latest " + chain_));
  EXPECT_EQ(merge.exit_code, 1) << merge.output;
  EXPECT_TRUE(Has(merge.output, "InvalidArgument: s3://" + bucket_ + "/chains/vm1/")) << merge.output;
  EXPECT_TRUE(Has(merge.output, "locked until 20")) << merge.output;
  EXPECT_EQ(Keys(), before);
  CommandResult verify = Sh(BargeS3("verify --all " + chain_));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
}

TEST_F(S3ObjectLockTest, AShorterPeriodNeverShortensThePointsBelow) {
  MakeBucket(/*object_lock=*/true);
  const int64_t start = static_cast<int64_t>(::time(nullptr));
  const std::vector<std::string> full = Backup("--changed-by digests --object-lock-days 3");
  testing::RunOk("qemu-io -f raw -c 'write -P 0x5a 8M 1M' " + Q(disk_) + " >/dev/null");
  const std::vector<std::string> incremental =
      Backup("--incremental --changed-by digests --object-lock-days 1 --object-lock-mode governance");
  ASSERT_FALSE(HasFailure());
  for (const auto& key : full) {
    auto [mode, until] = Retention(key);
    EXPECT_EQ(mode, "COMPLIANCE") << key;
    EXPECT_GE(until, start + 3 * kDay - 5) << key;
  }
  for (const auto& key : incremental) {
    auto [mode, until] = Retention(key);
    EXPECT_EQ(mode, "GOVERNANCE") << key;
    EXPECT_LE(until, start + kDay + 600) << key;
  }
}

TEST_F(S3ObjectLockTest, ABucketWithoutObjectLockIsRefusedBeforeAnyData) {
  MakeBucket(/*object_lock=*/false);
  CommandResult r = Sh(BargeS3("backup --source " + Q(disk_) + " --target s3://" + bucket_ +
                               "/chains --name vm1 --object-lock-days 1"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "InvalidArgument")) << r.output;
  EXPECT_TRUE(Has(r.output, "bucket " + bucket_ + " was not created with Object Lock")) << r.output;
  EXPECT_EQ(Keys(), "");
  // A folder target is a usage error.
  CommandResult local = Sh(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "t") +
                                 " --name vm1 --object-lock-days 1"));
  EXPECT_EQ(local.exit_code, 64) << local.output;
  EXPECT_TRUE(Has(local.output, "needs an s3:// --target")) << local.output;
}

}  // namespace
}  // namespace barge
