// Chains in a bucket (issue 38): the real CLI backs a disk up into
// s3://BUCKET/PREFIX (blockio/bucket_env.h), against the binary's one Ceph
// radosgw (tests/testing/radosgw.h): a full and an incremental point are
// listed, verified and restored equal to the disk; a point downloaded by a
// second client (aws s3 cp) passes qemu-img check; a second writer meets
// the lock object (Busy, exit 4); a backup killed mid-upload leaves no
// point and the next run aborts its upload; the secret shows nowhere.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <sstream>
#include <thread>

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

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class S3ChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    bucket_ = "chain" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : bucket_) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bucket_ = bucket_.substr(0, 60);
    target_ = "s3://" + bucket_ + "/chains";
    chain_ = target_ + "/vm1";
    disk_ = dir_ / "disk.raw";
    testing::RunOk("qemu-img create -q -f raw " + Q(disk_) + " 64M && qemu-io -f raw -c 'write -P 0x33 0 2M' -c "
                   "'write -P 0x7e 20M 3M' " + Q(disk_) + " >/dev/null");
    testing::RunOk(Aws("s3 mb s3://" + bucket_));
    ASSERT_FALSE(HasFailure());
  }
  void TearDown() override {
    if (rgw_ != nullptr && rgw_->ok() && !bucket_.empty()) {
      testing::Run(Aws("s3 rb --force s3://" + bucket_));
    }
  }
  // The second client, with the radosgw's keys and no config files.
  std::string Aws(const std::string& args) const {
    return rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " " + args;
  }
  // barge ARGS with the keys and the endpoint in the environment, as a
  // user gives them.
  std::string BargeS3(const std::string& args) const {
    return "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ACCESS_KEY_ID=" + rgw_->access_key() +
           " AWS_SECRET_ACCESS_KEY=" + rgw_->secret_key() + " AWS_ENDPOINT_URL=" + rgw_->endpoint() + " " +
           Barge(args);
  }
  CommandResult Backup(const std::string& extra = "") {
    CommandResult r = Sh(BargeS3("backup --json --source " + Q(disk_) + " --target " + target_ + " --name vm1" + extra));
    outputs_ += r.output;
    return r;
  }
  // The keys under the chain, from the second client.
  std::string Keys() { return Sh(Aws("s3 ls --recursive s3://" + bucket_ + "/")).output; }
  // The ids of the points `list --json` shows, oldest first.
  std::vector<std::string> ListedIds() {
    CommandResult r = Sh(BargeS3("list --json " + chain_));
    std::vector<std::string> ids;
    for (const auto& line : Lines(r.stdout_text)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "result" && j.contains("points")) {
        for (const auto& p : j["points"]) ids.push_back(p.value("id", ""));
      }
    }
    return ids;
  }
  // The number of points `list --json` shows.
  size_t ListedPoints() {
    CommandResult r = Sh(BargeS3("list --json " + chain_));
    outputs_ += r.output;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (const auto& line : Lines(r.stdout_text)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "result" && j.contains("points")) return j["points"].size();
    }
    ADD_FAILURE() << "no result: " << r.output;
    return 0;
  }
  std::string MultipartUploads() {
    return Sh(Aws("s3api list-multipart-uploads --bucket " + bucket_)).output;
  }

  Radosgw* rgw_ = nullptr;
  TempDir dir_;
  std::string bucket_, target_, chain_, disk_;
  std::string outputs_;  // everything barge printed, to look for the secret
};

TEST_F(S3ChainTest, FullAndIncrementalListVerifyRestore) {
  CommandResult full = Backup();
  ASSERT_EQ(full.exit_code, 0) << full.output;
  testing::RunOk("qemu-io -f raw -c 'write -P 0x5a 40M 1M' " + Q(disk_) + " >/dev/null");
  CommandResult incremental = Backup(" --incremental --changed-by digests");
  ASSERT_EQ(incremental.exit_code, 0) << incremental.output;
  EXPECT_TRUE(Has(incremental.stdout_text, "\"type\":\"incremental\"")) << incremental.stdout_text;
  EXPECT_EQ(ListedPoints(), 2u);
  CommandResult verify = Sh(BargeS3("verify --all " + chain_));
  outputs_ += verify.output;
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  const std::string out = dir_ / "out.raw";
  CommandResult restore = Sh(BargeS3("restore " + chain_ + " --to " + Q(out)));
  outputs_ += restore.output;
  ASSERT_EQ(restore.exit_code, 0) << restore.output;
  testing::RunOk("qemu-img compare -q -f raw -F raw " + Q(disk_) + " " + Q(out));

  // The full point is a plain object a user can download and check.
  const std::string keys = Keys();
  std::string first;
  for (const auto& line : Lines(keys)) {
    auto at = line.find("chains/vm1/");
    if (at != std::string::npos && line.ends_with(".qcow2") && first.empty()) first = line.substr(at);
  }
  ASSERT_FALSE(first.empty()) << keys;
  const std::string downloaded = dir_ / "point.qcow2";
  testing::RunOk(Aws("s3 cp s3://" + bucket_ + "/" + first + " " + Q(downloaded)) + " >/dev/null");
  testing::RunOk("qemu-img check -q " + Q(downloaded));
  // The secret is in no output, manifest or record.
  testing::RunOk(Aws("s3 cp --recursive s3://" + bucket_ + "/chains " + Q(dir_ / "all")) + " >/dev/null");
  CommandResult grep = Sh("grep -rl -- " + Q(rgw_->secret_key()) + " " + Q(dir_ / "all"));
  EXPECT_NE(grep.exit_code, 0) << grep.output;
  EXPECT_FALSE(Has(outputs_, rgw_->secret_key()));
  EXPECT_FALSE(Has(MultipartUploads(), "UploadId")) << MultipartUploads();
}

