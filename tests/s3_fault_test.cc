// Faults between barge and the object store (issue 38, section 5): the
// binary's one Ceph radosgw (tests/testing/radosgw.h) behind the fault proxy
// (tests/testing/http_server.h) that cuts, stalls and answers 503 SlowDown
// or 500. A GET cut mid-body is resumed and the converted image equals the
// original; SlowDowns, stalls and a PUT or UploadPart cut mid-request are
// retried; a store that keeps failing is one IoError line naming
// s3://BUCKET/KEY with the attempts and the time; wrong keys and clock skew
// are one clear line without the secret. The proxy also counts the
// requests of a chain job (the BucketEnv's listing cache, docs/s3.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "blockio/s3_client.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/http_server.h"
#include "tests/testing/radosgw.h"

namespace barge {
namespace {

using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::FaultProxy;
using ::barge::testing::Q;
using ::barge::testing::Radosgw;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;
using Mode = FaultProxy::Mode;

std::span<const std::byte> Bytes(const std::vector<std::byte>& v) { return v; }

class S3FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_RADOSGW(rgw_);
    proxy_ = std::make_unique<FaultProxy>(rgw_->port());
    static std::atomic<int> n{0};
    bucket_ = "fault" + std::to_string(::getpid()) + "-" + std::to_string(n++);
    auto direct = S3Client::Create(Options(rgw_->endpoint()));
    ASSERT_TRUE(direct.ok()) << direct.error().ToString();
    direct_ = std::move(*direct);
    ASSERT_TRUE(direct_->CreateBucket(bucket_).ok());
  }
  // Fast retries, so that a test waits seconds, not minutes.
  HttpOptions Options(const std::string& endpoint) const {
    HttpOptions o;
    o.s3.endpoint = endpoint;
    o.s3.access_key_id = rgw_->access_key();
    o.s3.secret_access_key = rgw_->secret_key();
    o.max_attempts = 6;
    o.backoff_initial_ms = 50;
    o.backoff_max_ms = 400;
    return o;
  }
  std::string ProxyEndpoint() const { return "http://127.0.0.1:" + std::to_string(proxy_->port()); }
  // A client through the proxy. Made after FaultProxy::Set: its connections
  // are new, so the first ones get the fault.
  std::unique_ptr<S3Client> ThroughProxy(HttpOptions o) const {
    auto c = S3Client::Create(std::move(o));
    EXPECT_TRUE(c.ok()) << c.error().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // barge COMMAND ARGS through the proxy, keys in the environment.
  std::string BargeS3(const std::string& command, const std::string& args) const {
    return "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_CONFIG_FILE=/dev/null AWS_ACCESS_KEY_ID=" +
           rgw_->access_key() + " AWS_SECRET_ACCESS_KEY=" + rgw_->secret_key() + " " +
           Barge(command + " --s3-endpoint " + ProxyEndpoint() + " " + args);
  }
  // Runs barge `command` (Barge(...)) with the keys and the proxy as
  // AWS_ENDPOINT_URL in the environment (commands without --s3-endpoint
  // take it from there); expects success and returns the requests the
  // proxy saw meanwhile, printed with the time as `what`.
  int Counted(const std::string& what, const std::string& command) {
    const std::string env = "env -u AWS_PROFILE AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_CONFIG_FILE=/dev/null "
                            "AWS_ACCESS_KEY_ID=" + rgw_->access_key() + " AWS_SECRET_ACCESS_KEY=" +
                            rgw_->secret_key() + " AWS_ENDPOINT_URL=" + ProxyEndpoint() + " ";
    const int before = proxy_->requests();
    const auto start = std::chrono::steady_clock::now();
    CommandResult r = Sh(env + command);
    EXPECT_EQ(r.exit_code, 0) << what << ": " << r.output;
    const int n = proxy_->requests() - before;
    std::cout << what << ": " << n << " requests, "
              << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s\n";
    return n;
  }
  // Counted restore of `chain`'s latest point, which must equal `disk`.
  int CountedRestore(const std::string& chain, const std::string& disk) {
    const std::string out = dir_ / "out.raw";
    const int n = Counted("restore", Barge("restore " + chain + " --to " + Q(out)));
    testing::RunOk("cmp " + Q(disk) + " " + Q(out));
    return n;
  }
  void ExpectStored(const S3Location& at, const std::vector<std::byte>& data) {
    std::vector<std::byte> got(data.size());
    ASSERT_TRUE(direct_->Get(at, 0, got).ok());
    EXPECT_TRUE(got == data);
  }

  Radosgw* rgw_ = nullptr;
  std::unique_ptr<FaultProxy> proxy_;
  std::unique_ptr<S3Client> direct_;  // straight to radosgw, for setup and checks
  std::string bucket_;
  TempDir dir_;
};

// The round trips of list, an incremental backup and a restore of a
// two-point chain: a Stat or OpenSource of a name in a folder just listed
// is answered from the listing (no HEAD), a folder seen is not looked at
// again, and a folder's Stat lists one key, not every key one page at a
// time. Before (issue 38):
// list 43, incremental 198, restore 65 requests; with it 11, 46, 23; with
// a Stat as one short LIST and ListDir cached too (perf38): 7, 30, 19;
// with the look for an encryption marker in each folder above the chain
// (blockio/crypt_env: one short LIST per folder not just listed): 9, 32, 21.
TEST_F(S3FaultTest, AChainJobAnswersStatsFromItsListing) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  const std::string disk = dir_ / "disk.raw";
  testing::RunOk("qemu-img create -q -f raw " + Q(disk) + " 16M && qemu-io -f raw -c 'write -P 0x33 0 2M' " + Q(disk) +
                 " >/dev/null");
  const std::string target = "s3://" + bucket_ + "/chains";
  const std::string chain = target + "/vm1";
  auto counted = [&](const std::string& what, const std::string& command) { return Counted(what, command); };
  counted("full", Barge("backup --source " + Q(disk) + " --target " + target + " --name vm1"));
  testing::RunOk("qemu-io -f raw -c 'write -P 0x5a 8M 1M' " + Q(disk) + " >/dev/null");
  const int incremental = counted("incremental", Barge("backup --incremental --changed-by digests --source " +
                                                       Q(disk) + " --target " + target + " --name vm1"));
  const int list = counted("list", Barge("list " + chain));
  const int restore = CountedRestore(chain, disk);
  EXPECT_LE(list, 10);
  EXPECT_LE(incremental, 38);
  EXPECT_LE(restore, 22);
}

