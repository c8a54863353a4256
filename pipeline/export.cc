// barge export: nbdkit with barge's plugin, started, watched and stopped.
#include "pipeline/export.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "blockio/leftovers.h"
#include "blockio/path.h"
#include "pipeline/chain.h"
#include "pipeline/chain_files.h"
#include "pipeline/child_process.h"
#include "pipeline/point_reader.h"

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

Status CheckExists(Env& env, const std::string& path, const std::string& what) {
  auto st = env.Stat(path);
  if (st.ok()) return OkStatus();
  if (st.error().code() == ErrorCode::kNotFound) return Error::NotFound("no such " + what).set_path(path);
  return st.error();
}

// True when `path` is a unix socket of this user that nobody listens on
// (connect: ECONNREFUSED): what an export whose barge was killed leaves
// (nbdkit, ending with barge, does not remove its socket).
bool IsDeadSocketOfOurs(Env& env, const std::string& path) {
  // Not a regular file, folder, device or link (a socket or FIFO), ours;
  // a connect refused (ECONNREFUSED: a socket nobody listens on, or a FIFO
  // of ours, where nbdkit could not listen either).
  auto st = env.StatNoFollow(path);
  if (!st.ok() || st->type != FileStat::Type::kOther || st->uid != ::geteuid()) return false;
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const struct sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  const int err = rc != 0 ? errno : 0;
  ::close(fd);
  return rc != 0 && err == ECONNREFUSED;
}

// `nbdkit --version`'s output ("nbdkit 1.32.5\n"), through a file in the
// export's private run folder.
Result<std::string> NbdkitVersionText(Env& env, const std::string& nbdkit, const std::string& run_dir) {
  SpawnOptions o;
  o.stdout_path = JoinPath(run_dir, "nbdkit.version");
  ChildProcess child;
  BARGE_RETURN_IF_ERROR(child.Spawn({nbdkit, "--version"}, o, "nbdkit"));
  const int status = child.Wait();
  if (ExitStatusOf(status) != 0) {
    return Error::IoError("nbdkit --version " + DescribeWaitStatus(status)).set_path(nbdkit);
  }
  return env.ReadFile(o.stdout_path, 4096);
}

}  // namespace

bool NbdkitAbortsOnHangup(const std::string& version_text) {
  // The first "MAJOR.MINOR.MICRO" after "nbdkit ".
  const size_t at = version_text.find("nbdkit ");
  if (at == std::string::npos) return true;
  unsigned major = 0, minor = 0, micro = 0;
  if (std::sscanf(version_text.c_str() + at + 7, "%u.%u.%u", &major, &minor, &micro) != 3) return true;
  if (major != 1) return major < 1;
  if (minor != 33) return minor < 33;
  return micro < 10;
}

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
    // A killed export's socket, nobody listening on it, goes; a live one
    // (another export) or anything else at the path stays and refuses.
    if (IsDeadSocketOfOurs(env, AbsolutePath(req.socket_path))) {
      IgnoreError(env.UnlinkIfExists(AbsolutePath(req.socket_path)), "nbdkit then says the address is in use");
    }
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

  // nbdkit's PID file, in a fresh private folder (mkdtemp: 0700, ours;
  // nbdkit writes it with O_TRUNC through any link at its name, so never a
  // name someone could plant in the shared temporary folder). The folders
  // of exports whose barge was killed outright go first (ours only).
  const std::string tmp = TemporaryRoot();
  RemoveDeadProcessLeftovers(env, tmp, ".barge-export-");
  BARGE_ASSIGN_OR_RETURN(const std::string run_dir,
                         env.CreateTempDir(tmp, ".barge-export-" + std::to_string(::getpid()) + "-"));
  const std::string pid_file = JoinPath(run_dir, "nbdkit.pid");
  struct RemoveRunDir {
    Env& env;
    const std::string& dir;
    ~RemoveRunDir() { IgnoreError(env.RemoveTree(dir), "a dead export's folder is swept by the next export"); }
  } remove_run_dir{env, run_dir};
  std::vector<std::string> args = {req.nbdkit, "--foreground", "--exit-with-parent", "--pidfile", pid_file};
  if (!req.socket_path.empty()) {
    args.insert(args.end(), {"--unix", AbsolutePath(req.socket_path)});
  } else {
    args.insert(args.end(), {"--ipaddr", tcp.host, "--port", tcp.port});
  }
  // nbdkit before 1.33.10 (Debian 12 has 1.32.5) aborts, ending the export
  // for every client, when one client hangs up while several of its
  // requests are in flight: a worker thread whose reply fails closes the
  // connection's socket and another worker of the same connection then
  // asserts on it (upstream 9d82aa4f; docs/export.md). One thread per
  // connection has no second worker to trip; clients still read in
  // parallel over several connections (the plugin advertises multi-conn).
  BARGE_ASSIGN_OR_RETURN(const std::string version, NbdkitVersionText(env, req.nbdkit, run_dir));
  if (NbdkitAbortsOnHangup(version)) args.push_back("--threads=1");
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
  if (AllowOtherOwner()) args.push_back("allow-other-owner=1");  // as this process was told

  ExportResult result;
  result.served.uri = UriOf(req, tcp);
  result.served.position = reader->position();
  result.served.manifest = reader->manifest();
  result.served.writable = req.writable;
  result.served.plugin = plugin;

  ChildProcess child;
  BARGE_RETURN_IF_ERROR(child.Spawn(args, SpawnOptions{}, "nbdkit"));
  result.served.nbdkit_pid = child.pid();
  auto cleanup = [&] {
    child.Stop();
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
      return Error::IoError("nbdkit " + DescribeWaitStatus(status) + (ready ? " while serving" : " before serving") +
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
