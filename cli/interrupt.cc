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
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "blockio/thread.h"
#include "cli/output.h"

namespace barge::cli {

namespace {

std::atomic<bool> g_cancel{false};
std::atomic<uint64_t> g_reloads{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "incremented in a signal handler");
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

void OnReload(int) { g_reloads.fetch_add(1); }

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
    // The watcher first: without it the handlers would leave a stuck job
    // running forever, so a thread that cannot start means the signals'
    // default action (the process ends) instead.
    auto watcher = StartThread("interrupt watcher", Watch, grace);
    if (!watcher.ok()) return;
    watcher->detach();
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
  });
}

namespace {

std::string g_command = "barge";  // set once, before any thread runs
bool g_json = false;

void WriteStderr(const std::string& s) {
  ssize_t n = ::write(STDERR_FILENO, s.data(), s.size());
  static_cast<void>(n);
}

// std::terminate from any thread: an exception nothing caught, above all
// oneTBB's "pthread_create has failed" when it cannot start a worker on a
// worker thread (it cannot be caught where the copy waits). Reported like
// any error, temporaries removed, and never an abort (no core, no 134).
[[noreturn]] void OnTerminate() {
  std::string what = "std::terminate called";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
    } catch (...) {
      what = "an exception of unknown type";
    }
  }
  const bool thread = what.find("pthread_create") != std::string::npos ||
                      what.find("Resource temporarily unavailable") != std::string::npos;
  Error error = thread ? ThreadStartError("worker", EAGAIN)
                       : Error::Internal(what + " (a bug in barge: please report it)");
  int code = thread ? kExitError : kExitInternal;
  RemoveRegisteredTemporaries();
  WriteStderr("barge: " + error.ToString() + "\n");
  if (g_json) {
    nlohmann::ordered_json j = {{"event", "error"}, {"command", g_command}, {"code", ErrorCodeName(error.code())},
                                {"message", error.message()}, {"exit_code", code}, {"retryable", error.retryable()}};
    std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    ssize_t n = ::write(STDOUT_FILENO, line.data(), line.size());
    static_cast<void>(n);
  }
  ::_exit(code);
}

}  // namespace

void InstallTerminateHandler(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) g_json |= std::string_view(argv[i]) == "--json";
  if (argc > 1 && argv[1][0] != '-') g_command = argv[1];
  std::set_terminate(OnTerminate);
}

const std::atomic<bool>& CancelFlag() { return g_cancel; }

int InterruptSignal() { return g_signal.load(); }

void InstallReloadHandling() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_handler = OnReload;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGHUP, &sa, nullptr);
  });
}

uint64_t ReloadRequests() { return g_reloads.load(); }

}  // namespace barge::cli