// The round trips of a chain job on a generated disk (data, zeros and
// holes interleaved; issue 38 section 4): a Stat of a name not in a fresh
// listing is one short LIST (not a HEAD, a HEAD of the bucket and a LIST
// of the folder for a missing name), a folder listed again within the
// listing's 2 s costs nothing, and a restore reads each layer's stored
// runs of a copy's chunk with one pass (Qcow2Image::ReadMany), not one
// read per run of data clusters. Before: full 80, incremental 38, restore
// 71 requests; with it: 35, 22, 58.
TEST_F(S3FaultTest, ARestoreReadsAChainInFewCoalescedGets) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  const std::string disk = dir_ / "disk.raw";
  testing::RunOk(Barge("bench generate --size 48M --seed 7 " + Q(disk)) + " >/dev/null");
  const std::string chain = "s3://" + bucket_ + "/chains/vm1";
  const int full = Counted("full", Barge("backup --source " + Q(disk) + " --source-format raw --target s3://" +
                                         bucket_ + "/chains --name vm1"));
  // 1% changed, in runs spread over the disk, named by an extents file.
  std::string extents;
  std::string writes;
  for (int i = 0; i < 8; ++i) {
    const uint64_t at = (static_cast<uint64_t>(i) * 6 + 1) << 20;
    writes += " -c 'write -P 0x" + std::to_string(41 + i) + " " + std::to_string(at) + " 64k'";
    extents += std::string(extents.empty() ? "" : ",") + "{\"offset\":" + std::to_string(at) + ",\"length\":65536}";
  }
  testing::RunOk("qemu-io -f raw" + writes + " " + Q(disk) + " >/dev/null");
  const std::string dirty = dir_ / "dirty.json";
  std::ofstream(dirty) << "{\"format\":\"barge-extents\",\"version\":1,\"virtual_size\":" << (48 << 20)
                       << ",\"extents\":[" << extents << "]}";
  const int incremental = Counted("incremental --dirty-extents",
                                  Barge("backup --incremental --dirty-extents " + Q(dirty) + " --source " + Q(disk) +
                                        " --source-format raw --target s3://" + bucket_ + "/chains --name vm1"));
  const int restore = CountedRestore(chain, disk);
  EXPECT_LE(full, 50);
  EXPECT_LE(incremental, 30);
  EXPECT_LE(restore, 64);
}

