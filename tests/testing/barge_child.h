// A barge process started by a test, its output to a file, watched and
// signalled while it works; SIGKILLed and reaped by the destructor if still
// running. Used by the interrupt and resume tests.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/testing.h"

namespace barge::testing {

class BargeChild {
 public:
  using Clock = std::chrono::steady_clock;

  // Runs barge with `args`, stdout and stderr to `log`.
  BargeChild(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {BargeBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> raw;
    for (auto& a : argv) raw.push_back(a.data());
    raw.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(raw[0], raw.data());
      ::_exit(127);
    }
  }
  ~BargeChild() { Kill(); }
  BargeChild(const BargeChild&) = delete;
  BargeChild& operator=(const BargeChild&) = delete;

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }  // -1 once reaped
  bool Running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid_ = -1;
      return false;
    }
    return true;
  }
  // Polls `ready` every ms (up to 60 s) while the process runs; false if
  // the process ended first or time ran out.
  bool WaitFor(const std::function<bool()>& ready) {
    for (auto start = Clock::now(); Clock::now() - start < std::chrono::seconds(60);) {
      if (!Running()) return false;
      if (ready()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  // WaitFor(ready), then stops the process (SIGSTOP), sends `sig` and
  // continues it: the signal lands while the work is underway, whatever the
  // machine's speed. False if the process ended first.
  bool SignalWhen(const std::function<bool()>& ready, int sig) {
    if (!WaitFor(ready)) return false;
    ::kill(pid_, SIGSTOP);
    ::kill(pid_, sig);
    ::kill(pid_, SIGCONT);
    return true;
  }
  // Exit code, or 128 + signal; -1 after 60 s.
  int Wait() {
    for (auto start = Clock::now(); Clock::now() - start < std::chrono::seconds(60);) {
      if (!Running()) return exit_;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int exit_ = -1;
};

}  // namespace barge::testing
