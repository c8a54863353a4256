// serve's status server: its small pieces, and a real server on a free
// 127.0.0.1 port answering /healthz and /metrics without a scheduler.
#include "orchestrate/report/status_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace barge::orchestrate {
namespace {

// GET `path` from 127.0.0.1:port; the whole answer, "" when it cannot connect.
std::string Get(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) answer.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return answer;
}

TEST(ChainPageIndexTest, TwoNumbersOnly) {
  EXPECT_EQ(ChainPageIndex("/chain/0/12"), std::make_pair(size_t{0}, size_t{12}));
  EXPECT_FALSE(ChainPageIndex("/"));
  EXPECT_FALSE(ChainPageIndex("/chain/1"));
  EXPECT_FALSE(ChainPageIndex("/chain/1/"));
  EXPECT_FALSE(ChainPageIndex("/chain/-1/2"));
  EXPECT_FALSE(ChainPageIndex("/chain/1/2x"));
  EXPECT_FALSE(ChainPageIndex("/chain/1234567/0"));  // more than six digits
  EXPECT_FALSE(ChainPageIndex("/chains/1/2"));
}

TEST(SplitListenTest, AtTheLastColon) {
  EXPECT_EQ(SplitListen("127.0.0.1:9847").host, "127.0.0.1");
  EXPECT_EQ(SplitListen("127.0.0.1:9847").port, "9847");
  EXPECT_EQ(SplitListen("[::1]:80").host, "[::1]");
  EXPECT_EQ(SplitListen("8080").host, "");
  EXPECT_EQ(SplitListen("8080").port, "8080");
}

TEST(SchedulerStatusTest, LineAndJson) {
  SchedulerStatus s;
  s.policy = "nightly";
  s.runs = 3;
  s.failed_runs = 1;
  EXPECT_EQ(SchedulerStatusLine(s), "policy nightly: 3 run(s), 1 with failures");
  s.next_pass = SysSeconds(std::chrono::seconds(0));
  EXPECT_EQ(SchedulerStatusLine(s), "policy nightly: 3 run(s), 1 with failures; next check 1970-01-01T00:00:00Z");
  const nlohmann::json j = SchedulerStatusJson(s);
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["runs"], 3);
  EXPECT_TRUE(j["last_pass_at"].is_null());
  s.stopping = true;
  EXPECT_EQ(SchedulerStatusJson(s)["status"], "stopping");
}

TEST(StatusServerTest, ServesMetricsAndUnhealthyUntilAttached) {
  auto server = StatusServer::Start("127.0.0.1:0", std::make_shared<PolicyMetricsCollector>());
  ASSERT_TRUE(server.ok()) << server.error().ToString();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string(port));

  const std::string health = Get(port, "/healthz");
  EXPECT_NE(health.find("HTTP/1.1 503"), std::string::npos) << health;
  EXPECT_NE(health.find("\"status\":\"stopping\""), std::string::npos) << health;
  EXPECT_NE(Get(port, "/metrics").find("HTTP/1.1 200"), std::string::npos);
  EXPECT_NE(Get(port, "/").find(" 404 "), std::string::npos);  // no page before Attach

  // The port is taken: a second server says why, and so does ListenProblem.
  const std::string taken = "127.0.0.1:" + std::to_string(port);
  EXPECT_NE(ListenProblem(taken).find("(another process listens there)"), std::string::npos);
  auto second = StatusServer::Start(taken, std::make_shared<PolicyMetricsCollector>());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kIoError);
  EXPECT_NE(second.error().message().find("cannot listen on " + taken + ": "), std::string::npos);

  (*server)->Stop();
  EXPECT_EQ(Get(port, "/healthz"), "");  // no longer listening
  EXPECT_EQ(ListenProblem(taken), "");
}

TEST(StatusServerTest, APortOutsideTcpsRangeIsNamed) {
  for (const std::string listen : {"0.0.0.0:99999", "127.0.0.1:65536", "127.0.0.1:http", "127.0.0.1:"}) {
    EXPECT_EQ(ListenProblem(listen), "the port must be a number from 0 to 65535") << listen;
    auto server = StatusServer::Start(listen, std::make_shared<PolicyMetricsCollector>());
    ASSERT_FALSE(server.ok()) << listen;
    EXPECT_EQ(server.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(server.error().message().find("the port must be a number from 0 to 65535"), std::string::npos)
        << server.error().ToString();
  }
}

}  // namespace
}  // namespace barge::orchestrate