TEST_F(S3FaultTest, ConvertResumesAGetCutMidBodyAndEqualsTheOriginal) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  const std::string img = dir_ / "disk.qcow2";
  testing::RunOk("qemu-img create -q -f qcow2 " + Q(img) + " 16M && qemu-io -c 'write -P 0x33 0 3M' -c "
                 "'write -P 0x7e 9M 2M' " + Q(img) + " >/dev/null");
  ASSERT_TRUE(direct_->Put({bucket_, "img.qcow2"}, Bytes(testing::ReadFile(img))).ok());
  std::atomic<int> cuts{0};
  // Each of the first six connections is cut 300 KB into its answers (the
  // first ones may carry only a HEAD: the s3:// location is looked at
  // through the Env's bucket client before the ranged reader opens it).
  proxy_->Set(Mode::kCut, 300000, 6, [&cuts] { ++cuts; });
  const std::string out = dir_ / "out.raw";
  CommandResult r = Sh(BargeS3("convert", "s3://" + bucket_ + "/img.qcow2 " + Q(out)));
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_GE(cuts.load(), 1);
  testing::RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(img) + " " + Q(out));
  EXPECT_EQ(r.stderr_text.find(rgw_->secret_key()), std::string::npos);
}

TEST_F(S3FaultTest, ThreeSlowDownsThenSuccessAndA500AreRetried) {
  const auto data = testing::RandomBytes(100000, 3);
  const S3Location at{bucket_, "slow"};
  proxy_->Set(Mode::k503, 0, 3);
  const int before = proxy_->requests();
  auto client = ThroughProxy(Options(ProxyEndpoint()));
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put(at, Bytes(data)).ok());
  EXPECT_EQ(proxy_->faults(), 3);
  EXPECT_EQ(proxy_->requests() - before, 4) << "three SlowDowns, then the PUT that went through";
  ExpectStored(at, data);

  proxy_->Set(Mode::k500, 0, 1);
  auto again = ThroughProxy(Options(ProxyEndpoint()));
  std::vector<std::byte> got(data.size());
  ASSERT_TRUE(again->Get(at, 0, got).ok());
  EXPECT_TRUE(got == data);
  EXPECT_EQ(proxy_->faults(), 4);
}

TEST_F(S3FaultTest, AStallLongerThanTheTimeoutIsCutAndRetried) {
  const auto data = testing::RandomBytes(1 << 20, 4);
  const S3Location at{bucket_, "stall"};
  ASSERT_TRUE(direct_->Put(at, Bytes(data)).ok());
  // The proxy holds the connection open for 30 s; the client must cut it.
  // libcurl judges the speed over its last seconds of samples, so a
  // 1-second stall timeout takes effect some seconds after the last byte.
  proxy_->Set(Mode::kStall, 20000, 1, {}, 30000);
  HttpOptions o = Options(ProxyEndpoint());
  o.stall_timeout_ms = 1000;
  auto client = ThroughProxy(o);
  std::vector<std::byte> got(data.size());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(client->Get(at, 0, got).ok());
  EXPECT_TRUE(got == data);
  EXPECT_EQ(proxy_->faults(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15))
      << "cut by the stall timeout, not by the end of the stall";
}

