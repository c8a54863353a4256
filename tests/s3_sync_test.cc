// Issue 40 section 1: `barge sync` between a folder and a bucket, through
// the real binary against the binary's one Ceph radosgw
// (tests/testing/radosgw.h): a local chain synced into s3://BUCKET/PREFIX,
// again (nothing moves), after one more point (only it moves), then back
// into a fresh folder that restores equal to the disk; the bucket's full
// point is an ordinary object (aws s3 cp, qemu-img check). Faults: a sync
// killed mid-upload leaves no point that looks finished and the next one
// completes; another disk's chain under the prefix and a damaged source
// point are refused, nothing written.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/s3_client.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/sync_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMiB = 1 << 20;

class S3SyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    bucket_ = TestBucketName("sync");
    root_ = fs::canonical(dir_.path()).string();
    disk_ = root_ + "/disk.qcow2";
    local_ = root_ + "/A/disk";
    remote_ = "s3://" + bucket_ + "/offsite/disk";
    MakeDisk(disk_, 16 * kMiB);
    RunOk(Aws("s3 mb s3://" + bucket_) + " >/dev/null");
    ASSERT_FALSE(HasFailure());
  }
  void TearDown() override {
    if (rgw_ != nullptr && rgw_->ok() && !bucket_.empty()) testing::Run(Aws("s3 rb --force s3://" + bucket_) + " >/dev/null");
    EXPECT_FALSE(Has(outputs_, rgw_ != nullptr ? rgw_->secret_key() : "\x01")) << "the secret was printed";
  }
  void MakeDisk(const std::string& path, uint64_t size) { MakeCbtDisk(path, size); }
  void Change(const std::string& pattern, const std::string& where) {
    RunOk("qemu-io -f qcow2 -c 'write -P " + pattern + " " + where + " 256k' " + Q(disk_) + " >/dev/null");
  }
  // A backup of `disk` into ROOT/A/disk: a full, or an incremental by cbt0.
  void Backup(bool incremental, const std::string& disk = "") {
    RunOk(Barge("backup --compress none --source " + Q(disk.empty() ? disk_ : disk) + " --target " +
                Q(root_ + "/A") + " --name disk" + (incremental ? " --incremental --dirty-bitmap cbt0" : "")));
  }
  // The second client, with the radosgw's keys and no config files.
  std::string Aws(const std::string& args) const { return rgw_->Aws(args); }
  // barge ARGS with the keys and the endpoint in the environment.
  std::string BargeS3(const std::string& args) const {
    return rgw_->barge_env() + Barge(args);
  }
  CommandResult Sync(const std::string& from, const std::string& to, const std::string& flags = "") {
    CommandResult r = Sh(BargeS3("sync " + flags + Q(from) + " " + Q(to)));
    outputs_ += r.output;
    return r;
  }
  // `barge sync --json` that must succeed: its result.
  json SyncJson(const std::string& from, const std::string& to) {
    CommandResult r = Sync(from, to, "--json ");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ResultOf(r.stdout_text);
  }
  // The keys under the bucket, from the second client ("" for none).
  std::string Keys() { return Sh(Aws("s3 ls --recursive s3://" + bucket_ + "/")).output; }
  // The ids of the points `barge list --json CHAIN` shows, oldest first.
  std::vector<std::string> ListedIds(const std::string& chain) {
    CommandResult r = Sh(BargeS3("list --json " + Q(chain)));
    outputs_ += r.output;
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> ids;
    for (const json& p : ResultOf(r.stdout_text).value("points", json::array())) ids.push_back(p.value("id", ""));
    return ids;
  }

  Radosgw* rgw_ = nullptr;
  TempDir dir_;
  std::string bucket_, root_, disk_, local_, remote_;
  std::string outputs_;  // everything barge printed, to look for the secret
};

