// barge serve end to end (issue 15): /healthz and /metrics on one address,
// sd_notify's READY/RELOADING/STOPPING through $NOTIFY_SOCKET, SIGHUP
// reloads (a bad file is reported and the old policy kept; a changed reason
// runs at once), SIGTERM stopping the run in progress (recorded failed
// "stopped by SIGTERM", no partial files, exit 143); and a real Prometheus
// on 127.0.0.1 scraping it with the shipped rules: the missing-backup alert
// fires while a source keeps failing past max_duration_without_backup and
// resolves after it succeeds (Prometheus's HTTP API).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <sys/un.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>

#include "tests/policy_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace policy_testing;

using testing::RunOk;
using testing::TempDir;

void WriteText(const std::string& path, const std::string& text) {
  testing::WriteFile(path, std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                                  reinterpret_cast<const std::byte*>(text.data()) + text.size()));
}

// The receiving end of sd_notify: an AF_UNIX datagram socket.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~NotifySocket() { ::close(fd_); }
  bool bound() const { return bound_; }
  // Every message received so far, in order.
  const std::vector<std::string>& messages() {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd_, buf, sizeof buf, 0)) > 0;) messages_.emplace_back(buf, static_cast<size_t>(n));
    return messages_;
  }
  // Index of the first message at or after `from` containing `text`; -1 if none.
  int Find(const std::string& text, size_t from = 0) {
    const auto& m = messages();
    for (size_t i = from; i < m.size(); ++i) {
      if (m[i].find(text) != std::string::npos) return static_cast<int>(i);
    }
    return -1;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
  std::vector<std::string> messages_;
};

// The port of serve's "ready" event (0 until it printed one).
int ServePort(Background& serve) {
  auto ready = EventsOf(serve.out(), "ready");
  return ready.empty() ? 0 : ready.front().value("port", 0);
}

