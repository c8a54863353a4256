// barge serve: a policy's daemon (docs/policies.md, "barge serve"): the
// scheduler loop on its own thread, /metrics (prometheus-cpp's Exposer with
// the policy's collector) and /healthz on one listening address, SIGHUP to
// reload the policy, SIGTERM/SIGINT to stop the run in progress and exit,
// systemd's readiness notifications, and the status page at `/` with a
// page per chain at /chain/I/J (docs/status_page.md).
#include <CivetServer.h>
#include <civetweb.h>
#include <netdb.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "blockio/fd.h"
#include "blockio/nbd.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/interrupt.h"
#include "cli/owner_flag.h"
#include "cli/policy_output.h"
#include "cli/sd_notify.h"
#include "formats/json_fields.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/policy/policy_hooks.h"
#include "orchestrate/policy/policy_scheduler.h"
#include "orchestrate/report/status_html.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

constexpr const char* kDefaultListen = "127.0.0.1:9847";

// civetweb's workers each hold one connection from its first byte to its
// answer; a client that opens connections and sends half a request would
// hold them all (civetweb waits 30 s by default), and /healthz with them.
// Many workers, and a short wait for a whole request: /metrics and
// /healthz are answered from memory in milliseconds, so an honest scraper
// never comes near it (issue 35). Held connections then cost a worker for
// at most kRequestTimeoutMs each.
constexpr int kServeWorkers = 32;
constexpr int kRequestTimeoutMs = 2000;

// The Exposer's civetweb options for `listen`.
std::vector<std::string> CivetOptions(const std::string& listen) {
  return {"listening_ports",    listen,
          "num_threads",        std::to_string(kServeWorkers),
          "request_timeout_ms", std::to_string(kRequestTimeoutMs),
          "enable_keep_alive",  "no"};
}

// The scheduler /healthz reports on (civetweb's callback has no user data
// of ours: the Exposer owns the server). Set while serve runs.
std::atomic<orc::PolicyScheduler*> g_health_of{nullptr};

json StatusJson(const orc::SchedulerStatus& s) {
  auto time = [](const std::optional<orc::SysSeconds>& t) {
    return t ? json(orc::FormatRfc3339(*t)) : json(nullptr);
  };
  return {{"status", s.stopping ? "stopping" : "ok"}, {"policy", s.policy},  {"running", s.running},
          {"last_pass_at", time(s.last_pass)},       {"next_pass_at", time(s.next_pass)},
          {"runs", s.runs},                          {"failed_runs", s.failed_runs},
          {"last_error", s.last_error}};
}

std::string StatusLine(const orc::SchedulerStatus& s) {
  std::string line = "policy " + s.policy + ": " + std::to_string(s.runs) + " run(s), " +
                     std::to_string(s.failed_runs) + " with failures";
  if (s.next_pass) line += "; next check " + orc::FormatRfc3339(*s.next_pass);
  return line;
}

// What the status page reads besides the scheduler's policy: set while
// serve runs.
struct PageSource {
  std::string catalog_path;
  orc::SysSeconds started;  // known_since of sources without a run, as /metrics
};
std::atomic<const PageSource*> g_page_of{nullptr};

int Reply(mg_connection* conn, int code, const char* reason, const char* type, const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
            "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\nConnection: close\r\n\r\n",
            code, reason, type, body.size());
  mg_write(conn, body.data(), body.size());
  return code;
}

