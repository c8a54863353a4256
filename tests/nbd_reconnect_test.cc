// A dropped NBD connection costs nothing (issue 20, section 3): backup,
// convert and restore --to through a TCP proxy of the test's own that cuts
// or stalls the connection after N bytes. The copy reconnects, sends again
// only what had not completed (the proxy counts the bytes), and its output
// is identical to the source; a connection that never comes back fails the
// command within the bounds (--nbd-retries, --nbd-retry-time), with a clear
// error and no output file or staged temporary left.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/barge_child.h"
#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Has;
using ::barge::testing::Q;
using ::barge::testing::RunOk;
using ::barge::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

std::string LogText(const std::string& path) {
  std::vector<std::byte> bytes = testing::ReadFile(path);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A TCP proxy on 127.0.0.1 (an ephemeral port) in front of a server's Unix
// socket. It counts the bytes it forwards each way and, once the count of
// one way (server to client, or with `count_uploads` client to server)
// reaches `cut_after_bytes`, does what `mode` says to every connection
// open then. Threads: one accepting, two per connection.
class CuttingProxy {
 public:
  enum class Mode {
    kCutOnce,         // close them; later connections pass normally
    kCutThenRefuse,   // close them, and every later connection at once
    kStallOnce,       // stop forwarding the server's replies on them (the sockets
                      // stay open until the client closes); later ones pass
  };

  // On `port`, or an ephemeral one when 0 (a later proxy on the same port
  // gives a later run the same URI).
  CuttingProxy(std::string upstream_socket, uint64_t cut_after_bytes, Mode mode, bool count_uploads = false,
               int port = 0)
      : upstream_(std::move(upstream_socket)), cut_after_(cut_after_bytes), mode_(mode),
        count_uploads_(count_uploads) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 16) != 0) {
      ADD_FAILURE() << "proxy: cannot listen on 127.0.0.1";
      return;
    }
    socklen_t len = sizeof(addr);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }

  ~CuttingProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    if (acceptor_.joinable()) acceptor_.join();
    {
      std::lock_guard lock(mu_);
      for (const Link& l : links_) {
        ::shutdown(l.client, SHUT_RDWR);
        ::shutdown(l.server, SHUT_RDWR);
      }
    }
    for (std::thread& t : threads_) t.join();
    for (const Link& l : links_) {
      ::close(l.client);
      ::close(l.server);
    }
    ::close(listen_fd_);
  }

  std::string uri() const { return "nbd://127.0.0.1:" + std::to_string(port_) + "/"; }
  int port() const { return port_; }
  uint64_t bytes_to_client() const { return to_client_; }
  uint64_t bytes_to_server() const { return to_server_; }
  int connections() const { return accepted_; }
  bool tripped() const { return tripped_; }

 private:
  struct Link {
    int client;
    int server;
    bool stalled = false;
  };

  void Accept() {
    while (!stop_) {
      int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) return;
      ++accepted_;
      if (tripped_ && mode_ == Mode::kCutThenRefuse) {
        ::close(client);
        continue;
      }
      int server = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", upstream_.c_str());
      if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ::close(server);
        ::close(client);
        continue;
      }
      std::lock_guard lock(mu_);
      size_t index = links_.size();
      links_.push_back({client, server});
      threads_.emplace_back([this, index, client, server] { Pump(index, server, client, true); });
      threads_.emplace_back([this, index, client, server] { Pump(index, client, server, false); });
    }
  }

  // Copies `from` to `to` until either side closes.
  void Pump(size_t index, int from, int to, bool to_client) {
    std::vector<char> buf(64 * 1024);
    for (;;) {
      ssize_t n = ::read(from, buf.data(), buf.size());
      if (n <= 0) break;
      while (to_client && Stalled(index) && !stop_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (stop_) break;
      if (!WriteAll(to, buf.data(), static_cast<size_t>(n))) break;
      uint64_t count = (to_client ? to_client_ : to_server_) += static_cast<uint64_t>(n);
      if (to_client != count_uploads_ && count >= cut_after_ && !tripped_.exchange(true)) Trip();
    }
    ::shutdown(to, SHUT_RDWR);
    ::shutdown(from, SHUT_RDWR);
  }

  bool Stalled(size_t index) {
    std::lock_guard lock(mu_);
    return links_[index].stalled;
  }

  // What happens to the connections open when the count is reached.
  void Trip() {
    std::lock_guard lock(mu_);
    for (Link& l : links_) {
      if (mode_ == Mode::kStallOnce) {
        l.stalled = true;
      } else {
        ::shutdown(l.client, SHUT_RDWR);
        ::shutdown(l.server, SHUT_RDWR);
      }
    }
  }

  static bool WriteAll(int fd, const char* data, size_t n) {
    while (n > 0) {
      ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      data += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  const std::string upstream_;
  const uint64_t cut_after_;
  const Mode mode_;
  const bool count_uploads_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> tripped_{false};
  std::atomic<uint64_t> to_client_{0};
  std::atomic<uint64_t> to_server_{0};
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<Link> links_;           // guarded by mu_
  std::vector<std::thread> threads_;  // guarded by mu_
};

class NbdReconnectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-nbd");
    BARGE_REQUIRE_TOOL("qemu-img");
    // Random data throughout, so every byte is read (nothing is a hole).
    disk_ = dir_ / "disk.raw";
    testing::WriteFile(disk_, testing::RandomBytes(kDiskBytes, 20));
  }

  // qemu-nbd serving the disk on a Unix socket (the proxy's upstream);
  // --shared=4 lets barge open four connections (multi-conn).
  void Serve(bool writable = false, const std::string& image = "") {
    std::string socket = dir_ / ("nbd" + std::to_string(servers_.size()) + ".sock");
    servers_.push_back(std::make_unique<testing::SocketServer>(
        std::string("qemu-nbd -t --shared=4 -f raw ") + (writable ? "" : "-r ") + "--socket=" + Q(socket) + " " +
            Q(image.empty() ? disk_ : image),
        socket));
    ASSERT_TRUE(servers_.back()->WaitReady());
    socket_ = socket;
  }

  // No file in the backup folder or beside the output but what `keep` names.
  static std::vector<std::string> Files(const std::string& folder) {
    std::vector<std::string> names;
    if (!std::filesystem::exists(folder)) return names;
    for (const auto& e : std::filesystem::recursive_directory_iterator(folder)) {
      if (e.is_regular_file()) names.push_back(e.path().string());
    }
    return names;
  }

  static constexpr uint64_t kDiskBytes = 64 * kMiB;
  TempDir dir_;
  std::string disk_;
  std::string socket_;
  std::vector<std::unique_ptr<testing::SocketServer>> servers_;
};

