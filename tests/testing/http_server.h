// Test servers for http(s):// sources: a real nginx on 127.0.0.1 (HTTP and
// HTTPS with a certtool certificate) serving a folder, and a fault proxy in
// front of it that cuts, stalls, answers 503 or corrupts a byte.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/testing.h"

namespace barge::testing {

// A free TCP port on 127.0.0.1 (the kernel's pick; released for a server).
int FreeLoopbackPort();
// True once something listens on 127.0.0.1:port (/proc/net/tcp, state 0A),
// read without connecting so the server serves no probe.
bool ListeningOn(int port);

// nginx (nginx-light) as our child, stopped by its PID when destroyed. Its
// folder (a fresh TempDir) holds www/ (what it serves, as root/), the
// configuration, a CA (ca-cert.pem) and the server's certificate for
// 127.0.0.1. Locations besides plain files:
//   /loop          redirects to itself (a redirect loop)
//   /page.qcow2    an HTML page, Content-Type text/html
//   /noranges/...  files from www/noranges/ without byte ranges
//   /private/...   files from www/private/, basic auth alice:kHttpPassword
//   /slow/...      files from www/, each answer at 256 KiB/s (limit_rate)
//   /bearer/...    files from www/, only with "Authorization: Bearer kBearerToken"
class Nginx {
 public:
  static constexpr const char* kPassword = "n0t-in-any-output";
  static constexpr const char* kBearerToken = "b3arer-in-no-output";
  Nginx();
  ~Nginx();
  Nginx(const Nginx&) = delete;
  Nginx& operator=(const Nginx&) = delete;

  bool ok() const { return pid_ > 0; }
  const std::string& failure() const { return failure_; }
  std::string www() const { return dir_ / "www"; }
  std::string ca_file() const { return dir_ / "ca-cert.pem"; }
  int http_port() const { return http_port_; }
  std::string http(const std::string& path) const;   // http://127.0.0.1:PORT/path
  std::string https(const std::string& path) const;  // https://127.0.0.1:PORT/path

 private:
  TempDir dir_;
  int http_port_ = 0;
  int https_port_ = 0;
  int pid_ = -1;
  std::string failure_;
};

// A TCP proxy on 127.0.0.1 in front of `upstream_port` (nginx, radosgw),
// served by threads of the test process, stopped in the destructor. The
// first `times` connections after Set() get the fault, later ones pass
// untouched; the faults that answer themselves close their connection, so
// for them a connection is one request ("the next K requests").
class FaultProxy {
 public:
  enum class Mode { kPass, kCut, kStall, k503, kCorrupt, kCutRequest, k500 };
  explicit FaultProxy(int upstream_port);
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // kCut: closes both sides once `after_bytes` of the answer went through
  // (after calling `before_cut`, if set); kStall: sends nothing more for
  // `stall_ms` after that, then closes; k503: answers "503 Slow Down" with
  // S3's XML error body (Code SlowDown) without asking upstream; k500:
  // answers 500 (Code InternalError) likewise; kCorrupt: flips the byte at
  // `after_bytes` of the answer; kCutRequest: passes `after_bytes` of the
  // request (head and body: a PUT cut mid-body), then closes both sides.
  void Set(Mode mode, uint64_t after_bytes, int times, std::function<void()> before_cut = {}, int stall_ms = 4000);
  int faults() const { return faults_.load(); }
  // Requests seen (heads from clients, those answered here included) and
  // bytes passed each way, since the start.
  int requests() const { return requests_.load(); }
  uint64_t bytes_to_server() const { return bytes_up_.load(); }
  uint64_t bytes_to_client() const { return bytes_down_.load(); }
  int port() const { return port_; }
  std::string url(const std::string& path) const;

 private:
  void AcceptLoop();
  void Serve(int client);

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> faults_{0};
  std::atomic<int> requests_{0};
  std::atomic<uint64_t> bytes_up_{0}, bytes_down_{0};
  std::mutex mu_;
  Mode mode_ = Mode::kPass;  // guarded by mu_, with the fields below
  uint64_t after_bytes_ = 0;
  int times_ = 0;
  int stall_ms_ = 0;
  std::function<void()> before_cut_;
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // guarded by mu_
};

}  // namespace barge::testing