// "/chain/I/J" -> {I, J}; nullopt for anything else.
std::optional<std::pair<size_t, size_t>> ChainPageIndex(std::string_view uri) {
  constexpr std::string_view kPrefix = "/chain/";
  if (!uri.starts_with(kPrefix)) return std::nullopt;
  uri.remove_prefix(kPrefix.size());
  const size_t slash = uri.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto number = [](std::string_view t) -> std::optional<size_t> {
    if (t.empty() || t.size() > 6 || t.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
    return static_cast<size_t>(std::stoul(std::string(t)));
  };
  auto i = number(uri.substr(0, slash)), j = number(uri.substr(slash + 1));
  if (!i || !j) return std::nullopt;
  return std::make_pair(*i, *j);
}

// The status page (`/`) or a chain page, built from the records now: a
// fresh catalog connection per request (the runner holds its own).
int StatusPage(mg_connection* conn, std::string_view uri, orc::PolicyScheduler& sched, const PageSource& src) {
  auto chain = ChainPageIndex(uri);
  if (uri != "/" && !chain) return 0;  // the Exposer's 404
  Env& env = Env::Default();
  const orc::Policy policy = sched.policy();
  auto fail = [&](const Error& e) {
    return Reply(conn, 500, "Internal Server Error", "text/plain; charset=utf-8",
                 RedactUrisIn(e.ToString()) + "\n");
  };
  auto catalog = orc::PolicyCatalog::Open(env, src.catalog_path);
  if (!catalog.ok()) return fail(catalog.error());
  auto st = orc::CollectPolicyStatus(policy, **catalog, env, orc::NowSeconds(), src.started);
  if (!st.ok()) return fail(st.error());
  if (chain) {
    auto section = orc::LoadChainSection(env, *st, chain->first, chain->second);
    if (!section.ok() && section.error().code() == ErrorCode::kNotFound) {
      return Reply(conn, 404, "Not Found", "text/plain; charset=utf-8", "no such chain\n");
    }
    if (!section.ok()) return fail(section.error());
    return Reply(conn, 200, "OK", "text/html; charset=utf-8", orc::RenderChainPage(*st, *section));
  }
  orc::StatusPageOptions o;
  o.daemon_line = StatusLine(sched.status());
  return Reply(conn, 200, "OK", "text/html; charset=utf-8", orc::RenderStatusPage(*st, o));
}

// civetweb's begin_request: answers /healthz itself (200 while serving,
// 503 once stopping) and the status pages; every other request goes on to
// the Exposer.
int BeginRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const std::string_view uri(info->local_uri);
  if (uri != "/healthz") {
    orc::PolicyScheduler* sched = g_health_of.load();
    const PageSource* src = g_page_of.load();
    if (sched == nullptr || src == nullptr || info->request_method == nullptr ||
        std::string_view(info->request_method) != "GET") {
      return 0;
    }
    return StatusPage(conn, uri, *sched, *src);
  }
  orc::PolicyScheduler* sched = g_health_of.load();
  orc::SchedulerStatus st;
  if (sched != nullptr) st = sched->status();
  else st.stopping = true;
  const int code = st.stopping ? 503 : 200;
  return Reply(conn, code, code == 200 ? "OK" : "Service Unavailable", "application/json",
               formats::DumpJsonForDisplay(StatusJson(st)) + "\n");
}

// --listen HOST:PORT split at its last colon; the host as given (an IPv6
// one in brackets), "" when there is no colon (a port alone).
struct ListenAddress {
  std::string host;
  std::string port;
};
ListenAddress SplitListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return {"", listen};
  return {listen.substr(0, colon), listen.substr(colon + 1)};
}

// Why civetweb could not listen on `listen` (its exception says only "null
// context when constructing CivetServer"): binds the address once, as it
// would, and returns the system's reason ("Address already in use"), or
// "" when the bind works now.
std::string ListenProblem(const std::string& listen) {
  auto [host, port] = SplitListen(listen);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return std::string("cannot resolve the address: ") + ::gai_strerror(rc);
  }
  std::string problem;
  for (addrinfo* a = found; a != nullptr && problem.empty(); a = a->ai_next) {
    const Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) continue;
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as civetweb does
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 1) != 0) {
      const int err = errno;
      problem = std::string(std::strerror(err)) + (err == EADDRINUSE ? " (another process listens there)" : "");
    }
  }
  ::freeaddrinfo(found);
  return problem;
}

struct ServeArgs {
  std::string policy, listen = kDefaultListen, metrics_textfile, catalog, memory = "256M";
  int threads = 0;
};

