// nginx and the fault proxy of the http(s) source tests (http_server.h).
#include "tests/testing/http_server.h"

#include "tests/testing/cli_testing.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace barge::testing {
namespace {

// A listening socket on 127.0.0.1 on a port the kernel picks; -1 on failure.
int ListenLoopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

int FreeLoopbackPort() {
  int port = 0;
  int fd = ListenLoopback(&port);
  if (fd >= 0) ::close(fd);
  return port;
}

bool ListeningOn(int port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  char want[16];
  std::snprintf(want, sizeof want, "0100007F:%04X", port);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    if (f >> slot >> local >> remote >> state && local == want && state == "0A") return true;
  }
  return false;
}

Nginx::Nginx() {
  const std::string d = dir_.path().string();
  std::filesystem::create_directories(d + "/www/noranges");
  std::filesystem::create_directories(d + "/www/private");
  std::filesystem::create_directories(d + "/tmp");
  WriteText(d + "/ca.info", "cn = barge http test CA\nca\ncert_signing_key\nexpiration_days = 2\n");
  WriteText(d + "/server.info",
            "organization = barge test\ncn = 127.0.0.1\nip_address = 127.0.0.1\ntls_www_server\nsigning_key\n"
            "encryption_key\nexpiration_days = 2\n");
  const std::string key = "certtool -q --generate-privkey --key-type=ecdsa --outfile ";
  CommandResult r = Run(
      "set -e; cd " + ShellQuote(d) + "\n" + key + "ca-key.pem\n" +
      "certtool -q --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile ca-cert.pem\n" +
      key + "server-key.pem\n" +
      "certtool -q --generate-certificate --load-privkey server-key.pem --load-ca-certificate ca-cert.pem "
      "--load-ca-privkey ca-key.pem --template server.info --outfile server-cert.pem\n"
      "printf 'alice:%s\\n' \"$(openssl passwd -apr1 " + std::string(kPassword) + ")\" > htpasswd\n");
  if (r.exit_code != 0) {
    failure_ = "certtool/openssl: " + r.output;
    return;
  }
  http_port_ = FreeLoopbackPort();
  https_port_ = FreeLoopbackPort();
  WriteText(d + "/nginx.conf",
            "daemon off;\nmaster_process off;\nuser root;\nworker_processes 1;\npid " + d + "/nginx.pid;\n"
            "error_log " + d + "/error.log;\nevents { worker_connections 256; }\n"
            "http {\n  access_log off;\n"
            "  client_body_temp_path " + d + "/tmp/body;\n  proxy_temp_path " + d + "/tmp/proxy;\n"
            "  fastcgi_temp_path " + d + "/tmp/fastcgi;\n  uwsgi_temp_path " + d + "/tmp/uwsgi;\n"
            "  scgi_temp_path " + d + "/tmp/scgi;\n  default_type application/octet-stream;\n"
            "  server {\n"
            "    listen 127.0.0.1:" + std::to_string(http_port_) + ";\n"
            "    listen 127.0.0.1:" + std::to_string(https_port_) + " ssl;\n"
            "    ssl_certificate " + d + "/server-cert.pem;\n    ssl_certificate_key " + d + "/server-key.pem;\n"
            "    root " + d + "/www;\n"
            "    location = /loop { return 302 /loop; }\n"
            "    location = /page.qcow2 { default_type text/html; return 200 '<html><body>gone</body></html>'; }\n"
            "    location /noranges/ { max_ranges 0; }\n"
            "    location /private/ { auth_basic barge; auth_basic_user_file " + d + "/htpasswd; }\n"
            "    location /slow/ { alias " + d + "/www/; limit_rate 256k; }\n"
            "    location /bearer/ { alias " + d + "/www/;\n"
            "      if ($http_authorization != \"Bearer " + kBearerToken + "\") { return 401; } }\n"
            "  }\n}\n");
  const std::string shell = "exec nginx -p " + ShellQuote(d) + " -c " + ShellQuote(d + "/nginx.conf") +
                            " >" + ShellQuote(d + "/stdout.log") + " 2>&1";
  pid_ = ::fork();
  if (pid_ == 0) {
    ::execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 500; ++i) {
    if (ListeningOn(http_port_) && ListeningOn(https_port_)) return;
    if (::waitpid(pid_, nullptr, WNOHANG) == pid_) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  failure_ = "nginx did not start: " + Run("cat " + ShellQuote(d + "/error.log") + " " +
                                           ShellQuote(d + "/stdout.log")).output;
  StopChild(pid_, std::chrono::seconds(5));
  pid_ = -1;
}

Nginx::~Nginx() { StopChild(pid_, std::chrono::seconds(5)); }

std::string Nginx::http(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(http_port_) + "/" + path;
}
std::string Nginx::https(const std::string& path) const {
  return "https://127.0.0.1:" + std::to_string(https_port_) + "/" + path;
}

FaultProxy::FaultProxy(int upstream_port) : upstream_port_(upstream_port) {
  listen_fd_ = ListenLoopback(&port_);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FaultProxy::~FaultProxy() {
  stop_ = true;
  acceptor_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(mu_);
    threads.swap(connections_);
  }
  for (auto& t : threads) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void FaultProxy::Set(Mode mode, uint64_t after_bytes, int times, std::function<void()> before_cut, int stall_ms) {
  std::lock_guard lock(mu_);
  mode_ = mode;
  after_bytes_ = after_bytes;
  times_ = times;
  before_cut_ = std::move(before_cut);
  stall_ms_ = stall_ms;
}

std::string FaultProxy::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(port_) + "/" + path;
}

void FaultProxy::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    std::lock_guard lock(mu_);
    connections_.emplace_back([this, client] { Serve(client); });
  }
}

