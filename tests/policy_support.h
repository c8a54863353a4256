// Helpers of the policy integration tests: processes that run in the
// background (barge serve, barge run to be signalled, prometheus, nbdkit)
// with their output in files, NDJSON events, plain HTTP GETs on 127.0.0.1,
// free ports, and waiting for a condition.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"

namespace barge::policy_testing {

using nlohmann::json;
using testing::Barge;
using testing::Q;
using testing::Slurp;

// A command run by /bin/sh in the background, stdout and stderr to files.
// The destructor stops it (SIGTERM, then SIGKILL after 5 s) if it still runs.
class Background {
 public:
  Background(const std::string& command, const std::string& out_file, const std::string& err_file,
             const std::map<std::string, std::string>& env = {})
      : out_(out_file), err_(err_file) {
    // Built before fork: the child of a threaded process may only exec.
    std::string shell = "exec " + command + " >" + Q(out_file) + " 2>" + Q(err_file);
    std::vector<std::string> env_strings;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string entry(*e);
      if (!env.count(entry.substr(0, entry.find('=')))) env_strings.push_back(entry);
    }
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execle("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr), envp.data());
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ <= 0 || exited_) return;
    ::kill(pid_, SIGTERM);
    if (Wait(std::chrono::seconds(5)) < 0) {
      ::kill(pid_, SIGKILL);
      Wait(std::chrono::seconds(5));
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  int pid() const { return pid_; }
  void Signal(int sig) { ::kill(pid_, sig); }
  bool running() {
    if (exited_) return false;
    Wait(std::chrono::milliseconds(0));
    return !exited_;
  }
  // The exit code (128 + signal when killed); -1 when still running after `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (!exited_) {
      int status = 0;
      pid_t w = ::waitpid(pid_, &status, WNOHANG);
      if (w == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= until) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return code_;
  }
  std::string out() const { return Slurp(out_); }
  std::string err() const { return Slurp(err_); }

 private:
  std::string out_, err_;
  int pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
};

// Every NDJSON object of `text` (one a line), in order.
inline std::vector<json> Events(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

// The events of one type.
inline std::vector<json> EventsOf(const std::string& text, const std::string& event) {
  std::vector<json> out;
  for (auto& e : Events(text)) {
    if (e.value("event", "") == event) out.push_back(std::move(e));
  }
  return out;
}

// Polls `done` every 100 ms until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

struct HttpReply {
  int status = 0;  // 0: no connection or no reply
  std::string body;
};

// GET http://127.0.0.1:PORT/PATH (HTTP/1.0, the whole reply read).
inline HttpReply HttpGet(int port, const std::string& path) {
  HttpReply r;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return r;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return r;
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return r;
  }
  std::string reply;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (reply.rfind("HTTP/1.", 0) != 0) return r;
  r.status = std::atoi(reply.c_str() + reply.find(' ') + 1);
  size_t body = reply.find("\r\n\r\n");
  if (body != std::string::npos) r.body = reply.substr(body + 4);
  return r;
}

// A TCP port free on 127.0.0.1 now (bound to 0 and released).
inline int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A small tmpfs mounted for the test's life (root only; absent otherwise).
class TmpfsMount {
 public:
  // `flags`: mount(2)'s (MS_RDONLY: a read-only one).
  TmpfsMount(const std::string& dir, const std::string& size, unsigned long flags = 0) : dir_(dir) {
    std::filesystem::create_directories(dir);
    mounted_ = ::mount("tmpfs", dir.c_str(), "tmpfs", flags, ("size=" + size).c_str()) == 0;
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

// Backup points (manifests) under `dir`, recursively.
inline size_t Manifests(const std::string& dir) {
  size_t n = 0;
  if (!std::filesystem::exists(dir)) return 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    n += e.path().extension() == ".json" ? 1 : 0;
  }
  return n;
}

// Fills the filesystem of `dir` with the file `path` until `leave` bytes
// (about) stay free.
inline void FillUpTo(const std::string& path, uint64_t leave) {
  const auto space = std::filesystem::space(std::filesystem::path(path).parent_path());
  const uint64_t fill = space.available > leave ? space.available - leave : 0;
  testing::RunOk("fallocate -l " + std::to_string(fill) + " " + Q(path));
}

// Seconds into the current UTC minute.
inline int SecondsIntoMinute() {
  return static_cast<int>(std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count() %
                          60);
}

// Sleeps until `second` seconds past the next minute boundary.
inline void SleepPastNextMinute(int second = 1) {
  std::this_thread::sleep_for(std::chrono::seconds(60 - SecondsIntoMinute() + second));
}

}  // namespace barge::policy_testing
