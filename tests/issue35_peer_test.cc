// Issue 35, against a hostile peer and a shared host: a peer answering block
// status in one-byte extents costs bounded memory and output (backup, map);
// an export larger than qcow2 can hold is refused before any walking; no
// command prints a source's credentials (policy check, backup, policy run
// and its records); barge serve answers /healthz while many half-open
// connections are held.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "tests/policy_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace policy_testing;
using testing::Has;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

// An nbdkit plugin (nbdkit cc compiles it at start) that reads as zeros and
// answers block status with one-byte extents, data and hole in turn, as
// many as nbdkit sends in one reply (1 Mi).
constexpr const char* kLyingPlugin = R"(
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>
#include <string.h>
#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
static int64_t size = 1 << 20;
static int config(const char *key, const char *value) {
  if (strcmp(key, "size") != 0) return -1;
  size = nbdkit_parse_size(value);
  return size < 0 ? -1 : 0;
}
static void *open_(int readonly) { return NBDKIT_HANDLE_NOT_NEEDED; }
static int64_t get_size(void *h) { return size; }
static int pread_(void *h, void *buf, uint32_t count, uint64_t offset, uint32_t flags) {
  memset(buf, 0, count);
  return 0;
}
static int can_extents(void *h) { return 1; }
static int extents(void *h, uint32_t count, uint64_t offset, uint32_t flags, struct nbdkit_extents *e) {
  for (uint64_t i = 0; i < count && i < (1u << 20); ++i) {
    uint32_t type = ((offset + i) & 1) ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0;
    if (nbdkit_add_extent(e, offset + i, 1, type) == -1) return -1;
  }
  return 0;
}
static struct nbdkit_plugin plugin = {
  .name = "lying", .config = config, .open = open_, .get_size = get_size, .pread = pread_,
  .can_extents = can_extents, .extents = extents,
};
NBDKIT_REGISTER_PLUGIN(plugin)
)";

bool SanitizedBuild() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#endif
#endif
  return false;
}

class LyingPeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SanitizedBuild()) GTEST_SKIP() << "AddressSanitizer's shadow memory is not the program's";
    BARGE_REQUIRE_TOOL("nbdkit");
    BARGE_REQUIRE_TOOL("cc");
    testing::WriteText(dir_ / "lying.c", kLyingPlugin);
    const std::string sock = dir_ / "lying.sock";
    server_ = std::make_unique<testing::SocketServer>(
        "nbdkit -f --exit-with-parent -U " + Q(sock) + " cc " + Q(dir_ / "lying.c") + " size=1M", sock);
    ASSERT_TRUE(server_->WaitReady()) << "nbdkit cc (needs nbdkit-plugin.h and a C compiler)";
  }

  TempDir dir_;
  std::unique_ptr<testing::SocketServer> server_;
};

// 1 Mi one-byte extents: before, about 100 bytes of memory and of output
// each (a 64 MiB export cost 5.6 GiB and printed 2.6 GB); now one extent
// per 4 KiB granule at most.
TEST_F(LyingPeerTest, Issue35MapOfOneByteExtentsIsBoundedInMemoryAndOutput) {
  const std::string out = dir_ / "map.json", rss = dir_ / "rss";
  auto r = testing::Run("/usr/bin/time -o " + Q(rss) + " -f %M " + Barge("map --json " + Q(server_->uri())) + " > " +
                        Q(out));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const uint64_t peak_kib = std::stoull(testing::Slurp(rss));
  const uint64_t output_bytes = fs::file_size(out);
  RecordProperty("peak_rss_kib", std::to_string(peak_kib));
  RecordProperty("output_bytes", std::to_string(output_bytes));
  EXPECT_LT(peak_kib * 1024, 48 * kMiB) << peak_kib << " KiB";
  // 1 MiB in granules of 4 KiB: 256 lines at the very most (here 1: every
  // granule holds data).
  EXPECT_LT(output_bytes, 256u * 200) << output_bytes << " bytes";
  EXPECT_TRUE(Has(testing::Slurp(out), "\"data\":true") || Has(testing::Slurp(out), "\"data\": true"))
      << testing::Slurp(out).substr(0, 400);
}