namespace {

// Counts the requests in one connection's client bytes: a head up to its
// blank line, then Content-Length bytes of body (barge sends no chunked
// bodies).
class RequestCounter {
 public:
  // The heads completed by `n` more bytes.
  int Feed(const char* p, size_t n) {
    int heads = 0;
    while (n > 0) {
      if (body_left_ > 0) {
        const size_t skip = static_cast<size_t>(std::min<uint64_t>(body_left_, n));
        body_left_ -= skip;
        p += skip;
        n -= skip;
        continue;
      }
      head_ += *p++;
      --n;
      if (!head_.ends_with("\r\n\r\n")) continue;
      ++heads;
      std::string lower = head_;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (size_t at = lower.find("\r\ncontent-length:"); at != std::string::npos) {
        body_left_ = std::strtoull(lower.c_str() + at + 17, nullptr, 10);
      }
      head_.clear();
    }
    return heads;
  }
  // Between requests: no head or body part-way.
  bool idle() const { return head_.empty() && body_left_ == 0; }

 private:
  std::string head_;
  uint64_t body_left_ = 0;
};

}  // namespace

void FaultProxy::Serve(int client) {
  Mode mode = Mode::kPass;
  uint64_t after = 0;
  int stall_ms = 0;
  std::function<void()> before_cut;
  {
    std::lock_guard lock(mu_);
    if (times_ > 0) {
      --times_;
      mode = mode_;
      after = after_bytes_;
      stall_ms = stall_ms_;
      before_cut = before_cut_;
    }
  }
  if (mode != Mode::kPass) ++faults_;
  if (mode == Mode::k503 || mode == Mode::k500) {
    // The whole request first (a PUT's body too): closing on unread bytes
    // would reset the connection before the client reads the answer.
    RequestCounter counter;
    char buf[65536];
    for (int heads = 0; heads == 0 || !counter.idle();) {
      pollfd p{client, POLLIN, 0};
      const ssize_t n = ::poll(&p, 1, 2000) > 0 ? ::recv(client, buf, sizeof buf, 0) : 0;
      if (n <= 0) break;
      heads += counter.Feed(buf, static_cast<size_t>(n));
    }
    ++requests_;
    const bool slow = mode == Mode::k503;
    const std::string body = std::string("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>") +
                             (slow ? "SlowDown" : "InternalError") + "</Code><Message>" +
                             (slow ? "Please reduce your request rate." : "We encountered an internal error.") +
                             "</Message></Error>";
    const std::string answer = std::string(slow ? "HTTP/1.1 503 Slow Down" : "HTTP/1.1 500 Internal Server Error") +
                               "\r\nContent-Type: application/xml\r\nContent-Length: " + std::to_string(body.size()) +
                               "\r\nConnection: close\r\n\r\n" + body;
    WriteAll(client, answer.data(), answer.size());
    ::close(client);
    return;
  }
  int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(upstream_port_));
  if (::connect(up, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(up);
    ::close(client);
    return;
  }
  uint64_t answered = 0;  // bytes of the answer passed on
  uint64_t asked = 0;     // bytes of the request passed on
  RequestCounter counter;
  char buf[65536];
  bool done = false;
  while (!done && !stop_) {
    pollfd p[2] = {{client, POLLIN, 0}, {up, POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    if (p[0].revents != 0) {
      ssize_t n = ::recv(client, buf, sizeof buf, 0);
      size_t pass = n > 0 ? static_cast<size_t>(n) : 0;
      const bool cut = mode == Mode::kCutRequest && asked + pass > after;
      if (cut) pass = static_cast<size_t>(after - asked);
      requests_ += counter.Feed(buf, pass);
      if (n <= 0 || !WriteAll(up, buf, pass)) done = true;
      asked += pass;
      bytes_up_ += pass;
      if (cut) {
        if (before_cut) before_cut();
        done = true;
      }
    }
    if (!done && p[1].revents != 0) {
      ssize_t n = ::recv(up, buf, sizeof buf, 0);
      if (n <= 0) break;
      size_t pass = static_cast<size_t>(n);
      const bool crosses = mode != Mode::kPass && mode != Mode::kCutRequest && answered + pass > after;
      if (crosses && mode == Mode::kCorrupt) {
        buf[after - answered] ^= 0x5a;
        mode = Mode::kPass;
      } else if (crosses) {
        pass = static_cast<size_t>(after - answered);
      }
      if (!WriteAll(client, buf, pass)) break;
      answered += pass;
      bytes_down_ += pass;
      if (crosses && mode == Mode::kCut) {
        if (before_cut) before_cut();
        done = true;
      } else if (crosses && mode == Mode::kStall) {
        for (int waited = 0; waited < stall_ms && !stop_; waited += 50) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        done = true;
      }
    }
  }
  ::close(up);
  ::close(client);
}

}  // namespace barge::testing
