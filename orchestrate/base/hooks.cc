// Hook commands: posix_spawn of /bin/sh -c in a process group of its own,
// output captured through a socket pair, a deadline enforced on the whole group.
#include "orchestrate/base/hooks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "pipeline/child_process.h"

extern char** environ;

namespace barge::orchestrate {
namespace {

constexpr size_t kMaxOutputBytes = 64 << 10;
constexpr std::chrono::milliseconds kKillGrace{2000};

// The process environment with `extra` set (replacing same-named entries).
std::vector<std::string> Environment(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    if (!extra.count(name)) out.push_back(std::move(entry));
  }
  for (const auto& [name, value] : extra) out.push_back(name + "=" + value);
  return out;
}

// Owns the read end of the output socket pair.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\n \t");
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end + 1 - (start == std::string::npos ? 0 : start + 1));
}

}  // namespace

std::string HookRun::Describe() const {
  std::string s = phase + "-hook '" + command + "' ";
  if (cancelled) {
    s += "was stopped: the run was cancelled";
  } else if (timed_out) {
    s += "timed out after " + std::to_string(static_cast<int>(seconds)) + " s and was stopped";
  } else if (signal != 0) {
    s += "was killed by signal " + std::to_string(signal);
  } else {
    s += "exited with " + std::to_string(exit_code);
  }
  const std::string last = LastLine(output);
  if (!last.empty()) s += ": " + last;
  return s;
}

namespace {

// `sh -c 'read; kill -KILL -- -GROUP'` with its stdin on a pipe whose only
// writer is barge (close-on-exec, so no other child holds it): barge's end
// closes when barge ends, and the hook's group is killed. Best effort: a
// watchdog that cannot start leaves the hook as before (stopped by barge's
// own timeout and cancel).
class HookWatchdog {
 public:
  explicit HookWatchdog(pid_t group) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    Fd read_end{fds[0]};
    write_fd_ = fds[1];
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, read_end.fd, 0);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    posix_spawnattr_t attr;
    pipeline::InitChildSpawnAttr(&attr);
    std::string sh = "/bin/sh", dash_c = "-c", script = "read -r _; kill -KILL -\"$1\"", name = "barge-hook-watchdog",
                arg = std::to_string(group);
    char* argv[] = {sh.data(), dash_c.data(), script.data(), name.data(), arg.data(), nullptr};
    char* envp[] = {nullptr};
    if (::posix_spawn(&pid_, "/bin/sh", &actions, &attr, argv, envp) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  ~HookWatchdog() { Dismiss(); }
  // Stops the watchdog without letting it kill (the hook's group is
  // barge's to handle from here).
  void Dismiss() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    if (write_fd_ >= 0) ::close(write_fd_);
    write_fd_ = -1;
  }
  HookWatchdog(const HookWatchdog&) = delete;
  HookWatchdog& operator=(const HookWatchdog&) = delete;

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1;
};

}  // namespace

