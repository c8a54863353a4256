// The files in deploy/: the Prometheus example configuration (with the
// shipped rules) passes `promtool check config`, and the systemd units pass
// `systemd-analyze verify` (works on Debian 12 without systemd running; the
// units' /usr/local/bin/barge is pointed at the built binary, since verify
// checks that ExecStart is executable).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;

using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

const std::string kDeploy = std::string(BARGE_SOURCE_DIR) + "/deploy";

TEST(DeployTest, PrometheusExampleConfigAndRules) {
  BARGE_REQUIRE_TOOL("promtool");
  std::string out = RunOk("promtool check config " + ShellQuote(kDeploy + "/prometheus/prometheus.yml"));
  EXPECT_NE(out.find("SUCCESS: 4 rules found"), std::string::npos) << out;
}

TEST(DeployTest, SystemdUnitsVerify) {
  BARGE_REQUIRE_TOOL("systemd-analyze");
  TempDir dir;
  for (const char* unit : {"barge-serve@.service", "barge-run@.service", "barge-run@.timer"}) {
    std::ifstream in(kDeploy + "/systemd/" + unit);
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    ASSERT_FALSE(s.empty()) << unit;
    for (size_t at; (at = s.find("/usr/local/bin/barge")) != std::string::npos;) {
      s.replace(at, std::string("/usr/local/bin/barge").size(), testing::BargeBinary());
    }
    std::ofstream(dir / unit) << s;
  }
  // Instances, as systemctl would load them; every warning is a failure.
  auto r = testing::Run("cd " + ShellQuote(dir.path().string()) +
               " && SYSTEMD_LOG_LEVEL=warning systemd-analyze verify ./barge-serve@nightly.service "
               "./barge-run@nightly.service ./barge-run@nightly.timer");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_EQ(line.find("barge-"), std::string::npos) << line;
  }
  // What the units promise.
  std::string serve = RunOk("cat " + ShellQuote(kDeploy + "/systemd/barge-serve@.service"));
  for (const char* want : {"Type=notify", "ExecReload=/bin/kill -HUP $MAINPID", "SuccessExitStatus=143",
                           "--policy /etc/barge/%i.yaml", "--listen ${BARGE_LISTEN}"}) {
    EXPECT_NE(serve.find(want), std::string::npos) << want;
  }
  EXPECT_EQ(serve.find("\nPrivateTmp=yes"), std::string::npos) << "libvirt's NBD socket is in the real /tmp";
}

}  // namespace
}  // namespace barge
