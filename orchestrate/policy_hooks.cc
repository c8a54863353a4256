// Policy hooks as commands (orchestrate/policy_hooks.h): an adapter of
// orchestrate/hooks.h where that header exists, else a runner of its own
// (posix_spawn of /bin/sh -c in a new process group, output kept through a
// pipe, a deadline and a cancel flag enforced on the whole group).
#include "orchestrate/policy_hooks.h"

#include <chrono>
#include <map>
#include <string>

#if __has_include("orchestrate/hooks.h")
#include "orchestrate/hooks.h"
#define BARGE_POLICY_HOOKS_ADAPT 1
#else
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>
#include <vector>

#include "orchestrate/time_text.h"

extern char** environ;
#endif

namespace barge::orchestrate {
namespace {

// The variables a hook gets (docs/policies.md, "Hooks").
std::map<std::string, std::string> HookEnvironment(const HookContext& c) {
  std::map<std::string, std::string> env = {{kPolicyHookPolicyVar, c.policy},
                                            {kPolicyHookSourceVar, c.source},
                                            {kPolicyHookTargetVar, c.target},
                                            {"BARGE_HOOK_PHASE", c.phase}};
  if (c.phase == "post") {
    env["BARGE_HOOK_STATUS"] = c.result == "success" ? "ok" : c.result;
    if (!c.error.empty()) env["BARGE_HOOK_ERROR"] = c.error;
  }
  return env;
}

#if BARGE_POLICY_HOOKS_ADAPT

static_assert(std::string_view(kHookPhaseVar) == "BARGE_HOOK_PHASE");
static_assert(std::string_view(kHookStatusVar) == "BARGE_HOOK_STATUS");
static_assert(std::string_view(kHookErrorVar) == "BARGE_HOOK_ERROR");

class CommandHookRunner final : public HookRunner {
 public:
  Status Run(const PolicyHook& hook, const HookContext& context, const std::atomic<bool>*) override {
    auto run = RunHookCommand(context.phase, hook.command, HookEnvironment(context),
                              std::chrono::duration_cast<std::chrono::milliseconds>(hook.timeout));
    if (!run.ok()) return run.error();
    if (run->ok()) return OkStatus();
    return Error::IoError(run->Describe());
  }
};

#else

constexpr size_t kKeptOutputBytes = 4096;
constexpr auto kKillGrace = std::chrono::seconds(2);

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\n\r\t ");
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return text.substr(start, end + 1 - start);
}

// Owns a file descriptor (the pipe's ends).
struct Fd {
  int fd = -1;
  ~Fd() { Close(); }
  void Close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

class CommandHookRunner final : public HookRunner {
 public:
  Status Run(const PolicyHook& hook, const HookContext& context, const std::atomic<bool>* cancel) override {
    const std::string what = context.phase + "-hook '" + hook.command + "'";
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return Error::FromErrno(errno, "pipe", what);
    Fd out{fds[0]}, in{fds[1]};

    // Everything the child needs is built before the spawn.
    std::vector<std::string> env_strings;
    const auto extra = HookEnvironment(context);
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string entry(*e);
      if (extra.count(entry.substr(0, entry.find('='))) == 0) env_strings.push_back(std::move(entry));
    }
    for (const auto& [name, value] : extra) env_strings.push_back(name + "=" + value);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string sh = "/bin/sh", dash_c = "-c", command = hook.command;
    char* argv[] = {sh.data(), dash_c.data(), command.data(), nullptr};

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, in.fd, 1);
    posix_spawn_file_actions_adddup2(&actions, in.fd, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group (the deadline stops everything it started),
    // no signal blocked, and the signals barge handles back to default.
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    const int spawned = ::posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (spawned != 0) return Error::FromErrno(spawned, "posix_spawn /bin/sh", what);
    in.Close();

    std::string output;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + hook.timeout;
    std::chrono::steady_clock::time_point kill_at{};
    bool stopping = false, timed_out = false, cancelled = false, eof = false;
    int status = 0;
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      if (!stopping && (now >= deadline || (cancel != nullptr && cancel->load()))) {
        (now >= deadline ? timed_out : cancelled) = true;
        stopping = true;
        ::kill(-pid, SIGTERM);
        kill_at = now + kKillGrace;
      }
      if (stopping && now >= kill_at) ::kill(-pid, SIGKILL);
      if (!eof) {
        // Its output, kept to the last few KiB; the poll paces the loop.
        pollfd p{out.fd, POLLIN, 0};
        if (::poll(&p, 1, 50) > 0) {
          char buf[4096];
          ssize_t n = ::read(out.fd, buf, sizeof buf);
          if (n > 0) output.append(buf, static_cast<size_t>(n));
          if (n == 0) eof = true;
          if (output.size() > kKeptOutputBytes) output.erase(0, output.size() - kKeptOutputBytes);
        }
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const pid_t w = ::waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (w < 0 && errno != EINTR) return Error::FromErrno(errno, "waitpid", what);
    }
    // Children it left behind go with it once it was stopped.
    if (stopping) ::kill(-pid, SIGKILL);
    if (!stopping && WIFEXITED(status) && WEXITSTATUS(status) == 0) return OkStatus();

    std::string how;
    if (timed_out) {
      how = "timed out after " + FormatDuration(hook.timeout) + " and was stopped";
    } else if (cancelled) {
      how = "was stopped: the run was stopped";
    } else if (WIFSIGNALED(status)) {
      how = "was killed by signal " + std::to_string(WTERMSIG(status));
    } else {
      how = "exited with " + std::to_string(WEXITSTATUS(status));
    }
    std::string message = what + " " + how;
    if (std::string last = LastLine(output); !last.empty()) message += ": " + last;
    return cancelled ? Error::Cancelled(message) : Error::IoError(message);
  }
};

#endif

}  // namespace

std::unique_ptr<HookRunner> NewPolicyHookRunner() { return std::make_unique<CommandHookRunner>(); }

}  // namespace barge::orchestrate
