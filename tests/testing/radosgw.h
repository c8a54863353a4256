// A real Ceph radosgw for the S3 tests: one monitor, one OSD on memstore
// and one radosgw on free 127.0.0.1 ports, in a fresh private TempDir, with
// a user of random keys. Started once per test binary (SharedRadosgw) on
// first use, stopped by PID when the binary exits, its folder removed.
// Recipe: ../shared/TESTBED.md "S3 object storage".
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <memory>
#include <string>

#include "blockio/http_client.h"
#include "tests/testing/testing.h"

namespace barge::testing {

class Radosgw {
 public:
  Radosgw();  // starts everything; ok() says whether it came up
  ~Radosgw();
  Radosgw(const Radosgw&) = delete;
  Radosgw& operator=(const Radosgw&) = delete;

  bool ok() const { return rgw_pid_ > 0 && failure_.empty(); }
  const std::string& failure() const { return failure_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(rgw_port_); }
  int port() const { return rgw_port_; }
  const std::string& access_key() const { return access_key_; }
  const std::string& secret_key() const { return secret_key_; }
  // The environment a second client (aws, s3cmd) needs, as shell
  // assignments to put before its command: keys, region, no config files.
  std::string client_env() const;
  // The same for barge: `env` with the keys and AWS_ENDPOINT_URL, no
  // profile or credentials file, to put before barge's command line.
  std::string barge_env() const;
  // The aws CLI against this radosgw, as a second client: `aws ARGS`.
  std::string Aws(const std::string& args) const {
    return client_env() + "aws --endpoint-url " + endpoint() + " " + args;
  }
  // Options for barge's S3Client against this radosgw: its endpoint and
  // keys, 3 attempts with a 50 ms first backoff (tests fail fast).
  HttpOptions s3_options() const;

 private:
  // One start in folder `d`; false (failure_ set) when a step failed.
  bool StartOnce(const std::string& d);
  bool Fail(const std::string& d, const std::string& what);
  int Spawn(const std::string& command);

  TempDir dir_;
  int mon_port_ = 0;
  int rgw_port_ = 0;
  int mon_pid_ = -1, osd_pid_ = -1, rgw_pid_ = -1;
  std::string access_key_, secret_key_;
  std::string failure_;
};

// The binary's one radosgw, started on the first call (about 15 s) and
// stopped at exit. Skips the calling test when radosgw, ceph-mon or ceph-osd
// is missing (fails under BARGE_REQUIRE_TOOLS=1) and fails it when the
// cluster did not come up; use as `Radosgw* rgw; BARGE_REQUIRE_RADOSGW(rgw);`.
Radosgw* SharedRadosgw();
// A bucket name of the running test's own: PREFIX, the pid and the test's
// name, lower-case, at most 60 characters, ending with a letter or digit.
inline std::string TestBucketName(const std::string& prefix) {
  std::string name = prefix + std::to_string(::getpid()) + "-" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  name = name.substr(0, 60);
  while (!name.empty() && !std::isalnum(static_cast<unsigned char>(name.back()))) name.pop_back();
  return name;
}
#define BARGE_REQUIRE_RADOSGW(var)                      \
  BARGE_REQUIRE_TOOL("radosgw");                        \
  BARGE_REQUIRE_TOOL("ceph-mon");                       \
  BARGE_REQUIRE_TOOL("ceph-osd");                       \
  var = ::barge::testing::SharedRadosgw();              \
  ASSERT_TRUE(var->ok()) << var->failure()

}  // namespace barge::testing