TEST(PolicyServeTest, HealthMetricsReloadNotifyAndSigterm) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string sock = dir / "slow.sock", cat = dir / "catalog.db", policy = dir / "srv.yaml";
  testing::SocketServer slow("nbdkit -f -U " + Q(sock) + " --filter=delay pattern 256M rdelay=200ms", sock);
  ASSERT_TRUE(slow.WaitReady());
  testing::WriteFile(dir / "quick.raw", testing::RandomBytes(1 << 20, 6));
  fs::create_directories(dir / "t");
  const std::string common = "schedule: '@daily'\ntargets: [" + (dir / "t") + "]\nfree_space_multiple: 0\n";
  WriteText(policy, "name: srv\nsources:\n  - image: " + (dir / "quick.raw") + "\n" + common);
  NotifySocket notify(dir / "notify.sock");
  ASSERT_TRUE(notify.bound());

  Background serve(Barge() + " serve --policy " + Q(policy) + " --listen 127.0.0.1:0 --json", dir / "out",
                   dir / "err", {{"BARGE_CATALOG", cat}, {"NOTIFY_SOCKET", dir / "notify.sock"}});
  ASSERT_TRUE(WaitFor([&] { return ServePort(serve) > 0; }, std::chrono::seconds(30))) << serve.err();
  const int port = ServePort(serve);
  ASSERT_TRUE(WaitFor([&] { return notify.Find("READY=1") >= 0; }, std::chrono::seconds(10)));
  // Never backed up: the first pass backs it up at once.
  ASSERT_TRUE(WaitFor([&] { return !EventsOf(serve.out(), "run").empty(); }, std::chrono::seconds(60)))
      << serve.out() << serve.err();
  json run = EventsOf(serve.out(), "run").front();
  EXPECT_EQ(run.at("sources")[0].at("result"), "success") << run.dump();

  HttpReply health = HttpGet(port, "/healthz");
  ASSERT_EQ(health.status, 200) << health.body;
  json h = json::parse(health.body);
  EXPECT_EQ(h.at("status"), "ok");
  EXPECT_EQ(h.at("policy"), "srv");
  EXPECT_EQ(h.at("runs"), 1);
  HttpReply metrics = HttpGet(port, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.body.find("barge_policy_runs_total{policy=\"srv\",source=\"quick\",result=\"success\"} 1"),
            std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("barge_policy_target_free_bytes{policy=\"srv\",target=\"" + (dir / "t") + "\"}"),
            std::string::npos);
  EXPECT_EQ(HttpGet(port, "/nothing").status, 404);

  // A bad file: reported, the old policy kept, systemd told RELOADING then READY.
  WriteText(policy, "name: [srv\n");
  size_t before = notify.messages().size();
  serve.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return !EventsOf(serve.out(), "warning").empty(); }, std::chrono::seconds(10)));
  EXPECT_NE(EventsOf(serve.out(), "warning")[0].at("message").get<std::string>().find("reload failed; keeping policy srv"),
            std::string::npos);
  ASSERT_TRUE(WaitFor([&] { return notify.Find("READY=1", before) >= 0; }, std::chrono::seconds(10)));
  int reloading = notify.Find("RELOADING=1", before);
  EXPECT_GE(reloading, 0);
  EXPECT_GT(notify.Find("READY=1", before), reloading);
  EXPECT_NE(notify.messages()[static_cast<size_t>(reloading)].find("MONOTONIC_USEC="), std::string::npos);
  EXPECT_EQ(HttpGet(port, "/healthz").status, 200);

  // A good one with a new reason and a slow source: runs at once.
  WriteText(policy, "name: srv\nreason: after-reload\nsources:\n  - image: " + (dir / "quick.raw") +
                        "\n  - nbd: " + slow.uri() + "\n    name: slow\n" + common);
  serve.Signal(SIGHUP);
  ASSERT_TRUE(WaitFor([&] { return EventsOf(serve.out(), "ready").size() == 2; }, std::chrono::seconds(10)));
  EXPECT_EQ(EventsOf(serve.out(), "ready")[1].at("reloaded"), true);
  ASSERT_TRUE(WaitFor([&] {
    auto r = HttpGet(port, "/healthz");
    return r.status == 200 && json::parse(r.body, nullptr, false).value("running", false);
  }, std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the slow source's backup under way

  // SIGTERM: the run in progress stops; its records fail; barge exits 143.
  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(std::chrono::seconds(40)), 143) << serve.err();
  EXPECT_GE(notify.Find("STOPPING=1"), 0);
  auto runs = EventsOf(serve.out(), "run");
  ASSERT_EQ(runs.size(), 2u) << serve.out();
  for (const auto& s : runs[1].at("sources")) {
    if (s.at("source") == "quick") {
      EXPECT_EQ(s.at("result"), "success");
      EXPECT_EQ(s.at("trigger"), "reason");
    } else {
      EXPECT_EQ(s.at("result"), "failed");
      EXPECT_EQ(s.at("error").get<std::string>().rfind("stopped by SIGTERM", 0), 0u) << s.dump();
    }
  }
  // Its whole stdout, strictly: the four events and serve's own two
  // (ready, run); the result, then the error that says why it stopped.
  json result = testing::ResultOf(serve.out(), testing::Stream::kServe);
  json stopped = testing::ErrorOf(serve.out(), testing::Stream::kServe);
  EXPECT_EQ(stopped.value("code", ""), "Cancelled") << serve.out();
  EXPECT_EQ(stopped.value("exit_code", -1), 143) << serve.out();
  EXPECT_EQ(result.at("stopped_by"), "SIGTERM");
  EXPECT_EQ(result.at("runs"), 2);
  for (const auto& e : fs::recursive_directory_iterator(dir / "t")) {
    EXPECT_EQ(e.path().string().find("barge-tmp"), std::string::npos) << e.path();
    EXPECT_EQ(e.path().string().find("/slow/") != std::string::npos && e.path().extension() == ".json", false)
        << e.path();
  }
  auto listed = testing::RunResult("BARGE_CATALOG=" + Q(cat) + " " + Barge() +
                                   " runs list --policy srv --source slow --json");
  ASSERT_EQ(listed.at("runs").size(), 1u);
  EXPECT_EQ(listed.at("runs")[0].at("result"), "failed");
}

