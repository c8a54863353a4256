// Policies with chains in buckets and offsite copies (issue 38 §1, issue
// 40 §1), through the real CLI: a policy whose target is s3://BUCKET/PREFIX
// runs its backups and its retention there; a target's `offsite:` gets the
// source's chain synced after each run, with its own retention, in a folder
// (PolicyOffsiteTest, no radosgw) or a bucket (PolicyS3Test, against the
// binary's one radosgw); an offsite that cannot be written fails the run's
// record (and the metric barge_policy_failed_runs_total{reason="offsite"})
// but keeps the point on the target.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Q;
using ::barge::testing::RunOk;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;

void WriteText(const std::string& path, const std::string& text) {
  testing::WriteFile(path, std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                                  reinterpret_cast<const std::byte*>(text.data()) + text.size()));
}

// A policy over one raw disk (digest incrementals) and the commands on it;
// `prefix` goes before every barge command (the S3 keys and endpoint).
class PolicyFixture {
 public:
  PolicyFixture(const TempDir& dir, std::string prefix) : dir_(dir), prefix_(std::move(prefix)) {
    disk_ = dir_ / "disk.raw";
    RunOk("qemu-img create -q -f raw " + Q(disk_) + " 8M && qemu-io -f raw -c 'write -P 0x33 0 1M' " + Q(disk_) +
          " >/dev/null");
  }
  // The policy file: TARGETS is the YAML list of targets.
  void Write(const std::string& targets, int retention_count) {
    WriteText(dir_ / "p.yaml", "name: pol\nsources:\n  - image: " + disk_ + "\n    name: disk\nretention_count: " +
                                   std::to_string(retention_count) + "\ntargets:\n" + targets);
  }
  // One forced run; N changes the disk first (run N writes pattern N).
  CommandResult Run(int n) {
    RunOk("qemu-io -f raw -c 'write -P " + std::to_string(0x40 + n) + " " + std::to_string(n) + "M 512k' " + Q(disk_) +
          " >/dev/null");
    return Sh(Cmd("run --json --force --policy " + Q(dir_ / "p.yaml") + " --metrics-textfile " +
                  Q(dir_ / "m.prom")));
  }
  std::string Cmd(const std::string& args) const {
    return prefix_ + "BARGE_CATALOG=" + Q(dir_ / "c.db") + " " + Barge(args);
  }
  // The point ids `list --json` shows of a chain folder, oldest first.
  std::vector<std::string> Points(const std::string& chain) const {
    CommandResult r = Sh(Cmd("list --json " + Q(chain)));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> ids;
    for (const json& e : testing::Events(r.stdout_text)) {
      if (e.value("event", "") != "result") continue;
      for (const auto& p : e.at("points")) ids.push_back(p.value("id", ""));
    }
    return ids;
  }
  // Restores the latest point of `chain` and compares it with the disk.
  void ExpectRestoresTheDisk(const std::string& chain) const {
    const std::string out = dir_ / "restored.raw";
    fs::remove(out);
    CommandResult r = Sh(Cmd("restore " + Q(chain) + " --to " + Q(out)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    RunOk("qemu-img compare -q -f raw -F raw " + Q(disk_) + " " + Q(out));
  }
  std::string Metrics() const { return testing::Slurp(dir_ / "m.prom"); }
  const std::string& disk() const { return disk_; }

 private:
  const TempDir& dir_;
  std::string prefix_;
  std::string disk_;
};

// The source's outcome in a run's result.
json Outcome(const CommandResult& r) {
  const json result = testing::ResultOf(r.stdout_text);
  EXPECT_EQ(result.at("sources").size(), 1u) << r.output;
  return result.at("sources").at(0);
}

class PolicyOffsiteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
  }
  TempDir dir_;
};

