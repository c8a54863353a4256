// ssh -L of a remote unix socket, stopped by PID.
#include "orchestrate/libvirt/ssh_forward.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <thread>

#include "blockio/leftovers.h"

namespace barge::orchestrate {
namespace {

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\r\n");
  if (end == std::string::npos) return "";
  size_t start = text.find_last_of('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// A fresh private folder "barge-ssh-<pid>-XXXXXX" in the temporary
// folder (mkdtemp: 0700, ours, never a name someone planted). The folders
// of forwards whose barge was killed outright (SIGKILL: its registered
// temporaries could not be removed; its ssh died with it by
// PR_SET_PDEATHSIG) go first: those of a process that no longer exists,
// owned by this user, with their socket. A pid that was reused keeps its
// folder (never one of a live process).
Result<std::string> MakePrivateDir(Env& env) {
  const std::string root = TemporaryRoot();
  RemoveDeadProcessLeftovers(env, root, "barge-ssh-");
  auto dir = env.CreateTempDir(root, "barge-ssh-" + std::to_string(::getpid()) + "-");
  if (!dir.ok()) return std::move(dir).error().Wrap("create the ssh forward's folder");
  return dir;
}

}  // namespace

std::vector<std::string> SshForwardCommand(const LibvirtUri& uri, const std::string& local_socket,
                                           const std::string& remote_socket) {
  std::string ssh = uri.Param("command");
  std::vector<std::string> argv = {ssh.empty() ? "ssh" : ssh, "-N", "-n", "-T",
                                   "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes"};
  if (uri.port != 0) argv.insert(argv.end(), {"-p", std::to_string(uri.port)});
  if (std::string key = uri.Param("keyfile"); !key.empty()) argv.insert(argv.end(), {"-i", key});
  const std::string no_verify = uri.Param("no_verify");
  if (!no_verify.empty() && no_verify != "0") {
    argv.insert(argv.end(), {"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"});
  } else if (std::string known = uri.Param("known_hosts"); !known.empty()) {
    argv.insert(argv.end(), {"-o", "UserKnownHostsFile=" + known});
  }
  argv.insert(argv.end(), {"-L", local_socket + ":" + remote_socket});
  argv.push_back(uri.user.empty() ? uri.host : uri.user + "@" + uri.host);
  return argv;
}

SshForward::SshForward(Env& env, std::string dir, std::string local_socket)
    : env_(env), dir_(std::move(dir)), local_socket_(std::move(local_socket)), registration_(local_socket_) {}

Result<std::unique_ptr<SshForward>> SshForward::Start(Env& env, const LibvirtUri& uri,
                                                      const std::string& remote_socket,
                                                      const std::atomic<bool>* cancel,
                                                      std::chrono::seconds timeout) {
  if (!uri.ssh() || uri.host.empty()) {
    return Error::InvalidArgument("an ssh forward needs a qemu+ssh:// URI with a host, not " + uri.Redacted());
  }
  BARGE_ASSIGN_OR_RETURN(std::string dir, MakePrivateDir(env));
  std::unique_ptr<SshForward> f(new SshForward(env, dir, dir + "/nbd.sock"));
  const std::vector<std::string> args = SshForwardCommand(uri, f->local_socket_, remote_socket);
  std::vector<std::string> storage = args;
  std::vector<char*> argv;
  for (auto& a : storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return Error::FromErrno(errno, "socketpair", "ssh forward");
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return Error::FromErrno(err, "fork", "ssh forward");
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec. The forward must not outlive
    // the thread that started it, whatever ends it.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], 2);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    ::setpgid(0, 0);  // a terminal's ^C goes to barge, which stops ssh itself
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  f->pid_ = pid;
  f->stderr_fd_ = fds[0];

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    f->DrainStderr();
    if (env.Stat(f->local_socket_).ok()) return f;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      f->pid_ = -1;
      f->DrainStderr();
      std::string why = WIFEXITED(status) && WEXITSTATUS(status) == 127 && f->stderr_text_.empty()
                            ? args[0] + " could not be run"
                            : LastLine(f->stderr_text_);
      return Error::IoError("ssh forward of the NBD socket to " + uri.Redacted() + " failed: " +
                            (why.empty() ? "ssh exited with " + std::to_string(WEXITSTATUS(status)) : why));
    }
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return Error::Cancelled("stopped while the ssh forward to " + uri.Redacted() + " was starting");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Error::IoError("ssh forward of the NBD socket to " + uri.Redacted() + " not up after " +
                            std::to_string(timeout.count()) + " s" +
                            (f->stderr_text_.empty() ? "" : ": " + LastLine(f->stderr_text_)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void SshForward::DrainStderr() {
  if (stderr_fd_ < 0) return;
  char buf[1024];
  for (;;) {
    ssize_t n = ::recv(stderr_fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return;
    stderr_text_.append(buf, static_cast<size_t>(n));
    if (stderr_text_.size() > 8192) stderr_text_.erase(0, stderr_text_.size() - 8192);
  }
}

Status SshForward::Stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      gone = r == pid_ || (r < 0 && errno == ECHILD);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!gone) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
    }
    pid_ = -1;
  }
  if (stderr_fd_ >= 0) {
    ::close(stderr_fd_);
    stderr_fd_ = -1;
  }
  Status s = OkStatus();
  if (!dir_.empty()) {
    s = env_.UnlinkIfExists(local_socket_);
    Status removed = env_.RemoveDir(dir_);
    if (s.ok() && !removed.ok() && removed.error().code() != ErrorCode::kNotFound) s = std::move(removed);
    dir_.clear();
  }
  registration_ = TempRegistration();
  return s;
}

SshForward::~SshForward() {
  IgnoreError(Stop(), "a forward's folder that could not be removed is empty or holds only a dead socket");
}

}  // namespace barge::orchestrate
