// The scheduler loop of `barge serve` (docs/policies.md, "barge serve"):
// runs a policy whenever something is due (RunPolicyOnce decides what),
// sleeps until the schedule's next slot, keeps the metrics fresh, takes a
// new policy between runs, and stops a run in progress when asked. Time
// comes from a SchedulerClock, the seam tests replace.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "blockio/error.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_metrics.h"
#include "orchestrate/policy/policy_runner.h"

namespace barge::orchestrate {

// Now, and waiting until a time. Thread-safe.
class SchedulerClock {
 public:
  virtual ~SchedulerClock() = default;
  virtual SysSeconds Now() = 0;
  // With `lock` held (on `cv`'s mutex): waits until Now() >= deadline or
  // `wake()` is true, releasing the lock meanwhile; `cv` is notified
  // whenever `wake()` may have turned true. Returns with the lock held.
  virtual void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, SysSeconds deadline,
                         const std::function<bool()>& wake) = 0;
};

// The system's clock (std::chrono::system_clock).
SchedulerClock& SystemSchedulerClock();

struct SchedulerOptions {
  // catalog_path, env, backend, hooks, copy of each run. Its now, stop,
  // stop_reason, manual and only_sources are the scheduler's own.
  RunOptions run;
  SchedulerClock* clock = nullptr;         // null: SystemSchedulerClock(); must outlive
  std::chrono::seconds refresh{30};        // metrics refreshed at least this often
  std::chrono::seconds busy_retry{10};     // another process runs the policy: try again after this
  std::chrono::seconds retry_failed_after{300};  // a failed source is retried after this (or at its next slot)
  PolicyMetricsCollector* metrics = nullptr;  // updated after each pass (may be null); must outlive
  std::string metrics_textfile;            // also written there, atomically ("" = no file)
  // Called on the loop's thread after each run that backed something up.
  std::function<void(const RunReport&)> on_run;
  // Called on the loop's thread when a pass could not run (kBusy
  // included) or the metrics could not be gathered or written.
  std::function<void(const Error&)> on_error;
};

// What /healthz and logs show.
struct SchedulerStatus {
  std::string policy;
  bool running = false;                 // a run is in progress
  bool stopping = false;                // Stop() was called
  std::optional<SysSeconds> last_pass;  // end of the last pass
  std::optional<SysSeconds> next_pass;  // when the loop wakes next
  uint64_t runs = 0;                    // passes that backed something up
  uint64_t failed_runs = 0;             // of those, with a failed source
  // Why the last pass could not run (a lock held, the catalog), else what
  // each source whose latest backup in this daemon failed says
  // ("source NAME: error; ..."); "" when the pass ran and every source's
  // latest backup succeeded.
  std::string last_error;
};

// Thread-safe: Loop() on one thread; Replace, Stop and status from others.
class PolicyScheduler {
 public:
  // `env` must outlive the scheduler.
  PolicyScheduler(Env& env, Policy policy, SchedulerOptions options);
  PolicyScheduler(const PolicyScheduler&) = delete;
  PolicyScheduler& operator=(const PolicyScheduler&) = delete;

  // Until Stop(): a pass (what is due now runs, under the policy's lock;
  // then the metrics), then a wait until the next schedule slot, the next
  // metrics refresh, Replace() or Stop(), whichever comes first. A pass
  // that finds the policy's lock held by another process is retried after
  // busy_retry.
  void Loop();

  // The policy of the next pass, which starts at once (a changed reason is
  // due then). A run in progress finishes under the old policy.
  void Replace(Policy policy);

  // Ends Loop(): a run in progress is stopped (backups cancelled, their
  // partial files removed) and its records fail with `reason`
  // ("stopped by SIGTERM").
  void Stop(std::string reason);

  SchedulerStatus status() const;
  Policy policy() const;

 private:
  // One pass; returns when the next one is due.
  SysSeconds Pass();
  void RefreshMetrics(const Policy& policy);

  Env& env_;
  SchedulerOptions opt_;
  SchedulerClock& clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Policy policy_;                               // guarded by mu_
  SchedulerStatus status_;                      // guarded by mu_
  std::string stop_reason_;                     // guarded by mu_
  bool wake_ = false;                           // guarded by mu_: Replace() happened
  std::map<std::string, SysSeconds> first_seen_;  // loop thread only
  std::map<std::string, std::string> source_errors_;  // guarded by mu_: latest failure per source
  std::atomic<bool> stop_{false};
};

}  // namespace barge::orchestrate