// Local retention 3, offsite retention 1, four runs: each run syncs the
// new point; the offsite keeps only the latest, so from run 3 on the target
// holds points older than the offsite's latest that the offsite forgot
// (skipped, not refused as diverged), and run 4's local retention merges;
// the offsite restores the disk.
TEST_F(PolicyOffsiteTest, FolderOffsiteKeepsItsOwnRetention) {
  PolicyFixture p(dir_, "");
  fs::create_directories(dir_ / "t");
  fs::create_directories(dir_ / "off");
  p.Write("  - path: " + dir_ / "t" + "\n    offsite: {to: " + dir_ / "off" + ", retention_count: 1}\n", 3);
  CommandResult check = Sh(p.Cmd("policy check --json " + Q(dir_ / "p.yaml")));
  ASSERT_EQ(check.exit_code, 0) << check.output;
  EXPECT_EQ(testing::ResultOf(check.stdout_text).at("offsites"),
            json::parse(R"([{"target":")" + dir_ / "t" + R"(","to":")" + dir_ / "off" + R"(","retention_count":1}])"));
  for (int n = 1; n <= 4; ++n) {
    CommandResult r = p.Run(n);
    ASSERT_EQ(r.exit_code, 0) << "run " << n << ": " << r.output;
    EXPECT_NE(Outcome(r).value("offsite", "").find("1 point(s) copied to " + dir_ / "off"), std::string::npos)
        << r.output;
  }
  const std::vector<std::string> local = p.Points(dir_ / "t/pol/disk");
  const std::vector<std::string> offsite = p.Points(dir_ / "off/pol/disk");
  EXPECT_EQ(local.size(), 3u);
  ASSERT_EQ(offsite.size(), 1u);
  EXPECT_EQ(offsite.back(), local.back());
  CommandResult verify = Sh(p.Cmd("verify --all " + Q(dir_ / "off/pol/disk")));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  p.ExpectRestoresTheDisk(dir_ / "off/pol/disk");
}

// An offsite that cannot be written (under a regular file): the run fails
// with the offsite's reason, its point stays on the target and in the
// record, and the metrics count one failed run of reason offsite.
TEST_F(PolicyOffsiteTest, OffsiteFailureFailsTheRunAndKeepsThePoint) {
  PolicyFixture p(dir_, "");
  fs::create_directories(dir_ / "t");
  WriteText(dir_ / "file", "x");
  p.Write("  - path: " + dir_ / "t" + "\n    offsite: " + dir_ / "file/off" + "\n", 3);
  CommandResult r = p.Run(1);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const json o = Outcome(r);
  EXPECT_EQ(o.at("result"), "failed");
  EXPECT_TRUE(o.at("error").get<std::string>().starts_with("offsite " + dir_ / "file/off" + ": ")) << o.dump();
  EXPECT_EQ(o.at("points").size(), 1u) << o.dump();
  EXPECT_EQ(p.Points(dir_ / "t/pol/disk").size(), 1u);
  const std::string m = p.Metrics();
  EXPECT_NE(m.find("barge_policy_failed_runs_total{policy=\"pol\",source=\"disk\",reason=\"offsite\"} 1"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("barge_policy_failed_runs_total{policy=\"pol\",source=\"disk\",reason=\"backup\"} 0"),
            std::string::npos)
      << m;
  CommandResult runs = Sh(p.Cmd("runs list --json --policy pol"));
  EXPECT_NE(runs.stdout_text.find("\"point_state\":\"present\""), std::string::npos) << runs.output;
}

class PolicyS3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    BARGE_REQUIRE_TOOL("aws");
    BARGE_REQUIRE_RADOSGW(rgw_);
    bucket_ = "pol" + std::to_string(::getpid()) + "-" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : bucket_) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    bucket_ = bucket_.substr(0, 60);
    RunOk(Aws("s3 mb s3://" + bucket_));
  }
  void TearDown() override {
    if (rgw_ != nullptr && rgw_->ok() && !bucket_.empty()) testing::Run(Aws("s3 rb --force s3://" + bucket_));
  }
  std::string Aws(const std::string& args) const {
    return rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " " + args;
  }
  // The keys and endpoint as a user gives them, no config files.
  std::string S3Env() const {
    return "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_CONFIG_FILE=/dev/null AWS_ACCESS_KEY_ID=" +
           rgw_->access_key() + " AWS_SECRET_ACCESS_KEY=" + rgw_->secret_key() +
           " AWS_ENDPOINT_URL=" + rgw_->endpoint() + " ";
  }
  testing::Radosgw* rgw_ = nullptr;
  std::string bucket_;
  TempDir dir_;
};