TEST_F(S3FaultTest, APutAndAnUploadPartCutMidRequestAreRetried) {
  const auto data = testing::RandomBytes(1 << 20, 5);
  const S3Location at{bucket_, "put"};
  proxy_->Set(Mode::kCutRequest, 200000, 1);
  auto client = ThroughProxy(Options(ProxyEndpoint()));
  ASSERT_TRUE(client->Put(at, Bytes(data)).ok());
  EXPECT_EQ(proxy_->faults(), 1);
  EXPECT_GE(proxy_->bytes_to_server(), data.size() + 200000) << "the body was sent twice";
  ExpectStored(at, data);

  const S3Location parts{bucket_, "parts"};
  auto id = direct_->CreateMultipart(parts);
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  proxy_->Set(Mode::kCutRequest, 300000, 1);
  auto fresh = ThroughProxy(Options(ProxyEndpoint()));
  auto etag = fresh->UploadPart(parts, *id, 1, Bytes(data));
  ASSERT_TRUE(etag.ok()) << etag.error().ToString();
  EXPECT_EQ(proxy_->faults(), 2);
  ASSERT_TRUE(direct_->CompleteMultipart(parts, *id, {{1, *etag, data.size()}}).ok());
  ExpectStored(parts, data);
}

TEST_F(S3FaultTest, AStoreThatKeepsFailingIsOneIoErrorLineWithAttemptsAndTime) {
  ASSERT_TRUE(direct_->Put({bucket_, "img.qcow2"}, Bytes(testing::RandomBytes(4096, 6))).ok());
  proxy_->Set(Mode::k503, 0, 1000);
  CommandResult r = Sh(BargeS3("convert", "s3://" + bucket_ + "/img.qcow2 " + Q(dir_ / "o.raw")));
  EXPECT_EQ(r.exit_code, 1);
  const std::string head = "barge: IoError: s3://" + bucket_ + "/img.qcow2: gave up after 6 attempts in ";
  EXPECT_EQ(r.stderr_text.rfind(head, 0), 0u) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("the object store kept failing (HTTP 503"), std::string::npos) << r.stderr_text;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  EXPECT_EQ(r.stderr_text.find(rgw_->secret_key()), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir_ / "o.raw"));
}

TEST_F(S3FaultTest, TheRetryDeadlineBoundsManyAttempts) {
  proxy_->Set(Mode::k503, 0, 1000);
  HttpOptions o = Options(ProxyEndpoint());
  o.max_attempts = 1000;
  o.backoff_initial_ms = 100;
  o.backoff_max_ms = 200;
  o.retry_deadline_ms = 1500;
  auto client = ThroughProxy(o);
  const auto start = std::chrono::steady_clock::now();
  auto info = client->Head({bucket_, "any"});
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code(), ErrorCode::kIoError);
  EXPECT_TRUE(info.error().retryable());
  EXPECT_LT(took, std::chrono::seconds(5));
  const std::string text = info.error().ToString();
  EXPECT_NE(text.find("s3://" + bucket_ + "/any"), std::string::npos) << text;
  EXPECT_NE(text.find("gave up after "), std::string::npos) << text;
  EXPECT_NE(text.find(" s: "), std::string::npos) << text;
  EXPECT_GE(proxy_->faults(), 5);
  EXPECT_LT(proxy_->faults(), 40);
}

