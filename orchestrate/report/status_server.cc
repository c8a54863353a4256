#include "orchestrate/report/status_server.h"

#include <CivetServer.h>
#include <civetweb.h>
#include <netdb.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include <atomic>
#include <string>
#include <vector>

#include "blockio/fd.h"
#include "blockio/nbd.h"
#include "formats/json_fields.h"
#include "orchestrate/policy/policy_catalog.h"
#include "orchestrate/report/status_html.h"
#include "orchestrate/report/status_report.h"

namespace barge::orchestrate {

struct StatusServer::Page {
  Env* env;
  std::string catalog_path;
  SysSeconds started;
};

namespace {

using nlohmann::json;

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

// The scheduler /healthz reports on and what the status page reads: set
// while a server is attached.
std::atomic<PolicyScheduler*> g_health_of{nullptr};
std::atomic<const StatusServer::Page*> g_page_of{nullptr};

// How a reply goes: `head` (a HEAD request) sends the headers alone, with
// the Content-Length the body would have; `extra_headers` are whole lines.
struct ReplyHow {
  bool head = false;
  const char* extra_headers = "";
};

int Reply(mg_connection* conn, int code, const char* reason, const char* type, const std::string& body,
          ReplyHow how = {}) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
            "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'\r\n%sConnection: close\r\n\r\n",
            code, reason, type, body.size(), how.extra_headers);
  if (!how.head) mg_write(conn, body.data(), body.size());
  return code;
}

// The status page (`/`) or a chain page, built from the records now: a
// fresh catalog connection per request (the runner holds its own). HEAD
// (`how.head`) answers as GET without the body.
int StatusPage(mg_connection* conn, std::string_view uri, PolicyScheduler& sched, const StatusServer::Page& src,
               ReplyHow how) {
  auto chain = ChainPageIndex(uri);
  if (uri != "/" && !chain) return 0;  // the Exposer's 404
  Env& env = *src.env;
  const Policy policy = sched.policy();
  auto fail = [&](const Error& e) {
    return Reply(conn, 500, "Internal Server Error", "text/plain; charset=utf-8",
                 RedactUrisIn(e.ToString()) + "\n", how);
  };
  auto catalog = PolicyCatalog::Open(env, src.catalog_path);
  if (!catalog.ok()) return fail(catalog.error());
  auto st = CollectPolicyStatus(policy, **catalog, env, NowSeconds(), src.started);
  if (!st.ok()) return fail(st.error());
  if (chain) {
    auto section = LoadChainSection(env, *st, chain->first, chain->second);
    if (!section.ok() && section.error().code() == ErrorCode::kNotFound) {
      return Reply(conn, 404, "Not Found", "text/plain; charset=utf-8", "no such chain\n", how);
    }
    if (!section.ok()) return fail(section.error());
    return Reply(conn, 200, "OK", "text/html; charset=utf-8", RenderChainPage(*st, *section), how);
  }
  StatusPageOptions o;
  o.daemon_line = SchedulerStatusLine(sched.status());
  return Reply(conn, 200, "OK", "text/html; charset=utf-8", RenderStatusPage(*st, o), how);
}

// civetweb's begin_request: answers /healthz itself (200 while serving,
// 503 once stopping) and the status pages (GET and HEAD; any other method
// 405 with the Allow header); every other request goes on to the Exposer.
int BeginRequest(mg_connection* conn) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (info == nullptr || info->local_uri == nullptr) return 0;
  const std::string_view uri(info->local_uri);
  if (uri != "/healthz") {
    PolicyScheduler* sched = g_health_of.load();
    const StatusServer::Page* src = g_page_of.load();
    if (sched == nullptr || src == nullptr || (uri != "/" && !ChainPageIndex(uri))) return 0;
    const std::string_view method = info->request_method == nullptr ? "" : info->request_method;
    if (method != "GET" && method != "HEAD") {
      return Reply(conn, 405, "Method Not Allowed", "text/plain; charset=utf-8", "only GET and HEAD\n",
                   {false, "Allow: GET, HEAD\r\n"});
    }
    return StatusPage(conn, uri, *sched, *src, {method == "HEAD", ""});
  }
  PolicyScheduler* sched = g_health_of.load();
  SchedulerStatus st;
  if (sched != nullptr) st = sched->status();
  else st.stopping = true;
  const int code = st.stopping ? 503 : 200;
  return Reply(conn, code, code == 200 ? "OK" : "Service Unavailable", "application/json",
               formats::DumpJsonForDisplay(SchedulerStatusJson(st)) + "\n");
}

}  // namespace

json SchedulerStatusJson(const SchedulerStatus& s) {
  auto time = [](const std::optional<SysSeconds>& t) { return t ? json(FormatRfc3339(*t)) : json(nullptr); };
  return {{"status", s.stopping ? "stopping" : "ok"}, {"policy", s.policy},  {"running", s.running},
          {"last_pass_at", time(s.last_pass)},       {"next_pass_at", time(s.next_pass)},
          {"runs", s.runs},                          {"failed_runs", s.failed_runs},
          {"last_error", s.last_error}};
}

std::string SchedulerStatusLine(const SchedulerStatus& s) {
  std::string line = "policy " + s.policy + ": " + std::to_string(s.runs) + " run(s), " +
                     std::to_string(s.failed_runs) + " with failures";
  if (s.next_pass) line += "; next check " + FormatRfc3339(*s.next_pass);
  return line;
}

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

ListenAddress SplitListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) return {"", listen};
  return {listen.substr(0, colon), listen.substr(colon + 1)};
}

namespace {

// getaddrinfo and civetweb take any number as a port (civetweb wraps it);
// a TCP port is 0 to 65535.
std::string PortProblem(const std::string& port) {
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535) {
    return "the port must be a number from 0 to 65535";
  }
  return "";
}

}  // namespace

std::string ListenProblem(const std::string& listen) {
  auto [host, port] = SplitListen(listen);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (std::string p = PortProblem(port); !p.empty()) return p;
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

StatusServer::StatusServer() = default;

StatusServer::~StatusServer() { Stop(); }

Result<std::unique_ptr<StatusServer>> StatusServer::Start(const std::string& listen,
                                                          std::shared_ptr<PolicyMetricsCollector> metrics) {
  if (std::string p = PortProblem(SplitListen(listen).port); !p.empty()) {
    return Error::InvalidArgument("cannot listen on " + listen + ": " + p);
  }
  std::unique_ptr<StatusServer> server(new StatusServer());
  static CivetCallbacks callbacks{};
  callbacks.begin_request = BeginRequest;
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(CivetOptions(listen), &callbacks);
  } catch (const std::exception& e) {
    // civetweb's exception says only "null context when constructing
    // CivetServer": ask the system why.
    const std::string why = ListenProblem(listen);
    return Error::IoError("cannot listen on " + listen + ": " + (why.empty() ? e.what() : why));
  }
  server->exposer_->RegisterCollectable(metrics);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  server->port_ = ports.empty() ? 0 : ports.front();
  server->address_ = SplitListen(listen).host + ":" + std::to_string(server->port_);
  return server;
}

void StatusServer::Attach(Env& env, PolicyScheduler& sched, std::string catalog_path, SysSeconds started) {
  page_ = std::make_unique<Page>(Page{&env, std::move(catalog_path), started});
  g_page_of = page_.get();
  g_health_of = &sched;
}

void StatusServer::Stop() {
  g_health_of = nullptr;
  exposer_.reset();  // waits for the requests in progress
  g_page_of = nullptr;
}

}  // namespace barge::orchestrate
