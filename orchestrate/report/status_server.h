// serve's HTTP server (docs/policies.md, "barge serve"; docs/status_page.md):
// prometheus-cpp's Exposer with the policy's collector at /metrics, and on
// the same civetweb server /healthz (200 while serving, 503 once stopping)
// and the status page at `/` with a page per chain at /chain/I/J. The cli
// starts it, attaches the scheduler and prints; nothing here prints.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/policy/policy_metrics.h"
#include "orchestrate/policy/policy_scheduler.h"
#include "orchestrate/schedule/time_text.h"

namespace prometheus {
class Exposer;
}

namespace barge::orchestrate {

// /healthz's body for `s` (docs/json.md, "serve's daemon events").
nlohmann::json SchedulerStatusJson(const SchedulerStatus& s);

// One line on the daemon: "policy P: N run(s), F with failures; next check
// T" (the status page's daemon line and systemd's STATUS=).
std::string SchedulerStatusLine(const SchedulerStatus& s);

// "/chain/I/J" -> {I, J} (each at most six digits); nullopt for anything
// else.
std::optional<std::pair<size_t, size_t>> ChainPageIndex(std::string_view uri);

// --listen HOST:PORT split at its last colon; the host as given (an IPv6
// one in brackets), "" when there is no colon (a port alone).
struct ListenAddress {
  std::string host;
  std::string port;
};
ListenAddress SplitListen(const std::string& listen);

// Why a server could not listen on `listen`: binds the address once, as
// civetweb would, and returns the system's reason ("Address already in
// use (another process listens there)"), or "" when the bind works now.
std::string ListenProblem(const std::string& listen);

// One status server per process (civetweb's callback carries no data of
// ours: what it serves is process-wide while attached).
class StatusServer {
 public:
  // Listens on `listen` ("HOST:PORT", port 0: any free one) and serves
  // `metrics` at /metrics; /healthz answers 503 and `/` the Exposer's 404
  // until Attach. kIoError "cannot listen on L: why" when it cannot.
  static Result<std::unique_ptr<StatusServer>> Start(const std::string& listen,
                                                     std::shared_ptr<PolicyMetricsCollector> metrics);
  ~StatusServer();  // Stop()
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  int port() const { return port_; }
  // "HOST:PORT" with the port listened on (the host as --listen gave it).
  const std::string& address() const { return address_; }

  // From now on /healthz reports `sched` and `/` (GET) shows its policy's
  // status from the records at `catalog_path`, a fresh catalog connection
  // per request through `env`; `started` is known_since of sources without
  // a run, as /metrics. All must outlive Stop().
  void Attach(Env& env, PolicyScheduler& sched, std::string catalog_path, SysSeconds started);
  // /healthz answers 503 from now on; then the server stops listening.
  // Idempotent.
  void Stop();

  struct Page;  // what Attach gave, read by civetweb's callback (opaque)

 private:
  StatusServer();
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<Page> page_;
  int port_ = 0;
  std::string address_;
};

}  // namespace barge::orchestrate
