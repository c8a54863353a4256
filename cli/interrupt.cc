// Signal handling: an async-signal-safe handler that records the signal
// and wakes a watcher thread through a pipe; the watcher enforces the
// grace period.
#include "cli/interrupt.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <thread>

#include "blockio/env.h"

namespace barge::cli {

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<int> g_signal{0};
int g_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
  g_cancel.store(true);
  char byte = 1;
  // Nothing to do on failure in a handler; the flag is set either way.
  ssize_t n = ::write(g_pipe[1], &byte, 1);
  static_cast<void>(n);
}

void Watch(std::chrono::seconds grace) {
  char byte;
  while (::read(g_pipe[0], &byte, 1) != 1) {
  }
  const char msg[] = "barge: interrupted: stopping and removing temporary files (again to quit at once)\n";
  ssize_t n = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  static_cast<void>(n);
  struct pollfd p {g_pipe[0], POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, static_cast<int>(grace.count() * 1000));
  } while (ready < 0 && errno == EINTR);
  // A second signal, or the job did not end in time: leave now.
  RemoveRegisteredTemporaries();
  ::_exit(128 + g_signal.load());
}

}  // namespace

void InstallInterruptHandling(std::chrono::seconds grace) {
  static std::once_flag once;
  std::call_once(once, [grace] {
    if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;  // no handling rather than no barge
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    std::thread(Watch, grace).detach();
  });
}

const std::atomic<bool>& CancelFlag() { return g_cancel; }

int InterruptSignal() { return g_signal.load(); }

}  // namespace barge::cli
