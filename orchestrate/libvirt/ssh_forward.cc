// ssh -L of a remote unix socket, checked, restarted when its session is
// cut, stopped by PID.
#include "orchestrate/libvirt/ssh_forward.h"

#include <signal.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstdlib>
#include <cstring>
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

// How long a check of the forward waits for the NBD server's greeting.
constexpr std::chrono::milliseconds kProbeWait{5000};

// ssh's line saying that a channel (a connection through the forward)
// could not be opened on the server, e.g. "channel 1: open failed:
// administratively prohibited: open failed" (OpenSSH 9.2 says "connect
// failed: open failed" for a refused unix socket forward); "" when none.
std::string OpenFailedLine(const std::string& text) {
  size_t at = text.find(": open failed: ");
  if (at == std::string::npos) return "";
  size_t start = text.rfind('\n', at);
  start = start == std::string::npos ? 0 : start + 1;
  size_t end = text.find_first_of("\r\n", at);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

std::vector<std::string> SshForwardCommand(const LibvirtUri& uri, const std::string& local_socket,
                                           const std::string& remote_socket) {
  std::string ssh = uri.Param("command");
  std::vector<std::string> argv = {ssh.empty() ? "ssh" : ssh, "-N", "-n", "-T",
                                   "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
                                   "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3"};
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

std::string KnownHostsNote(const LibvirtUri& uri) {
  if (!uri.ssh() || uri.Param("known_hosts").empty()) return "";
  const std::string no_verify = uri.Param("no_verify");
  if (!no_verify.empty() && no_verify != "0") return "";
  return "known_hosts= is read by barge's ssh forward of the NBD socket only: libvirt's ssh transport "
         "(qemu+ssh://) checks the host key of its own connection with ssh's known hosts files "
         "(~/.ssh/known_hosts, or UserKnownHostsFile in ssh_config); libvirt reads known_hosts= only for "
         "qemu+libssh:// and qemu+libssh2://";
}

SshForward::SshForward(Env& env, const LibvirtUri& uri, std::string remote_socket, const std::atomic<bool>* cancel,
                       std::chrono::seconds timeout, std::string dir, std::string local_socket)
    : env_(env), uri_(uri), remote_socket_(std::move(remote_socket)), cancel_(cancel), timeout_(timeout),
      dir_(std::move(dir)), local_socket_(std::move(local_socket)), registration_(local_socket_) {}

Result<std::unique_ptr<SshForward>> SshForward::Start(Env& env, const LibvirtUri& uri,
                                                      const std::string& remote_socket,
                                                      const std::atomic<bool>* cancel,
                                                      std::chrono::seconds timeout) {
  if (!uri.ssh() || uri.host.empty()) {
    return Error::InvalidArgument("an ssh forward needs a qemu+ssh:// URI with a host, not " + uri.Redacted());
  }
  BARGE_ASSIGN_OR_RETURN(std::string dir, MakePrivateDir(env));
  std::unique_ptr<SshForward> f(new SshForward(env, uri, remote_socket, cancel, timeout, dir, dir + "/nbd.sock"));
  {
    std::lock_guard<std::mutex> lock(f->mu_);
    Status launched = f->Launch();
    // A forward that works, or one whose first connection failed for a
    // reason that the NBD reader's own retries may get past (ssh runs).
    if (!launched.ok() && !(launched.error().code() == ErrorCode::kIoError && f->pid_ > 0)) {
      return std::move(launched).error();
    }
  }
  f->watcher_ = std::thread([forward = f.get()] { forward->Watch(); });
  return f;
}

Status SshForward::Launch() {
  const std::vector<std::string> args = SshForwardCommand(uri_, local_socket_, remote_socket_);
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
  const int fork_errno = errno;
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
  if (pid < 0) {
    ::close(fds[0]);
    return Error::FromErrno(fork_errno, "fork", "ssh forward");
  }
  pid_ = pid;
  stderr_fd_ = fds[0];
  stderr_text_.clear();

  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    DrainStderr();
    if (env_.Stat(local_socket_).ok()) break;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      DrainStderr();
      std::string why = WIFEXITED(status) && WEXITSTATUS(status) == 127 && stderr_text_.empty()
                            ? args[0] + " could not be run"
                            : LastLine(stderr_text_);
      return Error::IoError("ssh forward of the NBD socket to " + uri_.Redacted() + " failed: " +
                            (why.empty() ? "ssh exited with " + std::to_string(WEXITSTATUS(status)) : why))
          .set_retryable(true);
    }
    if (Stopping()) {
      StopProcess();
      return Error::Cancelled("stopped while the ssh forward to " + uri_.Redacted() + " was starting");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string text = stderr_text_;
      StopProcess();
      return Error::IoError("ssh forward of the NBD socket to " + uri_.Redacted() + " not up after " +
                            std::to_string(timeout_.count()) + " s" +
                            (text.empty() ? "" : ": " + LastLine(text)))
          .set_retryable(true);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Status probed = Probe(kProbeWait);
  if (!probed.ok() && !probed.error().retryable()) StopProcess();
  return probed;
}

Status SshForward::Probe(std::chrono::milliseconds wait) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::FromErrno(errno, "socket", local_socket_).set_retryable(true);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (local_socket_.size() >= sizeof addr.sun_path) {
    return Error::InvalidArgument("the ssh forward's socket path is too long").set_path(local_socket_);
  }
  std::memcpy(addr.sun_path, local_socket_.c_str(), local_socket_.size() + 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Error::FromErrno(errno, "connect through the ssh forward", local_socket_).set_retryable(true);
  }
  // The NBD server speaks first (its greeting): a byte means the channel
  // reached it. A refused channel is closed by ssh, which says why on its
  // stderr ("channel N: open failed: ...") about when it closes it.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  ssize_t got = -1;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 100);
    if (ready > 0) {
      char byte;
      got = ::recv(fd, &byte, 1, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      break;
    }
    if (Stopping()) {
      return Error::Cancelled("stopped while checking the ssh forward to " + uri_.Redacted());
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      DrainStderr();
      return Error::IoError("no answer through the ssh forward of the NBD socket to " + uri_.Redacted() +
                            " within " + std::to_string(wait.count() / 1000) + " s" +
                            (stderr_text_.empty() ? "" : " (ssh: " + LastLine(stderr_text_) + ")"))
          .set_retryable(true);
    }
  }
  if (got > 0) return OkStatus();
  std::string refusal;
  for (int i = 0; i < 20 && refusal.empty(); ++i) {
    DrainStderr();
    refusal = OpenFailedLine(stderr_text_);
    if (refusal.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!refusal.empty()) {
    return Error::NotSupported("the SSH server refused to forward the NBD socket: AllowStreamLocalForwarding is "
                               "off in the sshd_config of " + uri_.Redacted() + " (it must be yes or local), or "
                               "the socket " + remote_socket_ + " is gone from that host (ssh: " + refusal + ")");
  }
  return Error::IoError("the ssh forward of the NBD socket to " + uri_.Redacted() +
                        " closed the connection before the NBD server answered" +
                        (stderr_text_.empty() ? "" : " (ssh: " + LastLine(stderr_text_) + ")"))
      .set_retryable(true);
}

bool SshForward::Stopping() const {
  return stopping_.load() || (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed));
}

void SshForward::Watch() {
  using std::chrono::milliseconds;
  std::unique_lock<std::mutex> lock(mu_);
  milliseconds backoff{0};
  while (!Stopping()) {
    const bool refused = restart_error_ && !restart_error_->retryable();
    wake_.wait_for(lock, backoff.count() > 0 ? backoff : milliseconds(100), [&] { return Stopping(); });
    if (Stopping()) return;
    int status = 0;
    if (refused || (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == 0)) continue;
    // ssh is gone (killed, its TCP connection reset, the server silent):
    // a new session on the same local socket, which the dead one may have
    // left behind (ssh would not bind over it).
    pid_ = -1;
    StopProcess();
    IgnoreError(env_.UnlinkIfExists(local_socket_), "the new ssh's bind then fails and says so");
    ++restarts_;
    Status launched = Launch();
    if (launched.ok() || pid_ > 0) {
      restart_error_.reset();
      backoff = milliseconds(0);
    } else {
      restart_error_ = launched.error();
      backoff = std::min(backoff.count() == 0 ? milliseconds(1000) : backoff * 2, milliseconds(5000));
    }
    launched_.notify_all();
  }
  launched_.notify_all();
}

Status SshForward::Restore() {
  std::unique_lock<std::mutex> lock(mu_);
  if (Stopping()) return Error::Cancelled("stopped while restoring the ssh forward to " + uri_.Redacted());
  int status = 0;
  if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == 0) {
    Status probed = Probe(kProbeWait);
    if (probed.ok() || !probed.error().retryable()) return probed;
    // Running but carrying nothing (a stalled session): the watching
    // thread starts a new one.
    StopProcess();
  } else {
    pid_ = -1;  // reaped here: the watching thread restarts it
  }
  const int before = restarts_;
  wake_.notify_all();
  // A restart that is under way holds mu_; the wait ends at the next one's end.
  launched_.wait_for(lock, timeout_, [&] {
    return Stopping() || restarts_ != before || (restart_error_ && !restart_error_->retryable());
  });
  if (Stopping()) return Error::Cancelled("stopped while restoring the ssh forward to " + uri_.Redacted());
  if (pid_ > 0) return OkStatus();
  if (restart_error_) return *restart_error_;
  return Error::IoError("the ssh forward to " + uri_.Redacted() + " is not back yet").set_retryable(true);
}

int SshForward::restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

pid_t SshForward::pid() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pid_;
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

void SshForward::StopProcess() {
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
}

Status SshForward::Stop() {
  // The watching thread first: it may be starting an ssh (Launch sees
  // stopping_ and stops it).
  stopping_ = true;
  wake_.notify_all();
  launched_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  Status s = OkStatus();
  {
    std::lock_guard<std::mutex> lock(mu_);
    StopProcess();
    if (!dir_.empty()) {
      s = env_.UnlinkIfExists(local_socket_);
      Status removed = env_.RemoveDir(dir_);
      if (s.ok() && !removed.ok() && removed.error().code() != ErrorCode::kNotFound) s = std::move(removed);
      dir_.clear();
    }
    registration_ = TempRegistration();
  }
  return s;
}

SshForward::~SshForward() {
  IgnoreError(Stop(), "a forward's folder that could not be removed is empty or holds only a dead socket");
}

}  // namespace barge::orchestrate