int RunServe(ServeArgs& a, Output& out) {
  auto policy = orc::LoadPolicy(Env::Default(), a.policy);
  if (!policy.ok()) return out.Fail(policy.error());
  // Before anything can take a while: a SIGHUP from now on is a reload.
  InstallReloadHandling();
  uint64_t reloads_seen = ReloadRequests();

  orc::SchedulerOptions so;
  auto catalog_path = orc::CatalogPathFromFlag(Env::Default(), a.catalog);
  if (!catalog_path.ok()) return out.Fail(catalog_path.error());
  so.run.catalog_path = *catalog_path;
  if (Status s = ApplyResourceFlags(a.memory, a.threads, so.run.copy); !s.ok()) return out.Usage(s.error().message());
  auto hooks = orc::NewPolicyHookRunner();
  so.run.hooks = hooks.get();
  so.metrics_textfile = a.metrics_textfile;
  auto collector = std::make_shared<orc::PolicyMetricsCollector>();
  so.metrics = collector.get();
  const auto serve_start = std::chrono::steady_clock::now();
  orc::PolicyScheduler* sched_ptr = nullptr;  // set before the loop starts
  so.on_run = [&out, &sched_ptr](const orc::RunReport& r) {
    const orc::Policy p = sched_ptr->policy();
    out.Event("run", RunReportJson(p, r));
    PrintRunReport(out.text(), p, r);
    out.text().flush();
  };
  so.on_error = [&out](const Error& e) { out.Warning(e.ToString()); };

  std::unique_ptr<prometheus::Exposer> exposer;
  static CivetCallbacks callbacks{};
  callbacks.begin_request = BeginRequest;
  try {
    exposer = std::make_unique<prometheus::Exposer>(CivetOptions(a.listen), &callbacks);
  } catch (const std::exception& e) {
    const std::string why = ListenProblem(a.listen);
    return out.Fail(Error::IoError("cannot listen on " + a.listen + ": " + (why.empty() ? e.what() : why) +
                                   " (--listen HOST:PORT)"));
  }
  exposer->RegisterCollectable(collector);
  const std::vector<int> ports = exposer->GetListeningPorts();
  const int port = ports.empty() ? 0 : ports.front();
  const std::string address = SplitListen(a.listen).host + ":" + std::to_string(port);

  orc::PolicyScheduler sched(Env::Default(), *policy, so);
  sched_ptr = &sched;
  const PageSource page{*catalog_path, orc::NowSeconds()};
  g_page_of = &page;
  g_health_of = &sched;
  std::thread loop([&sched] { sched.Loop(); });

  auto ready = [&](bool reloaded) {
    orc::Policy p = sched.policy();
    json j = {{"policy", p.name},        {"policy_file", a.policy}, {"listen", address}, {"port", port},
              {"metrics_url", "http://" + address + "/metrics"},    {"health_url", "http://" + address + "/healthz"},
              {"status_url", "http://" + address + "/"},
              {"reloaded", reloaded},    {"pid", static_cast<int64_t>(::getpid())}};
    out.Event("ready", j);
    out.text() << (reloaded ? "reloaded policy " : "serving policy ") << p.name << " from " << a.policy
               << ": status page at http://" << address << "/, metrics at /metrics, health at /healthz\n";
    out.text().flush();
    if (Status s = SdNotify("READY=1\nSTATUS=" + StatusLine(sched.status())); !s.ok()) {
      out.Warning("sd_notify: " + s.error().ToString());
    }
  };
  ready(false);

  // The main thread watches the signals; the loop thread does the work.
  int signal = 0;
  for (;;) {
    if (CancelFlag().load()) {
      signal = InterruptSignal();
      static_cast<void>(SdNotify("STOPPING=1\nSTATUS=stopping: " + SignalStopReason()));
      out.text() << "barge serve: " << SignalStopReason() << ": stopping the run in progress\n";
      out.text().flush();
      sched.Stop(SignalStopReason());
      break;
    }
    if (uint64_t n = ReloadRequests(); n != reloads_seen) {
      reloads_seen = n;
      static_cast<void>(SdNotify(SdReloadingMessage()));
      auto fresh = orc::LoadPolicy(Env::Default(), a.policy);
      if (fresh.ok()) {
        sched.Replace(std::move(fresh).value());
        ready(true);
      } else {
        out.Warning("reload failed; keeping policy " + sched.policy().name + ": " + fresh.error().ToString(),
                    a.policy);
        static_cast<void>(SdNotify("READY=1\nSTATUS=reload failed, old policy kept"));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  loop.join();
  g_health_of = nullptr;
  exposer.reset();
  g_page_of = nullptr;
  const orc::SchedulerStatus st = sched.status();
  out.Result({{"policy", st.policy},
              {"runs", st.runs},
              {"failed_runs", st.failed_runs},
              {"stopped_by", signal == SIGINT ? "SIGINT" : "SIGTERM"},
              {"uptime_seconds",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - serve_start).count()}});
  out.text() << "barge serve: stopped (" << st.runs << " run(s))\n";
  // A daemon stops only by a signal: the result says what it did, the
  // error event after it why it stopped (exit 130/143, as every command a
  // signal stops; docs/json.md, "serve's daemon events").
  return out.Fail(Error::Cancelled(signal == SIGINT ? "stopped by SIGINT" : "stopped by SIGTERM"),
                  signal != 0 ? 128 + signal : kExitSigterm);
}

}  // namespace

void RegisterServeCommand(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = AddCommand(app, "serve",
                         "Run a policy as a daemon: its schedule, a status page at /, /metrics and /healthz; "
                         "SIGHUP reloads, SIGTERM stops",
                         exit_code, [a](Output& out) { return RunServe(*a, out); });
  AddAllowOtherOwnerFlag(cmd);
  cmd->add_option("--policy", a->policy, "Policy file (YAML); SIGHUP reads it again")->required();
  cmd->add_option("--listen", a->listen, "HOST:PORT for the status page, /metrics and /healthz (port 0: any free one)")
      ->capture_default_str();
  cmd->add_option("--metrics-textfile", a->metrics_textfile,
                  "Also write the metrics there after each check, atomically (node-exporter textfile collector)");
  cmd->add_option("--catalog", a->catalog, "Catalog database (run records)");
  cmd->add_option("--threads", a->threads, "Worker threads per backup (0 = all cores)")->capture_default_str();
  cmd->add_option("--memory", a->memory, "Data in flight per backup")->capture_default_str();
}

}  // namespace barge::cli
