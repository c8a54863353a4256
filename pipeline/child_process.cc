// Helper programs, spawned and stopped by PID.
#include "pipeline/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <thread>

extern char** environ;

namespace barge::pipeline {

void InitChildSpawnAttr(posix_spawnattr_t* attr) {
  posix_spawnattr_init(attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &defaults);
  // Its own group: a Ctrl-C in the terminal reaches barge, which stops the
  // child itself (and reports how it ended).
  posix_spawnattr_setpgroup(attr, 0);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

Status ChildProcess::Spawn(const std::vector<std::string>& args, const SpawnOptions& options,
                           const std::string& package) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (options.stdout_path.empty()) {
    posix_spawn_file_actions_adddup2(&actions, 2, 1);
  } else {
    posix_spawn_file_actions_addopen(&actions, 1, options.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  }
  if (!options.stderr_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  }
  posix_spawnattr_t attr;
  InitChildSpawnAttr(&attr);
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc == ENOENT) {
    return Error::NotFound(args[0] + " is not installed (Debian: apt-get install " + package + ")").set_path(args[0]);
  }
  if (rc != 0) return Error::FromErrno(rc, "posix_spawn", args[0]);
  pid_ = pid;
  return OkStatus();
}

bool ChildProcess::Exited(int* status) {
  if (pid_ <= 0) {
    *status = status_;
    return true;
  }
  int st = 0;
  if (::waitpid(static_cast<pid_t>(pid_), &st, WNOHANG) == static_cast<pid_t>(pid_)) {
    pid_ = 0;
    status_ = st;
    *status = st;
    return true;
  }
  return false;
}

int ChildProcess::Wait() {
  if (pid_ > 0) {
    int st = 0;
    while (::waitpid(static_cast<pid_t>(pid_), &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = 0;
    status_ = st;
  }
  return status_;
}

void ChildProcess::Stop(std::chrono::milliseconds grace) {
  int st = 0;
  if (Exited(&st)) return;
  ::kill(static_cast<pid_t>(pid_), SIGTERM);
  const auto kill_at = std::chrono::steady_clock::now() + grace;
  while (!Exited(&st)) {
    if (std::chrono::steady_clock::now() >= kill_at) {
      ::kill(static_cast<pid_t>(pid_), SIGKILL);
      Wait();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

int ExitStatusOf(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace barge::pipeline