// Issue 18 under serve: a failed backup never costs a restore point
// (the disk moved away and an export whose reads fail, then a full
// target), and /healthz's last_error says which source fails and why.
TEST(PolicyServeTest, FailedBackupKeepsPointsAndHealthShowsTheError) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string cat = dir / "catalog.db", policy = dir / "keep.yaml", disk = dir / "d.raw";
  const std::string sock = dir / "n.sock", broken = dir / "reads-fail";
  testing::SocketServer nbd("nbdkit -f -U " + Q(sock) + " --filter=error pattern 2M error-pread=EIO "
                            "error-pread-rate=1 error-pread-file=" + Q(broken), sock);
  ASSERT_TRUE(nbd.WaitReady());
  testing::WriteFile(disk, testing::RandomBytes(1 << 20, 51));
  TmpfsMount tmpfs(dir / "t", "16m");
  fs::create_directories(dir / "t");
  auto write_policy = [&](const std::string& reason) {
    WriteText(policy, "name: keep\nreason: '" + reason + "'\nsources:\n  - image: " + disk + "\n    name: d\n"
                      "  - nbd: " + nbd.uri() + "\n    name: n\nretention_count: 2\ntargets: [" + (dir / "t") +
                      "]\nfree_space_multiple: 1\n");
  };
  write_policy("");
  for (int i = 0; i < 2; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    RunOk("BARGE_CATALOG=" + Q(cat) + " " + Barge() + " run --force --policy " + Q(policy));
  }
  ASSERT_EQ(Manifests(dir / "t/keep/d"), 2u);
  ASSERT_EQ(Manifests(dir / "t/keep/n"), 2u);

  // The disk moves away and the export's reads fail; a new reason makes
  // the first pass back up both at once.
  fs::rename(disk, dir / "moved.raw");
  WriteText(broken, "");
  write_policy("r1");
  Background serve(Barge() + " serve --policy " + Q(policy) + " --listen 127.0.0.1:0 --json", dir / "out",
                   dir / "err", {{"BARGE_CATALOG", cat}});
  ASSERT_TRUE(WaitFor([&] { return ServePort(serve) > 0; }, std::chrono::seconds(30))) << serve.err();
  const int port = ServePort(serve);
  ASSERT_TRUE(WaitFor([&] { return EventsOf(serve.out(), "run").size() == 1; }, std::chrono::seconds(60)))
      << serve.out() << serve.err();
  for (const auto& s : EventsOf(serve.out(), "run")[0].at("sources")) {
    EXPECT_EQ(s.at("result"), "failed") << s.dump();
    EXPECT_EQ(s.at("retention"), "") << s.dump();
  }
  EXPECT_EQ(Manifests(dir / "t/keep/d"), 2u);
  EXPECT_EQ(Manifests(dir / "t/keep/n"), 2u);
  ASSERT_TRUE(WaitFor([&] { return !json::parse(HttpGet(port, "/healthz").body, nullptr, false).value("running", true); },
                      std::chrono::seconds(10)));
  json h = json::parse(HttpGet(port, "/healthz").body);
  const std::string last_error = h.at("last_error");
  EXPECT_EQ(last_error.rfind("source d: NotFound", 0), 0u) << h.dump();
  EXPECT_NE(last_error.find("; source n: "), std::string::npos) << h.dump();

  // Back and readable, but the target is full.
  if (tmpfs.mounted()) {
    fs::rename(dir / "moved.raw", disk);
    fs::remove(broken);
    FillUpTo(dir / "t/filler", 256 << 10);
    write_policy("r2");
    serve.Signal(SIGHUP);
    ASSERT_TRUE(WaitFor([&] { return EventsOf(serve.out(), "run").size() == 2; }, std::chrono::seconds(60)))
        << serve.out() << serve.err();
    for (const auto& s : EventsOf(serve.out(), "run")[1].at("sources")) {
      EXPECT_EQ(s.at("result"), "failed") << s.dump();
      EXPECT_NE(s.at("error").get<std::string>().find("NoSpace"), std::string::npos) << s.dump();
    }
    EXPECT_EQ(Manifests(dir / "t/keep/d"), 2u);
    EXPECT_EQ(Manifests(dir / "t/keep/n"), 2u);
    ASSERT_TRUE(WaitFor([&] {
      return json::parse(HttpGet(port, "/healthz").body, nullptr, false).value("last_error", "").find("NoSpace") !=
             std::string::npos;
    }, std::chrono::seconds(10)));
    fs::remove(dir / "t/filler");
  }
  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(std::chrono::seconds(30)), 143) << serve.err();
  if (!tmpfs.mounted()) GTEST_SKIP() << "tmpfs not mounted (needs root): the full target not checked";
}

