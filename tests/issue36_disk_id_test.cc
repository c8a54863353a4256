// Issue 36 §8: an NBD source's identity held its port, so one disk served
// by a restarted qemu-nbd on another port could never take an incremental.
// Through the real binary: `barge backup --disk-id` names the disk, and the
// chain follows the name across ports; without the name (or under another)
// the incremental is refused as another disk's, as before.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A free TCP port on 127.0.0.1 (the kernel's pick; released for the server).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// A read-only qemu-nbd export of a qcow2 image with its bitmap cbt0, on
// 127.0.0.1:port, for the life of the object; stopped by its PID.
class TcpExport {
 public:
  TcpExport(const fs::path& dir, const std::string& image, int port)
      : port_(port), pid_file_((dir / ("nbd-" + std::to_string(port) + ".pid")).string()) {
    // --fork returns once the server listens.
    RunOk("qemu-nbd --fork --pid-file=" + Q(pid_file_) + " -b 127.0.0.1 -p " + std::to_string(port) +
          " -r -t -f qcow2 -B cbt0 " + Q(image));
  }
  ~TcpExport() { Stop(); }
  TcpExport(const TcpExport&) = delete;
  TcpExport& operator=(const TcpExport&) = delete;

  std::string uri() const { return "nbd://127.0.0.1:" + std::to_string(port_) + "/"; }

  // Stops the server and waits until it has let go of the image.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    std::string pid = Run("cat " + Q(pid_file_)).output;
    pid.erase(std::remove(pid.begin(), pid.end(), '\n'), pid.end());
    if (pid.empty()) return;
    Run("kill " + pid);
    for (int i = 0; i < 500 && fs::exists("/proc/" + pid); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

 private:
  int port_;
  std::string pid_file_;
  bool stopped_ = false;
};

TEST(Issue36DiskIdTest, ANamedDiskKeepsItsChainOnAnotherPort) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  BARGE_REQUIRE_TOOL("qemu-nbd");
  TempDir dir;
  const std::string image = dir / "disk.qcow2", target = dir / "t", chain = dir / "t/disk";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " 8M && qemu-io -f qcow2 -c 'write -P 0x11 0 2M' " +
        Q(image) + " >/dev/null && qemu-img bitmap --add --enable " + Q(image) + " cbt0");
  const int port_a = FreePort();
  int port_b = FreePort();
  for (int i = 0; i < 10 && port_b == port_a; ++i) port_b = FreePort();
  ASSERT_GT(port_a, 0);
  ASSERT_NE(port_a, port_b);
  auto backup = [&](const std::string& uri, const std::string& extra) {
    return Barge("backup --source " + Q(uri) + " --target " + Q(target) + " --name disk " + extra);
  };

  {
    TcpExport a(dir.path(), image, port_a);
    RunOk(backup(a.uri(), "--disk-id db1"));
  }
  ASSERT_EQ(PointIds(chain).size(), 1u);
  const json fm = ReadJson(ManifestPath(chain, PointIds(chain).at(0)));
  EXPECT_EQ(fm["disk_identity"]["kind"], "named") << fm.dump(2);
  EXPECT_EQ(fm["disk_identity"]["location"], "db1");
  EXPECT_FALSE(fm["disk_identity"].contains("source")) << fm.dump(2);  // the id alone names the disk
  EXPECT_EQ(fm["source"]["name"], "nbd://127.0.0.1:" + std::to_string(port_a) + "/");

  // The guest writes; qemu-nbd comes back on another port.
  RunOk("qemu-io -f qcow2 -c 'write -P 0x33 1M 64k' -c 'write -P 0x44 6M 128k' " + Q(image) + " >/dev/null");
  TcpExport b(dir.path(), image, port_b);

  // Without the name the port makes it another disk, as before.
  CommandResult unnamed = Sh(backup(b.uri(), "--incremental --dirty-bitmap cbt0"));
  EXPECT_EQ(unnamed.exit_code, 1) << unnamed.output;
  EXPECT_NE(unnamed.output.find("barge: InvalidArgument: "), std::string::npos) << unnamed.output;
  EXPECT_NE(unnamed.output.find("disk named db1"), std::string::npos) << unnamed.output;
  EXPECT_NE(unnamed.output.find("NBD export " + b.uri()), std::string::npos) << unnamed.output;
  EXPECT_NE(unnamed.output.find("--disk-id"), std::string::npos) << unnamed.output;
  // Another name is another disk.
  CommandResult other = Sh(backup(b.uri(), "--incremental --dirty-bitmap cbt0 --disk-id db2"));
  EXPECT_EQ(other.exit_code, 1) << other.output;
  EXPECT_NE(other.output.find("disk named db2"), std::string::npos) << other.output;
  EXPECT_EQ(PointIds(chain).size(), 1u);

  // The name: an incremental, its clean sample checked against the chain.
  const std::string out = RunOk(backup(b.uri(), "--incremental --dirty-bitmap cbt0 --disk-id db1"));
  EXPECT_NE(out.find("checked:"), std::string::npos) << out;
  ASSERT_EQ(PointIds(chain).size(), 2u);
  const json im = ReadJson(ManifestPath(chain, PointIds(chain).at(1)));
  EXPECT_EQ(im["type"], "incremental") << im.dump(2);
  EXPECT_EQ(im["chain_id"], fm["chain_id"]);
  EXPECT_EQ(im["disk_identity"], fm["disk_identity"]);
  EXPECT_EQ(im["source"]["name"], b.uri());
  b.Stop();

  RunOk(Barge("verify --all " + Q(chain)));
  const std::string restored = dir / "r.raw";
  RunOk(Barge("restore " + Q(chain) + " --to " + Q(restored)));
  RunOk("qemu-img compare -q -f raw -F qcow2 " + Q(restored) + " " + Q(image));
}