TEST_F(S3SyncTest, FolderToBucketAgainOneMoreAndBackToAFolder) {
  Backup(false);
  Change("0x11", "1M");
  Backup(true);
  Change("0x22", "5M");
  Backup(true);
  const std::vector<std::string> ids = PointIds(local_);
  ASSERT_EQ(ids.size(), 3u);

  json r = SyncJson(local_, remote_);
  EXPECT_EQ(r["copied"], 3) << r.dump();
  EXPECT_EQ(r["skipped"], 0) << r.dump();
  for (const json& p : r["chains"][0]["points"]) EXPECT_TRUE(p["verified"].get<bool>()) << r.dump();
  EXPECT_EQ(ListedIds(remote_), ids);

  // Again: nothing moves, and the output says so.
  r = SyncJson(local_, remote_);
  EXPECT_EQ(r["copied"], 0) << r.dump();
  EXPECT_EQ(r["skipped"], 3) << r.dump();
  EXPECT_EQ(r["bytes"], 0) << r.dump();
  CommandResult text = Sync(local_, remote_);
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(Has(text.output, "nothing to copy")) << text.output;

  // One more point: only it moves, its files' bytes reported.
  Change("0x33", "9M");
  Backup(true);
  const std::string fourth = PointIds(local_).back();
  r = SyncJson(local_, remote_);
  EXPECT_EQ(r["copied"], 1) << r.dump();
  EXPECT_EQ(r["skipped"], 3) << r.dump();
  EXPECT_EQ(r["bytes"].get<uint64_t>(), PointBytes(local_, fourth)) << r.dump();
  EXPECT_EQ(r["chains"][0]["points"][3]["action"], "copied") << r.dump();

  // Bucket -> a fresh folder: the whole chain, restoring equal to the disk.
  const std::string back = root_ + "/back/disk";
  r = SyncJson(remote_, back);
  EXPECT_EQ(r["copied"], 4) << r.dump();
  EXPECT_EQ(PointIds(back), PointIds(local_));
  RunOk(Barge("verify --all " + Q(back)));
  RunOk(Barge("restore " + Q(back) + " --to " + Q(root_ + "/out.raw")));
  RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(root_ + "/out.raw"));

  // The bucket's full point is an ordinary object a user can download.
  const std::string image = ReadJson(ManifestPath(local_, ids[0]))["image"].get<std::string>();
  const std::string downloaded = root_ + "/full.qcow2";
  RunOk(Aws("s3 cp " + remote_ + "/" + image + " " + Q(downloaded)) + " >/dev/null");
  RunOk("qemu-img check -q " + Q(downloaded));
  RunOk("cmp " + Q(downloaded) + " " + Q(local_ + "/" + image));
}

TEST_F(S3SyncTest, KilledSyncLeavesNoHalfPointAndTheNextCompletes) {
  // A point of several parts (8 MiB each), so that the kill lands mid-upload.
  const std::string big = root_ + "/big.qcow2";
  MakeDisk(big, 96 * kMiB);
  Backup(false, big);
  RunOk("qemu-io -f qcow2 -c 'write -P 0x55 1M 256k' " + Q(big) + " >/dev/null");
  Backup(true, big);
  ASSERT_EQ(PointIds(local_).size(), 2u);

  const std::string pid_file = root_ + "/pid", log = root_ + "/killed.log";
  RunOk("( " + BargeS3("sync " + Q(local_) + " " + remote_) + " > " + Q(log) + " 2>&1 & echo $! > " +
        Q(pid_file) + " )");
  const pid_t pid = std::stoi(Slurp(pid_file));
  auto direct = S3Client::Create(rgw_->s3_options());
  ASSERT_TRUE(direct.ok()) << direct.error().ToString();
  bool uploading = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!uploading && std::chrono::steady_clock::now() < deadline) {
    auto uploads = (*direct)->ListMultipartUploads(S3Location{bucket_, "offsite/"});
    uploading = uploads.ok() && !uploads->empty();
    if (!uploading) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);  // the shell's child is barge itself (env execs it)
  Sh("while kill -0 " + std::to_string(pid) + " 2>/dev/null; do sleep 0.1; done");
  ASSERT_TRUE(uploading) << Slurp(log);
  // No point that looks finished: the upload is no object, no manifest is there.
  EXPECT_FALSE(Has(Keys(), ".json")) << Keys();

  // The killed run's lock object stays until it expires (docs/s3.md): an
  // operator removes it, as for a killed backup.
  testing::Run(Aws("s3 rm " + remote_ + "/.lock") + " >/dev/null");
  json r = SyncJson(local_, remote_);
  EXPECT_EQ(r["copied"], 2) << r.dump();
  EXPECT_EQ(ListedIds(remote_), PointIds(local_));
  CommandResult verify = Sh(BargeS3("verify --all " + remote_));
  outputs_ += verify.output;
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  auto uploads = (*direct)->ListMultipartUploads(S3Location{bucket_, "offsite/"});
  ASSERT_TRUE(uploads.ok()) << uploads.error().ToString();
  EXPECT_TRUE(uploads->empty()) << "the killed run's upload was not aborted";
}

TEST_F(S3SyncTest, AnotherDisksChainUnderThePrefixIsRefused) {
  const std::string other = root_ + "/other.qcow2";
  MakeDisk(other, 8 * kMiB);
  Backup(false);
  CommandResult b = Sh(BargeS3("backup --compress none --source " + Q(other) + " --target s3://" + bucket_ +
                               "/offsite --name disk"));
  outputs_ += b.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string before = Keys();
  CommandResult r = Sync(local_, remote_);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "barge: InvalidArgument: " + remote_ + ": ")) << r.output;
  EXPECT_TRUE(Has(r.output, "another disk's chain")) << r.output;
  EXPECT_TRUE(Has(r.output, other)) << r.output;
  EXPECT_EQ(Keys(), before);
}

TEST_F(S3SyncTest, DamagedSourcePointIsNotCopied) {
  Backup(false);
  ASSERT_NO_FATAL_FAILURE(DamageFirstPoint(local_));
  CommandResult r = Sync(local_, remote_);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Has(r.output, "barge: Corruption: ")) << r.output;
  EXPECT_TRUE(Has(r.output, "does not verify; not copied")) << r.output;
  EXPECT_FALSE(Has(Keys(), "offsite/")) << Keys();
}

}  // namespace
}  // namespace barge::testing