// Issue 18: a --listen address in use says so (not civetweb's "null
// context when constructing CivetServer").
TEST(PolicyServeTest, ListenAddressInUseSaysSo) {
  TempDir dir;
  fs::create_directories(dir / "t");
  WriteText(dir / "p.yaml", "name: busy\nsources:\n  - image: " + (dir / "d.raw") + "\ntargets: [" + (dir / "t") +
                                "]\n");
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::string listen = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  auto r = testing::Run("BARGE_CATALOG=" + Q(dir / "c.db") + " " + Barge() + " serve --policy " + Q(dir / "p.yaml") +
                        " --listen " + listen);
  ::close(fd);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("cannot listen on " + listen + ": Address already in use"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("null context"), std::string::npos) << r.output;
}

// `method` `path` on 127.0.0.1:port (HTTP/1.1, no body): the whole answer
// as sent, headers and all; "" when it cannot connect.
std::string RawRequest(int port, const std::string& method, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = method + " " + path +
                            " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) answer.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return answer;
}

// exposer_scrapes_total's value in a /metrics body (-1 when absent).
double Scrapes(const std::string& body) {
  const std::string name = "\nexposer_scrapes_total ";
  const size_t at = body.find(name);
  return at == std::string::npos ? -1 : std::stod(body.substr(at + name.size()));
}

// The status page answers HEAD as GET without the body and any other
// method 405 naming the two; /metrics counts its scrapes.
TEST(PolicyServeTest, StatusPageMethodsAndScrapeCount) {
  TempDir dir;
  const std::string cat = dir / "catalog.db", policy = dir / "m.yaml";
  testing::WriteFile(dir / "quick.raw", testing::RandomBytes(1 << 20, 7));
  fs::create_directories(dir / "t");
  WriteText(policy, "name: m\nsources:\n  - image: " + (dir / "quick.raw") + "\nschedule: '@daily'\ntargets: [" +
                        (dir / "t") + "]\nfree_space_multiple: 0\n");
  Background serve(Barge() + " serve --policy " + Q(policy) + " --listen 127.0.0.1:0 --json", dir / "out",
                   dir / "err", {{"BARGE_CATALOG", cat}});
  ASSERT_TRUE(WaitFor([&] { return ServePort(serve) > 0; }, std::chrono::seconds(30))) << serve.err();
  const int port = ServePort(serve);
  ASSERT_TRUE(WaitFor([&] { return !EventsOf(serve.out(), "run").empty(); }, std::chrono::seconds(60)))
      << serve.out() << serve.err();

  const std::string get = RawRequest(port, "GET", "/");
  ASSERT_EQ(get.rfind("HTTP/1.1 200 ", 0), 0u) << get;
  const std::string head = RawRequest(port, "HEAD", "/");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 ", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Type: text/html"), std::string::npos) << head;
  EXPECT_EQ(head.find("<html"), std::string::npos) << head;  // no body
  EXPECT_EQ(head.size(), head.find("\r\n\r\n") + 4) << head;
  for (const char* method : {"POST", "PUT", "DELETE"}) {
    const std::string refused = RawRequest(port, method, "/");
    EXPECT_EQ(refused.rfind("HTTP/1.1 405 ", 0), 0u) << method << ": " << refused;
    EXPECT_NE(refused.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << refused;
  }
  EXPECT_EQ(RawRequest(port, "HEAD", "/chain/0/0").rfind("HTTP/1.1 200 ", 0), 0u);
  EXPECT_EQ(RawRequest(port, "POST", "/chain/0/0").rfind("HTTP/1.1 405 ", 0), 0u);

  const double first = Scrapes(HttpGet(port, "/metrics").body);
  const double second = Scrapes(HttpGet(port, "/metrics").body);
  const double third = Scrapes(HttpGet(port, "/metrics").body);
  EXPECT_GE(first, 0);
  EXPECT_EQ(second, first + 1);
  EXPECT_EQ(third, first + 2);

  serve.Signal(SIGTERM);
  EXPECT_EQ(serve.Wait(std::chrono::seconds(30)), 143) << serve.err();
}