// The same through a policy: an nbd source's `disk_id` keeps its chain when
// the export's port changes; another id starts a new chain, saying why.
TEST(Issue36DiskIdTest, APolicySourcesDiskIdKeepsItsChainOnAnotherPort) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  BARGE_REQUIRE_TOOL("qemu-nbd");
  TempDir dir;
  const std::string image = dir / "disk.qcow2", target = dir / "t", policy = dir / "p.yaml",
                    cat = dir / "catalog.db";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " 8M && qemu-io -f qcow2 -c 'write -P 0x11 0 2M' " +
        Q(image) + " >/dev/null && qemu-img bitmap --add --enable " + Q(image) + " cbt0");
  fs::create_directories(target);
  // Each run serves the disk on a port of its own.
  int last_port = 0;
  auto serve_and_run = [&](const std::string& disk_id) {
    int port = FreePort();
    for (int i = 0; i < 10 && port == last_port; ++i) port = FreePort();
    EXPECT_NE(port, last_port);
    last_port = port;
    TcpExport server(dir.path(), image, port);
    WriteText(policy, "name: nightly\nsources:\n  - nbd: nbd://127.0.0.1:" + std::to_string(port) +
                          "/\n    name: disk\n    changed_by: digests\n    disk_id: " + disk_id +
                          "\ntargets: [" + target + "]\n");
    CommandResult r = Sh(Barge("run --force --policy " + Q(policy) + " --catalog " + Q(cat) + " --json"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ResultOf(r.stdout_text).at("sources").at(0);
  };
  json first = serve_and_run("db1");
  EXPECT_EQ(first.at("type"), "full") << first.dump(2);
  RunOk("qemu-io -f qcow2 -c 'write -P 0x33 1M 64k' " + Q(image) + " >/dev/null");
  json second = serve_and_run("db1");
  EXPECT_EQ(second.at("result"), "success") << second.dump(2);
  EXPECT_EQ(second.at("type"), "incremental") << second.dump(2);

  json third = serve_and_run("db2");
  EXPECT_EQ(third.at("result"), "success") << third.dump(2);
  EXPECT_EQ(third.at("type"), "full") << third.dump(2);
  const std::string reason = third.at("type_reason");
  EXPECT_NE(reason.find("disk named db1"), std::string::npos) << reason;
  EXPECT_NE(reason.find("disk named db2"), std::string::npos) << reason;
  EXPECT_NE(reason.find("a new chain starts"), std::string::npos) << reason;

  const std::string chain = target + "/nightly/disk";
  RunOk(Barge("verify --all " + Q(chain)));
  const std::string restored = dir / "r.raw";
  RunOk(Barge("restore " + Q(chain) + " --to " + Q(restored)));
  RunOk("qemu-img compare -q -f raw -F qcow2 " + Q(restored) + " " + Q(image));
}

}  // namespace
}  // namespace barge::testing
