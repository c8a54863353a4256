// barge export: nbdkit with barge's plugin, started, watched and stopped.
#include "pipeline/export.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "blockio/path.h"
#include "pipeline/chain.h"
#include "pipeline/point_reader.h"

extern char** environ;

namespace barge::pipeline {

namespace {

constexpr char kPluginName[] = "nbdkit-barge-plugin.so";

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct ListenAddress {
  std::string host;  // as nbdkit -i takes it (no brackets)
  std::string port;
};

Result<ListenAddress> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return Error::InvalidArgument("--listen takes ADDR:PORT (127.0.0.1:10809, [::1]:10809), not '" + listen + "'");
  }
  ListenAddress a{listen.substr(0, colon), listen.substr(colon + 1)};
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
  for (char c : a.port) {
    if (c < '0' || c > '9') return Error::InvalidArgument("--listen: port '" + a.port + "' is not a number");
  }
  if (a.port.size() > 5 || std::stoul(a.port) > 65535 || std::stoul(a.port) == 0) {
    return Error::InvalidArgument("--listen: port " + a.port + " is out of range (1-65535)");
  }
  return a;
}

std::string UriOf(const ExportRequest& req, const ListenAddress& tcp) {
  const bool tls = !req.tls_certificates.empty() || !req.tls_psk_file.empty();
  if (!req.socket_path.empty()) {
    return std::string(tls ? "nbds+unix" : "nbd+unix") + ":///?socket=" + AbsolutePath(req.socket_path);
  }
  const bool v6 = tcp.host.find(':') != std::string::npos;
  return std::string(tls ? "nbds" : "nbd") + "://" + (v6 ? "[" + tcp.host + "]" : tcp.host) + ":" + tcp.port + "/";
}

// A child process (nbdkit) in its own process group, stopped by PID.
class Child {
 public:
  Child() = default;
  ~Child() { Stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  Status Spawn(const std::vector<std::string>& args, bool stdout_to_stderr) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    // Under --json stdout carries barge's events only: nbdkit's messages
    // go to stderr with the rest of its log.
    if (stdout_to_stderr) posix_spawn_file_actions_adddup2(&actions, 2, 1);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    // Its own group: a Ctrl-C in the terminal reaches barge, which stops
    // nbdkit itself (and reports how it ended).
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc == ENOENT) {
      return Error::NotFound("nbdkit is not installed (Debian: apt-get install nbdkit)").set_path(args[0]);
    }
    if (rc != 0) return Error::FromErrno(rc, "posix_spawn", args[0]);
    pid_ = pid;
    return OkStatus();
  }

  int64_t pid() const { return pid_; }

  // True once the child ended (its status in `status`); never blocks.
  bool Exited(int* status) {
    if (pid_ <= 0) {
      *status = status_;
      return true;
    }
    int st = 0;
    pid_t r = ::waitpid(static_cast<pid_t>(pid_), &st, WNOHANG);
    if (r == static_cast<pid_t>(pid_)) {
      pid_ = 0;
      status_ = st;
      *status = st;
      return true;
    }
    return false;
  }

  // SIGTERM, then SIGKILL after `grace`; reaps the child.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(10)) {
    if (pid_ <= 0) return;
    int st = 0;
    if (Exited(&st)) return;
    ::kill(static_cast<pid_t>(pid_), SIGTERM);
    const auto kill_at = std::chrono::steady_clock::now() + grace;
    while (!Exited(&st)) {
      if (std::chrono::steady_clock::now() >= kill_at) {
        ::kill(static_cast<pid_t>(pid_), SIGKILL);
        ::waitpid(static_cast<pid_t>(pid_), &st, 0);
        pid_ = 0;
        status_ = st;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

 private:
  int64_t pid_ = 0;
  int status_ = 0;
};

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended";
}

Status CheckExists(Env& env, const std::string& path, const std::string& what) {
  auto st = env.Stat(path);
  if (st.ok()) return OkStatus();
  if (st.error().code() == ErrorCode::kNotFound) return Error::NotFound("no such " + what).set_path(path);
  return st.error();
}

}  // namespace

Result<std::string> FindExportPlugin(Env& env) {
  std::vector<std::string> candidates;
  if (auto self = env.RealPath("/proc/self/exe"); self.ok()) {
    const std::string dir = DirName(*self);
    candidates.push_back(JoinPath(dir, kPluginName));
    candidates.push_back(LexicallyNormal(JoinPath(dir, std::string("../lib/barge/") + kPluginName)));
  }
#ifdef BARGE_PLUGIN_DIR
  candidates.push_back(JoinPath(BARGE_PLUGIN_DIR, kPluginName));
#endif
  std::string looked;
  for (const std::string& c : candidates) {
    if (env.Exists(c)) return c;
    looked += (looked.empty() ? "" : ", ") + c;
  }
  return Error::NotFound("barge's nbdkit plugin is not installed (looked in: " + looked +
                         "); build the nbdkit-barge-plugin target, or cmake --install")
      .set_path(kPluginName);
}