Result<HookRun> RunHookCommand(const std::string& phase, const std::string& command,
                               const std::map<std::string, std::string>& env,
                               std::chrono::milliseconds timeout, const std::atomic<bool>* cancel) {
  HookRun run;
  run.phase = phase;
  run.command = command;
  const auto start = std::chrono::steady_clock::now();
  // A socket pair, not a pipe: our end is read without blocking
  // (MSG_DONTWAIT) while the command's end stays an ordinary blocking
  // stdout, and no file status flag needs changing.
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Error::FromErrno(errno, "socketpair", phase + "-hook");
  }
  Fd out{fds[0]};
  Fd in{fds[1]};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, in.fd, 1);
  posix_spawn_file_actions_adddup2(&actions, in.fd, 2);
  posix_spawnattr_t attr;
  pipeline::InitChildSpawnAttr(&attr);

  std::vector<std::string> env_strings = Environment(env);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string sh = "/bin/sh", dash_c = "-c", cmd = command;
  char* argv[] = {sh.data(), dash_c.data(), cmd.data(), nullptr};
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawned != 0) return Error::FromErrno(spawned, "posix_spawn /bin/sh", phase + "-hook");
  ::close(in.fd);
  in.fd = -1;
  // The command's group ends with barge however barge ends (SIGKILL, a
  // scheduler killing barge's own process group): a watchdog waits on a
  // pipe only barge holds open and kills the group when it closes. A
  // normal end stops the watchdog first (Dismiss) and then reaps the command.
  HookWatchdog watchdog(pid);

  auto drain = [&] {
    char buf[4096];
    for (;;) {
      ssize_t n = ::recv(out.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) return n == 0;  // true at end of file
      run.output.append(buf, static_cast<size_t>(n));
      if (run.output.size() > kMaxOutputBytes) run.output.erase(0, run.output.size() - kMaxOutputBytes);
    }
  };
  const auto deadline = start + timeout;
  int status = 0;
  bool exited = false, eof = false;
  std::chrono::steady_clock::time_point kill_at{};
  bool term_sent = false, kill_sent = false;
  while (!exited) {
    const auto now = std::chrono::steady_clock::now();
    if (!term_sent && cancel != nullptr && cancel->load()) {
      run.cancelled = true;
      ::kill(-pid, SIGTERM);
      term_sent = true;
      kill_at = now + kKillGrace;
    }
    if (!term_sent && now >= deadline) {
      run.timed_out = true;
      ::kill(-pid, SIGTERM);
      term_sent = true;
      kill_at = now + kKillGrace;
    }
    if (term_sent && !kill_sent && now >= kill_at) {
      ::kill(-pid, SIGKILL);
      kill_sent = true;
    }
    if (!eof) {
      pollfd p{out.fd, POLLIN, 0};
      ::poll(&p, 1, 50);
      eof = drain();
    } else {
      ::usleep(20000);
    }
    // Seen ended but not reaped (WNOWAIT): its group id cannot be reused
    // while the watchdog may still kill it.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno != EINTR) return Error::FromErrno(errno, "waitid", phase + "-hook");
    } else if (info.si_pid == pid) {
      exited = true;
    }
  }
  watchdog.Dismiss();
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Output the command left in the socket (children it left behind may hold
  // their end open; they are not waited for).
  if (!eof) drain();
  // Whatever it started in its group goes with it once the deadline passed.
  if (run.timed_out || run.cancelled) ::kill(-pid, SIGKILL);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  return run;
}

Status ApplyPostHookRule(Status body, Status post_failure, std::vector<std::string>& warnings) {
  if (post_failure.ok()) return body;
  if (body.ok()) {
    warnings.push_back(post_failure.error().message());
    return body;
  }
  Error e = std::move(body).error();
  e.Also(std::move(post_failure));
  return e;
}

Status RunWithHooks(const HookSpec& hooks, const std::map<std::string, std::string>& env,
                    const std::function<Status()>& body, HookedResult* result) {
  HookedResult local;
  HookedResult& r = result ? *result : local;
  auto with = [&env](const char* phase) {
    std::map<std::string, std::string> e = env;
    e[kHookPhaseVar] = phase;
    return e;
  };
  // The post-hook: runs in every case; returns why it failed ("" if fine).
  auto post = [&](const std::string& status, const std::string& why) -> std::string {
    if (hooks.post.empty()) return "";
    std::map<std::string, std::string> e = with("post");
    e[kHookStatusVar] = status;
    if (!why.empty()) e[kHookErrorVar] = why;
    auto run = RunHookCommand("post", hooks.post, e, hooks.timeout);
    if (!run.ok()) return "post-hook '" + hooks.post + "' could not run: " + run.error().message();
    r.runs.push_back(*run);
    return run->ok() ? "" : run->Describe();
  };

  if (!hooks.pre.empty()) {
    auto pre = RunHookCommand("pre", hooks.pre, with("pre"), hooks.timeout, hooks.cancel);
    std::string why;
    if (!pre.ok()) {
      why = "pre-hook '" + hooks.pre + "' could not run: " + pre.error().message();
    } else {
      r.runs.push_back(*pre);
      if (!pre->ok()) why = pre->Describe();
    }
    if (!why.empty()) {
      Status aborted = Error::Cancelled("aborted before anything was done: " + why);
      const std::string post_failed = post("aborted", why);
      return ApplyPostHookRule(std::move(aborted), post_failed.empty() ? OkStatus() : Status(Error::IoError(post_failed)),
                               r.warnings);
    }
  }
  Status s = body();
  const std::string post_failed = post(s.ok() ? "ok" : "failed", s.ok() ? "" : s.error().ToString());
  return ApplyPostHookRule(std::move(s), post_failed.empty() ? OkStatus() : Status(Error::IoError(post_failed)),
                           r.warnings);
}

}  // namespace barge::orchestrate