TEST_F(NbdReconnectTest, BackupSurvivesOneCutAndRereadsOnlyWhatWasMissing) {
  Serve();
  CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutOnce);
  std::string target = dir_ / "backups";
  CommandResult r = testing::Run(Barge("backup --source " + Q(proxy.uri()) + " --target " + Q(target) +
                                       " --name vda --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(proxy.tripped());
  json result = testing::ResultOf(r.stdout_text);
  std::vector<json> events = testing::Events(r.stdout_text);
  int reconnects = 0;
  for (const json& e : events) {
    if (e["event"] != "reconnect") continue;
    ++reconnects;
    EXPECT_EQ(e.value("uri", ""), proxy.uri()) << e.dump();
    EXPECT_GE(e.value("attempts", 0), 1) << e.dump();
    EXPECT_FALSE(e.value("reason", "").empty()) << e.dump();
  }
  EXPECT_GE(reconnects, 1) << r.stdout_text;
  // Every event, the reconnects too, against docs/json.md's schemas.
  if (testing::HaveTool("python3")) {
    std::string events_file = dir_ / "events.ndjson";
    testing::WriteText(events_file, r.stdout_text);
    CommandResult check = testing::Run("python3 " + Q(std::string(BARGE_SOURCE_DIR) + "/tests/json_schema_test.py") +
                                       " --check 0 backup < " + Q(events_file));
    EXPECT_TRUE(check.exit_code == 0 || (check.exit_code == 77 && !testing::ToolsRequired())) << check.output;
  }
  // Each reconnect is one readable line on stderr too.
  EXPECT_TRUE(Has(r.stderr_text, "barge: reconnected: " + proxy.uri())) << r.stderr_text;
  // What completed before the cut was not read again.
  RecordProperty("bytes_to_client", std::to_string(proxy.bytes_to_client()));
  EXPECT_LT(proxy.bytes_to_client(), kDiskBytes * 13 / 10) << proxy.bytes_to_client();
  EXPECT_GT(proxy.connections(), 1);

  std::string image = result.value("image", "");
  CommandResult cmp = testing::Run("qemu-img compare -f qcow2 -F raw " + Q(image) + " " + Q(disk_));
  EXPECT_EQ(cmp.exit_code, 0) << cmp.output;
  std::string v = RunOk(Barge("verify " + Q(target + "/vda") + " --against " + Q(disk_)));
  EXPECT_TRUE(Has(v, "the source matches")) << v;
}

TEST_F(NbdReconnectTest, ConvertSurvivesOneCut) {
  Serve();
  CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutOnce);
  std::string out = dir_ / "copy.raw";
  CommandResult r = testing::Run(Barge("convert " + Q(proxy.uri()) + " " + Q(out)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(proxy.tripped());
  EXPECT_TRUE(Has(r.stderr_text, "barge: reconnected: ")) << r.stderr_text;
  EXPECT_LT(proxy.bytes_to_client(), kDiskBytes * 13 / 10) << proxy.bytes_to_client();
  RunOk("cmp " + Q(out) + " " + Q(disk_));
}

TEST_F(NbdReconnectTest, StalledConnectionIsReplacedAfterNbdTimeout) {
  Serve();
  CuttingProxy proxy(socket_, kDiskBytes / 4, CuttingProxy::Mode::kStallOnce);
  std::string out = dir_ / "copy.raw";
  auto start = std::chrono::steady_clock::now();
  CommandResult r = testing::Run(Barge("convert --nbd-timeout 1 " + Q(proxy.uri()) + " " + Q(out) + " --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  bool stalled = false;
  for (const json& e : testing::Events(r.stdout_text)) {
    if (e["event"] == "reconnect" && Has(e.value("reason", ""), "no reply")) stalled = true;
  }
  EXPECT_TRUE(stalled) << r.output;
  RunOk("cmp " + Q(out) + " " + Q(disk_));
}

TEST_F(NbdReconnectTest, RestoreToNbdSurvivesOneCut) {
  // A backup of the disk, restored into a writable export through the proxy.
  std::string target = dir_ / "backups";
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name vda"));
  std::string blank = dir_ / "blank.raw";
  RunOk("truncate -s " + std::to_string(kDiskBytes) + " " + Q(blank));
  Serve(/*writable=*/true, blank);
  // The restore writes: cut after 30% of the data went up.
  CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutOnce, /*count_uploads=*/true);
  CommandResult r = testing::Run(Barge("restore " + Q(target + "/vda") + " --to " + Q(proxy.uri())));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(proxy.tripped());
  EXPECT_TRUE(Has(r.stderr_text, "barge: reconnected: ")) << r.stderr_text;
  EXPECT_LT(proxy.bytes_to_server(), kDiskBytes * 13 / 10) << proxy.bytes_to_server();
  servers_.clear();  // qemu-nbd has written everything when it exits
  RunOk("cmp " + Q(blank) + " " + Q(disk_));
}

// The target stalls (its replies stop coming after 30% of the data went
// up, the connections stay open), for `restore --to` and `replicate --to`:
// each stalled connection is replaced after --nbd-timeout, the writes
// without a reply are sent again, and the export ends up equal to the disk.
TEST_F(NbdReconnectTest, StalledTargetIsReplacedAfterNbdTimeout) {
  std::string target = dir_ / "backups";
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name vda"));
  // --force: qemu-nbd reports the blank file's holes as data.
  const std::vector<std::string> writers = {"restore " + Q(target + "/vda"),
                                            "replicate " + Q(disk_) + " --force --state-dir " + Q(dir_ / "state")};
  for (size_t i = 0; i < writers.size(); ++i) {
    const std::string& writer = writers[i];
    SCOPED_TRACE(writer);
    std::string blank = dir_ / ("blank" + std::to_string(i) + ".raw");
    RunOk("truncate -s " + std::to_string(kDiskBytes) + " " + Q(blank));
    Serve(/*writable=*/true, blank);
    CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kStallOnce, /*count_uploads=*/true);
    auto start = std::chrono::steady_clock::now();
    CommandResult r = testing::Run(Barge(writer + " --nbd-timeout 1 --to " + Q(proxy.uri()) + " --json"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
    EXPECT_TRUE(proxy.tripped());
    bool stalled = false;
    for (const json& e : testing::Events(r.stdout_text)) {
      if (e["event"] == "reconnect" && Has(e.value("reason", ""), "no reply")) stalled = true;
    }
    EXPECT_TRUE(stalled) << r.output;
    servers_.clear();  // qemu-nbd has written everything when it exits
    RunOk("cmp " + Q(blank) + " " + Q(disk_));
  }
}

// replicate to an export whose connection is lost for good at about half
// the upload: the run fails, keeping its journal (in --state-dir) for the
// export; the next run, the export reachable again at the same URI, reads
// the journalled part back from it, checks it, and writes only the rest.
TEST_F(NbdReconnectTest, ReplicateToExportLostForGoodResumesOnTheNextRun) {
  std::string blank = dir_ / "blank.raw";
  RunOk("truncate -s " + std::to_string(kDiskBytes) + " " + Q(blank));
  Serve(/*writable=*/true, blank);
  const std::string state = dir_ / "state";
  int port = 0;
  {
    CuttingProxy proxy(socket_, kDiskBytes / 2, CuttingProxy::Mode::kCutThenRefuse, /*count_uploads=*/true);
    port = proxy.port();
    // --force: qemu-nbd reports the sparse file's holes as data.
    json error = testing::RunError(Barge("replicate " + Q(disk_) + " --to " + Q(proxy.uri()) + " --state-dir " +
                                         Q(state) + " --force --nbd-retries 2 --json"),
                                   1);
    EXPECT_TRUE(proxy.tripped());
    EXPECT_TRUE(Has(error.value("message", ""), "the next run of this replicate resumes")) << error.dump();
  }
  bool journal = false;
  for (const std::string& f : Files(state)) journal = journal || f.ends_with(".barge-resume");
  ASSERT_TRUE(journal);
  // The export is unreachable on the next run (nothing listens on the
  // port): that run fails, and the journal stays for the one after.
  CommandResult down = testing::Run(Barge("replicate " + Q(disk_) + " --to nbd://127.0.0.1:" + std::to_string(port) + "/" +
                                          " --state-dir " + Q(state) + " --nbd-retries 0 --json"));
  ASSERT_EQ(down.exit_code, 1) << down.output;
  journal = false;
  for (const std::string& f : Files(state)) journal = journal || f.ends_with(".barge-resume");
  ASSERT_TRUE(journal) << down.output;
  CuttingProxy again(socket_, ~uint64_t{0}, CuttingProxy::Mode::kCutOnce, /*count_uploads=*/true, port);
  ASSERT_EQ(again.port(), port);
  // No --force: the journal names the export.
  CommandResult r = testing::Run(Barge("replicate " + Q(disk_) + " --to " + Q(again.uri()) + " --state-dir " +
                                       Q(state) + " --verify --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json result = testing::ResultOf(r.stdout_text);
  ASSERT_TRUE(result.contains("resume")) << result.dump();
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>()) << result.dump();
  uint64_t staged = result["resume"]["staged_bytes"].get<uint64_t>();
  EXPECT_GE(staged, kDiskBytes * 3 / 10) << result.dump();
  EXPECT_EQ(result["bytes_read"].get<uint64_t>(), kDiskBytes - staged);
  // Uploaded again: the rest (and the read-back went the other way).
  EXPECT_LT(again.bytes_to_server(), kDiskBytes * 7 / 10) << again.bytes_to_server();
  servers_.clear();
  RunOk("cmp " + Q(blank) + " " + Q(disk_));
}

TEST_F(NbdReconnectTest, ConnectionThatNeverComesBackFailsWithinTheAttempts) {
  Serve();
  CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutThenRefuse);
  std::string target = dir_ / "backups";
  json error = testing::RunError(Barge("backup --source " + Q(proxy.uri()) + " --target " + Q(target) +
                                       " --name vda --nbd-retries 3 --json"),
                                 1);
  EXPECT_EQ(error.value("code", ""), "IoError") << error.dump();
  std::string message = error.value("message", "");
  EXPECT_TRUE(Has(message, "NBD connection lost")) << message;
  EXPECT_TRUE(Has(message, "3 reconnect attempts")) << message;
  // Nothing that looks finished: no image or manifest. The staged image and
  // its resume journal stay (the source failed, not the target), so that
  // the next run of this backup resumes from them (docs/formats/resume.md).
  EXPECT_TRUE(Has(message, "the next run of this backup resumes")) << message;
  for (const std::string& f : Files(target)) {
    const bool staged = f.ends_with(".qcow2.barge-tmp") || f.ends_with(".barge-resume");
    EXPECT_TRUE(staged || !(Has(f, ".qcow2") || Has(f, ".tmp") || Has(f, ".json"))) << f;
  }
  // And convert leaves no output either.
  std::string out = dir_ / "copy.raw";
  CuttingProxy proxy2(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutThenRefuse);
  CommandResult c = testing::Run(Barge("convert --nbd-retries 2 " + Q(proxy2.uri()) + " " + Q(out)));
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_TRUE(Has(c.stderr_text, "barge: IoError: ")) << c.stderr_text;
  for (const std::string& f : Files(dir_.path().string())) EXPECT_FALSE(Has(f, "copy.raw")) << f;
}

TEST_F(NbdReconnectTest, ConnectionThatNeverComesBackFailsWithinTheTime) {
  Serve();
  CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutThenRefuse);
  std::string out = dir_ / "copy.raw";
  auto start = std::chrono::steady_clock::now();
  CommandResult r =
      testing::Run(Barge("convert --nbd-retries 100 --nbd-retry-time 1.5 " + Q(proxy.uri()) + " " + Q(out)));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "not restored")) << r.stderr_text;
  // 100 attempts would take minutes of backoff; the time bound ends it.
  EXPECT_LT(took, std::chrono::seconds(15));
  for (const std::string& f : Files(dir_.path().string())) EXPECT_FALSE(Has(f, "copy.raw")) << f;
}

TEST_F(NbdReconnectTest, ReplicateAndVerifyAgainstSurviveOneCut) {
  Serve();
  {
    CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutOnce);
    std::string a = dir_ / "a.raw", b = dir_ / "b.raw";
    CommandResult r = testing::Run(Barge("replicate " + Q(proxy.uri()) + " --to " + Q(a) + " --to " + Q(b)));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(proxy.tripped());
    EXPECT_TRUE(Has(r.stderr_text, "barge: reconnected: ")) << r.stderr_text;
    RunOk("cmp " + Q(a) + " " + Q(disk_));
    RunOk("cmp " + Q(b) + " " + Q(disk_));
  }
  std::string target = dir_ / "backups";
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name vda"));
  CuttingProxy proxy(socket_, kDiskBytes * 3 / 10, CuttingProxy::Mode::kCutOnce);
  CommandResult v = testing::Run(Barge("verify " + Q(target + "/vda") + " --against " + Q(proxy.uri())));
  ASSERT_EQ(v.exit_code, 0) << v.output;
  EXPECT_TRUE(proxy.tripped());
  EXPECT_TRUE(Has(v.stdout_text, "the source matches")) << v.output;
  EXPECT_TRUE(Has(v.stderr_text, "barge: reconnected: ")) << v.stderr_text;
}