// Prometheus's firing alerts named `alert` for source `source`.
bool Firing(int prom_port, const std::string& alert, const std::string& source) {
  HttpReply r = HttpGet(prom_port, "/api/v1/alerts");
  if (r.status != 200) return false;
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded()) return false;
  for (const auto& a : j["data"]["alerts"]) {
    if (a["labels"].value("alertname", "") == alert && a["labels"].value("source", "") == source &&
        a.value("state", "") == "firing") {
      return true;
    }
  }
  return false;
}

TEST(PolicyServeTest, PrometheusMissingBackupAlertFiresAndResolves) {
  BARGE_REQUIRE_TOOL("prometheus");
  TempDir dir;
  const std::string cat = dir / "catalog.db", policy = dir / "alert.yaml", disk = dir / "gone.raw";
  fs::create_directories(dir / "t");
  WriteText(policy, "name: alerting\nsources:\n  - image: " + disk + "\nschedule: '* * * * *'\n"
                    "max_duration_without_backup: 20s\ntargets: [" + (dir / "t") + "]\nfree_space_multiple: 0\n");
  const auto t0 = std::chrono::steady_clock::now();
  Background serve(Barge() + " serve --policy " + Q(policy) + " --listen 127.0.0.1:0 --json", dir / "serve.out",
                   dir / "serve.err", {{"BARGE_CATALOG", cat}});
  ASSERT_TRUE(WaitFor([&] { return ServePort(serve) > 0; }, std::chrono::seconds(30))) << serve.err();
  const int barge_port = ServePort(serve);

  const int prom_port = FreePort();
  WriteText(dir / "prometheus.yml", "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                                    "rule_files:\n  - " + std::string(BARGE_SOURCE_DIR) +
                                    "/deploy/prometheus/barge-rules.yml\n"
                                    "scrape_configs:\n  - job_name: barge\n    static_configs:\n"
                                    "      - targets: ['127.0.0.1:" + std::to_string(barge_port) + "']\n");
  Background prom("prometheus --config.file=" + Q(dir / "prometheus.yml") + " --storage.tsdb.path=" +
                      Q(dir / "tsdb") + " --web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                  dir / "prom.out", dir / "prom.err");
  ASSERT_TRUE(WaitFor([&] { return HttpGet(prom_port, "/-/ready").status == 200; }, std::chrono::seconds(30)))
      << prom.err();

  // The source is missing: every run fails; 20 s after barge first knew
  // it, the critical alert fires.
  ASSERT_TRUE(WaitFor([&] { return Firing(prom_port, "BargeBackupMissing", "gone"); }, std::chrono::seconds(60)))
      << serve.out() << HttpGet(prom_port, "/api/v1/alerts").body;
  const auto fired = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(fired, std::chrono::seconds(19));
  auto failed = EventsOf(serve.out(), "run");
  ASSERT_FALSE(failed.empty());
  EXPECT_EQ(failed[0].at("sources")[0].at("result"), "failed");

  // The disk is back: the next slot's run succeeds and the alert resolves.
  testing::WriteFile(disk, testing::RandomBytes(1 << 20, 7));
  ASSERT_TRUE(WaitFor([&] { return !Firing(prom_port, "BargeBackupMissing", "gone"); }, std::chrono::seconds(90)))
      << serve.out();
  const auto resolved = std::chrono::steady_clock::now() - t0;
  std::cout << "[   info   ] BargeBackupMissing fired "
            << std::chrono::duration_cast<std::chrono::seconds>(fired).count() << " s after barge serve started, "
            << "resolved " << std::chrono::duration_cast<std::chrono::seconds>(resolved).count() << " s after\n";
  bool succeeded = false;
  for (const auto& r : EventsOf(serve.out(), "run")) succeeded |= r.at("sources")[0].at("result") == "success";
  EXPECT_TRUE(succeeded) << serve.out();
  HttpReply q = HttpGet(prom_port, "/api/v1/query?query=barge_policy_last_success_timestamp_seconds%3E0");
  EXPECT_NE(q.body.find("\"source\":\"gone\""), std::string::npos) << q.body;
}

}  // namespace
}  // namespace barge
