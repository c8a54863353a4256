// barge serve: a policy's daemon (docs/policies.md, "barge serve"): the
// scheduler loop on its own thread, the status server (orchestrate/report/
// status_server.h: /metrics, /healthz, the status page) on one listening
// address, SIGHUP to reload the policy, SIGTERM/SIGINT to stop the run in
// progress and exit, systemd's readiness notifications.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/copy_flags.h"
#include "cli/interrupt.h"
#include "cli/owner_flag.h"
#include "cli/policy_output.h"
#include "cli/sd_notify.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/policy/policy_hooks.h"
#include "orchestrate/policy/policy_scheduler.h"
#include "orchestrate/policy/policy_text.h"
#include "orchestrate/report/status_server.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

constexpr const char* kDefaultListen = "127.0.0.1:9847";

struct ServeArgs {
  std::string policy, listen = kDefaultListen, metrics_textfile, catalog, memory = "256M";
  int threads = 0;
};

int RunServe(ServeArgs& a, Output& out) {
  auto policy = orc::LoadPolicy(Env::Default(), a.policy);
  if (!policy.ok()) return out.Fail(policy.error());
  // Bucket targets and offsites reach their BucketEnv; the routing is the
  // daemon's whole life, so a reload that adds the first bucket needs a
  // restart (docs/policies.md).
  const auto routing = InstallBucketRoutingFor(orc::PolicyLocations(*policy));
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
    out.text() << orc::RunReportText(p, r);
    out.text().flush();
  };
  so.on_error = [&out](const Error& e) { out.Warning(e.ToString()); };

  auto server = orc::StatusServer::Start(a.listen, collector);
  if (!server.ok()) {
    if (server.error().code() == ErrorCode::kInvalidArgument) return out.Usage(server.error().message());
    return out.Fail(Error::IoError(server.error().message() + " (--listen HOST:PORT)"));
  }
  const int port = (*server)->port();
  const std::string& address = (*server)->address();

  orc::PolicyScheduler sched(Env::Default(), *policy, so);
  sched_ptr = &sched;
  (*server)->Attach(Env::Default(), sched, *catalog_path, orc::NowSeconds());
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
    if (Status s = SdNotify("READY=1\nSTATUS=" + orc::SchedulerStatusLine(sched.status())); !s.ok()) {
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
  (*server)->Stop();
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