TEST_F(S3FaultTest, WrongKeyIdAndClockSkewAreOneClearLineWithoutTheSecret) {
  const S3Location at{bucket_, "k"};
  ASSERT_TRUE(direct_->Put(at, Bytes(testing::RandomBytes(10, 7))).ok());
  HttpOptions o = Options(ProxyEndpoint());
  o.s3.access_key_id = "AKIANOSUCHKEY0000000";
  auto client = ThroughProxy(o);
  auto info = client->Head(at);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code(), ErrorCode::kInvalidArgument);
  std::string text = info.error().ToString();
  EXPECT_NE(text.find("s3://" + bucket_ + "/k"), std::string::npos) << text;
  EXPECT_EQ(text.find(rgw_->secret_key()), std::string::npos);
  EXPECT_EQ(text.find('\n'), std::string::npos);

  // The test seam for a skewed clock: a signing time of our own. libcurl
  // signs with an X-Amz-Date the request carries instead of the clock's.
  o = Options(ProxyEndpoint());
  o.extra_headers.push_back("X-Amz-Date: 20200101T000000Z");
  client = ThroughProxy(o);
  std::vector<std::byte> got(10);
  Status st = client->Get(at, 0, got);
  ASSERT_FALSE(st.ok());
  text = st.error().ToString();
  EXPECT_EQ(st.error().code(), ErrorCode::kInvalidArgument) << text;
  EXPECT_NE(text.find("clock differs"), std::string::npos) << text;
  EXPECT_NE(text.find("s3://" + bucket_ + "/k"), std::string::npos) << text;
  EXPECT_EQ(text.find(rgw_->secret_key()), std::string::npos);
}

// No radosgw needed: what the cli makes of --s3-region and the config file
// before any request.
TEST(S3ConfigCliTest, RegionFlagAndAMalformedConfigFileAreSeenBeforeAnyRequest) {
  TempDir dir;
  const std::string env = "env -u AWS_PROFILE -u AWS_REGION -u AWS_DEFAULT_REGION -u AWS_ENDPOINT_URL "
                          "AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ACCESS_KEY_ID=AK AWS_SECRET_ACCESS_KEY=SK ";
  // The flag reaches the client, which refuses a name no region has.
  CommandResult r = Sh(env + "AWS_CONFIG_FILE=/dev/null " +
                       Barge("convert --s3-endpoint http://127.0.0.1:9 --s3-region 'no region' s3://bkt/k " +
                             Q(dir / "o.raw")));
  EXPECT_EQ(r.exit_code, 1) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("not a region name: 'no region'"), std::string::npos) << r.stderr_text;
  // The config file's region reaches it too (flag > env > file).
  std::ofstream(dir / "config") << "[default]\nregion = from file!\n";
  r = Sh(env + "AWS_CONFIG_FILE=" + Q(dir / "config") + " " +
         Barge("convert --s3-endpoint http://127.0.0.1:9 s3://bkt/k " + Q(dir / "o.raw")));
  EXPECT_NE(r.stderr_text.find("not a region name: 'from file!'"), std::string::npos) << r.stderr_text;
  // A malformed file: a usage error naming it, for s3:// locations only.
  std::ofstream(dir / "config") << "[default\nregion = SECRETLINE\n";
  r = Sh(env + "AWS_CONFIG_FILE=" + Q(dir / "config") + " " +
         Barge("convert --s3-endpoint http://127.0.0.1:9 s3://bkt/k " + Q(dir / "o.raw")));
  EXPECT_EQ(r.exit_code, 64) << r.stderr_text;
  EXPECT_EQ(r.stderr_text.rfind("barge: InvalidArgument: " + (dir / "config") + ": line 1: ", 0), 0u)
      << r.stderr_text;
  EXPECT_EQ(r.stderr_text.find("SECRETLINE"), std::string::npos) << r.stderr_text;
  testing::RunOk("truncate -s 1M " + Q(dir / "in.raw"));
  r = Sh(env + "AWS_CONFIG_FILE=" + Q(dir / "config") + " " + Barge("convert " + Q(dir / "in.raw") + " " +
                                                                      Q(dir / "out.raw")));
  EXPECT_EQ(r.exit_code, 0) << "a local source does not care: " << r.stderr_text;
}

}  // namespace
}  // namespace barge