TEST_F(S3ChainTest, SecondWriterMeetsTheLockObject) {
  ASSERT_EQ(Backup().exit_code, 0);
  // A live writer's lock object (blockio/s3_lock.h's body), as another host holds it.
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  const std::string body = nlohmann::json({{"barge_lock", 1}, {"host", "otherhost"}, {"pid", 4242},
                                           {"token", "0123456789abcdef0123456789abcdef"}, {"acquired", now},
                                           {"expires", now + 600}}).dump();
  const std::string lock_file = dir_ / "lock.json";
  testing::WriteText(lock_file, body);
  testing::RunOk(Aws("s3 cp " + Q(lock_file) + " s3://" + bucket_ + "/chains/vm1/.lock") + " >/dev/null");
  CommandResult second = Backup();
  EXPECT_EQ(second.exit_code, 4) << second.output;
  EXPECT_TRUE(Has(second.output, "Busy")) << second.output;
  EXPECT_EQ(ListedPoints(), 1u);
  testing::RunOk(Aws("s3 rm s3://" + bucket_ + "/chains/vm1/.lock") + " >/dev/null");
  EXPECT_EQ(Backup().exit_code, 0);
  EXPECT_EQ(ListedPoints(), 2u);
}

TEST_F(S3ChainTest, KilledBackupLeavesNoPointAndItsUploadIsAborted) {
  ASSERT_EQ(Backup().exit_code, 0);
  // A disk large enough that its point goes in several parts.
  const std::string big = dir_ / "big.raw";
  testing::RunOk("head -c 160M /dev/urandom > " + Q(big));
  disk_ = big;
  const std::string log = dir_ / "killed.log";
  const std::string pid_file = dir_ / "pid";
  testing::RunOk("( " + BargeS3("backup --source " + Q(big) + " --target " + target_ + " --name vm1 --allow-resize") + " > " +
                 Q(log) + " 2>&1 & echo $! > " + Q(pid_file) + " )");
  const pid_t pid = std::stoi(testing::Slurp(pid_file));
  // Polled in this process, not through the aws CLI (a second a call): a
  // backup with few round trips finishes its upload in about a second.
  HttpOptions o;
  o.s3.endpoint = rgw_->endpoint();
  o.s3.access_key_id = rgw_->access_key();
  o.s3.secret_access_key = rgw_->secret_key();
  auto direct = S3Client::Create(o);
  ASSERT_TRUE(direct.ok()) << direct.error().ToString();
  bool uploading = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!uploading && std::chrono::steady_clock::now() < deadline) {
    auto uploads = (*direct)->ListMultipartUploads(S3Location{bucket_, "chains/"});
    uploading = uploads.ok() && !uploads->empty();
    if (!uploading) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // The shell's child is barge itself (env execs it).
  ::kill(pid, SIGKILL);
  Sh("while kill -0 " + std::to_string(pid) + " 2>/dev/null; do sleep 0.1; done");
  ASSERT_TRUE(uploading) << testing::Slurp(log);
  EXPECT_EQ(ListedPoints(), 1u);
  EXPECT_TRUE(Has(MultipartUploads(), "UploadId"));
  // The next backup takes the (dead, expired) lock over only after its
  // expiry: the killed run's lock object is removed as an operator would.
  testing::Run(Aws("s3 rm s3://" + bucket_ + "/chains/vm1/.lock") + " >/dev/null");
  CommandResult next = Backup(" --allow-resize");
  EXPECT_EQ(next.exit_code, 0) << next.output;
  EXPECT_EQ(ListedPoints(), 2u);
  EXPECT_FALSE(Has(MultipartUploads(), "UploadId")) << MultipartUploads();
  EXPECT_FALSE(Has(outputs_, rgw_->secret_key()));
}

// A merge in a bucket: the new full is written as a new object (staged,
// then published), the journal's renames are server-side copies, and the
// chain restores equal to the disk afterwards.
TEST_F(S3ChainTest, MergeFoldsThePointsIntoANewFull) {
  ASSERT_EQ(Backup().exit_code, 0);
  testing::RunOk("qemu-io -f raw -c 'write -P 0x5a 40M 1M' " + Q(disk_) + " >/dev/null");
  ASSERT_EQ(Backup(" --incremental --changed-by digests").exit_code, 0);
  const std::vector<std::string> ids = ListedIds();
  ASSERT_EQ(ids.size(), 2u);
  CommandResult merge = Sh(BargeS3("merge --through " + ids[1] + " " + chain_));
  outputs_ += merge.output;
  ASSERT_EQ(merge.exit_code, 0) << merge.output << Keys();
  EXPECT_EQ(ListedIds(), std::vector<std::string>{ids[1]}) << Keys();
  CommandResult verify = Sh(BargeS3("verify --all " + chain_));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  const std::string out = dir_ / "out.raw";
  CommandResult restore = Sh(BargeS3("restore " + chain_ + " --to " + Q(out)));
  ASSERT_EQ(restore.exit_code, 0) << restore.output;
  testing::RunOk("qemu-img compare -q -f raw -F raw " + Q(disk_) + " " + Q(out));
  EXPECT_FALSE(Has(Keys(), "merge")) << Keys();
  EXPECT_FALSE(Has(outputs_, rgw_->secret_key()));
}

}  // namespace
}  // namespace barge