Result<ExportResult> RunExport(Env& env, const ExportRequest& req) {
  if (req.socket_path.empty() == req.listen.empty()) {
    return Error::InvalidArgument("give exactly one of --socket PATH and --listen ADDR:PORT");
  }
  if (!req.tls_certificates.empty() && !req.tls_psk_file.empty()) {
    return Error::InvalidArgument("give one of --tls-certificates and --tls-psk-file, not both");
  }
  ListenAddress tcp;
  if (!req.listen.empty()) {
    BARGE_ASSIGN_OR_RETURN(tcp, ParseListen(req.listen));
  }
  if (!req.tls_certificates.empty()) BARGE_RETURN_IF_ERROR(CheckExists(env, req.tls_certificates, "TLS certificates folder"));
  if (!req.tls_psk_file.empty()) BARGE_RETURN_IF_ERROR(CheckExists(env, req.tls_psk_file, "TLS PSK file"));
  if (!req.socket_path.empty()) {
    if (env.Exists(req.socket_path)) {
      return Error::InvalidArgument("something is already at the socket path (another export? remove it first)")
          .set_path(req.socket_path);
    }
    BARGE_RETURN_IF_ERROR(CheckExists(env, DirName(AbsolutePath(req.socket_path)), "folder for the socket"));
  }

  // The whole check before serving; the reader's export lock keeps merge
  // and forget off the folder until we return (nbdkit's plugin takes its
  // own as well).
  BARGE_ASSIGN_OR_RETURN(PointLocation where, LocatePoint(env, req.chain, req.at));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<PointReader> reader, PointReader::Open(env, where.chain_dir, where.at));
  std::string plugin = req.plugin;
  if (plugin.empty()) {
    BARGE_ASSIGN_OR_RETURN(plugin, FindExportPlugin(env));
  }

  const std::string pid_file =
      JoinPath(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp",
               ".barge-export-" + std::to_string(::getpid()) + ".pid");
  IgnoreError(env.UnlinkIfExists(pid_file), "nbdkit writes it anew");
  std::vector<std::string> args = {req.nbdkit, "--foreground", "--exit-with-parent", "--pidfile", pid_file};
  if (!req.socket_path.empty()) {
    args.insert(args.end(), {"--unix", AbsolutePath(req.socket_path)});
  } else {
    args.insert(args.end(), {"--ipaddr", tcp.host, "--port", tcp.port});
  }
  if (req.writable) {
    args.push_back("--filter=cow");
  } else {
    args.push_back("--readonly");
  }
  if (!req.tls_certificates.empty()) {
    args.insert(args.end(), {"--tls=require", "--tls-certificates=" + AbsolutePath(req.tls_certificates)});
  } else if (!req.tls_psk_file.empty()) {
    args.insert(args.end(), {"--tls=require", "--tls-psk=" + AbsolutePath(req.tls_psk_file)});
  }
  // The point by its id: the same point even if a backup adds a newer one
  // between our check and the plugin's.
  args.insert(args.end(), {plugin, "chain=" + AbsolutePath(where.chain_dir), "at=" + reader->manifest().id});

  ExportResult result;
  result.served.uri = UriOf(req, tcp);
  result.served.position = reader->position();
  result.served.manifest = reader->manifest();
  result.served.writable = req.writable;
  result.served.plugin = plugin;

  Child child;
  BARGE_RETURN_IF_ERROR(child.Spawn(args, /*stdout_to_stderr=*/true));
  result.served.nbdkit_pid = child.pid();
  auto cleanup = [&] {
    child.Stop();
    IgnoreError(env.UnlinkIfExists(pid_file), "a stale PID file in the temporary folder is harmless");
    if (!req.socket_path.empty()) {
      IgnoreError(env.UnlinkIfExists(AbsolutePath(req.socket_path)), "nbdkit may have removed it itself");
    }
  };
  auto cancelled = [&] { return req.cancel != nullptr && req.cancel->load(); };

  // nbdkit writes its PID file once it listens.
  bool ready = false;
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    if (child.Exited(&status)) {
      cleanup();
      return Error::IoError("nbdkit " + DescribeStatus(status) + (ready ? " while serving" : " before serving") +
                            " (its messages are above)")
          .set_path(req.nbdkit);
    }
    if (cancelled()) break;
    if (!ready) {
      auto text = env.ReadFile(pid_file, 64);
      if (text.ok() && !text->empty() && text->back() == '\n') {
        ready = true;
        start = std::chrono::steady_clock::now();
        if (req.on_ready) req.on_ready(result.served);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(ready ? 100 : 20));
  }
  cleanup();
  result.seconds = ready ? SecondsSince(start) : 0;
  result.stopped = true;
  return result;
}

}  // namespace barge::pipeline