// The first connection is retried within the same bounds as a reconnect:
// a command started before its server (a hypervisor's export that comes up
// a moment later) waits for it; one whose server never comes fails once
// the bounds are passed, saying how many attempts it made.
TEST_F(NbdReconnectTest, FirstConnectionWaitsForAServerThatStartsLate) {
  std::string socket = dir_ / "nbd0.sock";  // Serve()'s first socket
  std::string out = dir_ / "copy.raw";
  std::string log = dir_ / "convert.log";
  testing::BargeChild child({"convert", "--nbd-retries", "10", "--nbd-retry-time", "30",
                             "nbd+unix:///?socket=" + socket, out},
                            log);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(child.Running()) << LogText(log);  // still trying
  Serve();
  ASSERT_EQ(socket_, socket);
  EXPECT_EQ(child.Wait(), 0) << LogText(log);
  RunOk("cmp " + Q(out) + " " + Q(disk_));

  // Nothing ever listens: the bounds end it (2 retries: 3 attempts).
  std::string missing = dir_ / "never.sock";
  CommandResult r = testing::Run(Barge("convert --nbd-retries 2 " + Q("nbd+unix:///?socket=" + missing) + " " +
                                       Q(dir_ / "never.raw")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "no NBD server answered: 3 connection attempts")) << r.stderr_text;
  // Retries off: one attempt, libnbd's own error.
  CommandResult once = testing::Run(Barge("convert --nbd-retries 0 " + Q("nbd+unix:///?socket=" + missing) + " " +
                                          Q(dir_ / "never.raw")));
  EXPECT_EQ(once.exit_code, 1) << once.output;
  EXPECT_FALSE(Has(once.stderr_text, "connection attempts")) << once.stderr_text;
}