TEST_F(LyingPeerTest, Issue35BackupOfOneByteExtentsKeepsToItsMemory) {
  json r = testing::RunResult(Barge("backup --json --memory 16M --threads 2 --source " + Q(server_->uri()) +
                                    " --target " + Q(dir_ / "b") + " --name lying"));
  const uint64_t peak = r.value("peak_rss_bytes", uint64_t{0});
  RecordProperty("peak_rss_bytes", std::to_string(peak));
  ASSERT_GT(peak, 0u);
  // As BackupMemoryTest: --memory plus 32 MiB for the binary, its
  // libraries and arenas (a 1 MiB disk of honest extents peaks near 27 MiB).
  EXPECT_LT(peak, 16 * kMiB + 32 * kMiB) << peak / kMiB << " MiB";
}

// 2 PiB is the most a qcow2 of 64 KiB clusters holds (a 32 MiB L1 table);
// a bigger export is refused before its block status is walked for hours.
TEST(Qcow2LimitTest, Issue35ExportLargerThanQcow2HoldsIsRefusedAtOnce) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string sock = dir / "big.sock";
  testing::SocketServer big("nbdkit -f --exit-with-parent -U " + Q(sock) + " memory 4P", sock);
  ASSERT_TRUE(big.WaitReady());
  const auto start = std::chrono::steady_clock::now();
  auto r = testing::Run("timeout 60 " + Barge("backup --json --source " + Q(big.uri()) + " --target " +
                                              Q(dir / "b") + " --name big"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds, 10.0);
  EXPECT_TRUE(Has(r.output, "InvalidArgument")) << r.output;
  EXPECT_TRUE(Has(r.output, "holds at most 2")) << r.output;
  EXPECT_FALSE(fs::exists(dir / "b/big")) << "a refused disk leaves no chain folder";
}

// Every command that shows a source: the password, the PSK identity and
// the key file's name never appear, in text, --json, records or catalog.
class CredentialsTest : public ::testing::Test {
 protected:
  static constexpr const char* kSecrets[] = {"hunter2", "bob", "secret-keys"};

  void ExpectNoSecret(const std::string& text, const std::string& what) {
    for (const char* s : kSecrets) EXPECT_FALSE(Has(text, s)) << what << " shows '" << s << "':\n" << text;
  }

  TempDir dir_;
};

TEST_F(CredentialsTest, Issue35PolicyCheckShowsNoCredential) {
  const std::string policy = dir_ / "p.yaml";
  fs::create_directories(dir_ / "t");
  testing::WriteText(policy, "name: creds\nsources:\n  - nbd: 'nbds://bob:hunter2@127.0.0.1:9/vda?tls-psk-file=" +
                                 (dir_ / "secret-keys.psk") + "&tls-username=bob'\n    name: vda\ntargets: [" +
                                 (dir_ / "t") + "]\n");
  auto text = testing::Run(Barge("policy check " + Q(policy)));
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_TRUE(Has(text.output, "nbds://127.0.0.1:9/vda")) << text.output;
  ExpectNoSecret(text.output, "policy check");
  auto js = testing::Run(Barge("policy check --json " + Q(policy)));
  EXPECT_EQ(js.exit_code, 0) << js.output;
  ExpectNoSecret(js.output, "policy check --json");
  // A problem that quotes the location.
  testing::WriteText(policy, "name: creds\nsources:\n  - image: 'https://carol:hunter2@example.com/x?token=secret-keys'\n"
                             "targets: [" + (dir_ / "t") + "]\n");
  auto bad = testing::Run(Barge("policy check --json " + Q(policy)));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  ExpectNoSecret(bad.output, "policy check of a bad file");
}

// A remote hypervisor's URI with a password and a key file: vm backup's
// error names the host, not them.
TEST_F(CredentialsTest, Issue35VmBackupErrorShowsNoCredential) {
  BARGE_REQUIRE_TOOL("ssh");
  const std::string uri = "qemu+ssh://root:hunter2@127.0.0.1:1/system?keyfile=" + (dir_ / "secret-keys") +
                          "&no_tty=1";
  auto r = testing::Run("BARGE_CATALOG=" + Q(dir_ / "c.db") + " timeout 60 " +
                        Barge("vm backup --json --connect " + Q(uri) + " --domain vm1 --target " + Q(dir_ / "t")));
  EXPECT_NE(r.exit_code, 0) << r.output;
  ExpectNoSecret(r.output, "vm backup");
}