// A bucket as the policy's target: keep-last 2, three runs: two points in
// the bucket, both verify; `policy check` says the free-space rule does
// not apply there and contacts nothing.
TEST_F(PolicyS3Test, BucketTargetRunsAndRetainsThere) {
  PolicyFixture p(dir_, S3Env());
  const std::string target = "s3://" + bucket_ + "/policies";
  p.Write("  - " + target + "\n", 2);
  CommandResult check = Sh(Barge("policy check " + Q(dir_ / "p.yaml")));
  ASSERT_EQ(check.exit_code, 0) << check.output;
  EXPECT_NE(check.output.find("the free-space rule does not apply there"), std::string::npos) << check.output;
  EXPECT_EQ(check.output.find("warning"), std::string::npos) << check.output;
  for (int n = 1; n <= 3; ++n) {
    CommandResult r = p.Run(n);
    ASSERT_EQ(r.exit_code, 0) << "run " << n << ": " << r.output;
    EXPECT_EQ(Outcome(r).at("target"), target);
    if (n == 3) EXPECT_EQ(Outcome(r).at("retention"), "1 point(s) removed") << r.output;
  }
  EXPECT_EQ(p.Points(target + "/pol/disk").size(), 2u);
  CommandResult verify = Sh(p.Cmd("verify --all " + target + "/pol/disk"));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  p.ExpectRestoresTheDisk(target + "/pol/disk");
  EXPECT_EQ(testing::Slurp(dir_ / "m.prom").find(rgw_->secret_key()), std::string::npos);
}

// A local target with its offsite in the bucket: two runs, the bucket
// holds both points, restore from it equals the disk.
TEST_F(PolicyS3Test, OffsiteInABucket) {
  PolicyFixture p(dir_, S3Env());
  fs::create_directories(dir_ / "t");
  const std::string offsite = "s3://" + bucket_ + "/offsite";
  p.Write("  - path: " + dir_ / "t" + "\n    offsite: " + offsite + "\n", 5);
  for (int n = 1; n <= 2; ++n) {
    CommandResult r = p.Run(n);
    ASSERT_EQ(r.exit_code, 0) << "run " << n << ": " << r.output;
    EXPECT_NE(Outcome(r).value("offsite", "").find("1 point(s) copied"), std::string::npos) << r.output;
  }
  EXPECT_EQ(p.Points(offsite + "/pol/disk"), p.Points(dir_ / "t/pol/disk"));
  EXPECT_EQ(p.Points(offsite + "/pol/disk").size(), 2u);
  p.ExpectRestoresTheDisk(offsite + "/pol/disk");
}

// An offsite in a bucket that does not exist: the run fails (reason
// offsite), the local point stays, the metrics count the failure.
TEST_F(PolicyS3Test, OffsiteToAMissingBucketFailsTheRun) {
  PolicyFixture p(dir_, S3Env());
  fs::create_directories(dir_ / "t");
  const std::string offsite = "s3://" + bucket_ + "-gone/offsite";
  p.Write("  - path: " + dir_ / "t" + "\n    offsite: " + offsite + "\n", 5);
  CommandResult r = p.Run(1);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const json o = Outcome(r);
  EXPECT_EQ(o.at("result"), "failed");
  EXPECT_TRUE(o.at("error").get<std::string>().starts_with("offsite " + offsite + ": NotFound")) << o.dump();
  EXPECT_EQ(p.Points(dir_ / "t/pol/disk").size(), 1u);
  EXPECT_NE(p.Metrics().find("barge_policy_failed_runs_total{policy=\"pol\",source=\"disk\",reason=\"offsite\"} 1"),
            std::string::npos)
      << p.Metrics();
  EXPECT_EQ(r.output.find(rgw_->secret_key()), std::string::npos);
}

}  // namespace
}  // namespace barge