// An error the server answers on a live connection is about the data, not
// the network: it fails the command at once, with no reconnect.
TEST_F(NbdReconnectTest, ServerErrorIsNotRetried) {
  BARGE_REQUIRE_TOOL("nbdkit");
  std::string socket = dir_ / "eio.sock";
  servers_.push_back(std::make_unique<testing::SocketServer>(
      "nbdkit -f --exit-with-parent -U " + Q(socket) +
          " --filter=error pattern 16M error-pread=EIO error-pread-rate=100%",
      socket));
  ASSERT_TRUE(servers_.back()->WaitReady());
  CuttingProxy proxy(socket, ~0ull, CuttingProxy::Mode::kCutOnce);
  std::string target = dir_ / "backups";
  CommandResult r = testing::Run(Barge("backup --source " + Q(proxy.uri()) + " --target " + Q(target) +
                                       " --name vda"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "barge: IoError: ")) << r.stderr_text;
  EXPECT_FALSE(Has(r.stderr_text, "reconnected")) << r.stderr_text;
  EXPECT_FALSE(Has(r.stderr_text, "connection lost")) << r.stderr_text;
  EXPECT_FALSE(proxy.tripped());
}

TEST_F(NbdReconnectTest, FlagsAreCheckedAndListed) {
  CommandResult r = testing::Run(Barge("convert --nbd-retries 101 a b"));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.output, "--nbd-retries must be from 0 to 100")) << r.output;
  for (const char* command : {"backup", "convert", "replicate", "restore", "verify"}) {
    std::string help = RunOk(Barge(std::string(command) + " --help"));
    EXPECT_TRUE(Has(help, "--nbd-retries")) << command;
    EXPECT_TRUE(Has(help, "--nbd-retry-time")) << command;
    EXPECT_TRUE(Has(help, "--nbd-timeout")) << command;
  }
}

}  // namespace
}  // namespace barge