// libnbd names the PSK file and the identity when the identity is not in
// the file ("FILE: username bob was not found in PSK file").
TEST_F(CredentialsTest, Issue35NbdErrorsAndRunRecordsShowNoCredential) {
  BARGE_REQUIRE_TOOL("nbdkit");
  const std::string server_psk = dir_ / "server.psk", client_psk = dir_ / "secret-keys.psk";
  const std::string key = "0123456789abcdef0123456789abcdef";
  testing::WriteText(server_psk, "alice:" + key + "\n");
  testing::WriteText(client_psk, "alice:" + key + "\n");
  fs::permissions(server_psk, fs::perms::owner_read | fs::perms::owner_write);
  fs::permissions(client_psk, fs::perms::owner_read | fs::perms::owner_write);
  const std::string sock = dir_ / "psk.sock";
  testing::SocketServer server("nbdkit -f --exit-with-parent --tls=require --tls-psk=" + Q(server_psk) + " -U " +
                                   Q(sock) + " pattern 1M",
                               sock);
  ASSERT_TRUE(server.WaitReady());
  const std::string uri = "nbds+unix://bob:hunter2@/?socket=" + sock + "&tls-psk-file=" + client_psk;

  auto backup = testing::Run(Barge("backup --json --source " + Q(uri) + " --target " + Q(dir_ / "b") + " --name d"));
  EXPECT_NE(backup.exit_code, 0) << backup.output;
  EXPECT_TRUE(Has(backup.output, "PSK")) << "libnbd's reason stays: " << backup.output;
  ExpectNoSecret(backup.output, "backup");
  auto text = testing::Run(Barge("backup --source " + Q(uri) + " --target " + Q(dir_ / "b") + " --name d"));
  EXPECT_NE(text.exit_code, 0) << text.output;
  ExpectNoSecret(text.output, "backup (text)");

  // The same source in a policy: its run fails; the record says why.
  const std::string policy = dir_ / "p.yaml", cat = dir_ / "catalog.db";
  fs::create_directories(dir_ / "t");
  testing::WriteText(policy, "name: creds\nsources:\n  - nbd: '" + uri + "'\n    name: d\ntargets: [" + (dir_ / "t") +
                                 "]\nfree_space_multiple: 0\n");
  auto run = testing::Run("BARGE_CATALOG=" + Q(cat) + " " + Barge("run --force --json --policy " + Q(policy)));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Has(run.output, "PSK")) << run.output;
  ExpectNoSecret(run.output, "policy run");
  auto runs = testing::Run("BARGE_CATALOG=" + Q(cat) + " " + Barge("runs list --json --policy creds"));
  EXPECT_EQ(runs.exit_code, 0) << runs.output;
  EXPECT_TRUE(Has(runs.output, "failed")) << runs.output;
  ExpectNoSecret(runs.output, "runs list");
  for (const std::string& file : {cat, cat + "-wal"}) {
    if (fs::exists(file)) ExpectNoSecret(testing::Slurp(file), file);
  }
}

// A half-sent request used to hold one of civetweb's two workers for 30 s:
// 64 of them kept /healthz waiting for many minutes.
TEST(ServeHalfOpenTest, Issue35HealthzAnswersWhileManyHalfOpenConnectionsAreHeld) {
  TempDir dir;
  testing::WriteFile(dir / "quick.raw", testing::RandomBytes(1 << 20, 6));
  fs::create_directories(dir / "t");
  const std::string policy = dir / "srv.yaml";
  testing::WriteText(policy, "name: srv\nsources:\n  - image: " + (dir / "quick.raw") +
                                 "\nschedule: '@daily'\ntargets: [" + (dir / "t") + "]\nfree_space_multiple: 0\n");
  Background serve(Barge() + " serve --policy " + Q(policy) + " --listen 127.0.0.1:0 --json", dir / "out",
                   dir / "err", {{"BARGE_CATALOG", dir / "catalog.db"}});
  auto port_of = [&] {
    auto ready = EventsOf(serve.out(), "ready");
    return ready.empty() ? 0 : ready.front().value("port", 0);
  };
  ASSERT_TRUE(WaitFor([&] { return port_of() > 0; }, std::chrono::seconds(30))) << serve.err();
  const int port = port_of();
  ASSERT_EQ(HttpGet(port, "/healthz").status, 200);

  std::vector<int> held;
  for (int i = 0; i < 64; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n";  // never ended
    ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
    held.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  HttpReply health = HttpGet(port, "/healthz");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int fd : held) ::close(fd);
  RecordProperty("healthz_seconds", std::to_string(seconds));
  EXPECT_EQ(health.status, 200) << "after " << seconds << " s";
  EXPECT_LT(seconds, 8.0);
  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(std::chrono::seconds(30)), 143) << serve.err();
}

}  // namespace
}  // namespace barge
