// The daemon's scheduler loop (orchestrate/policy/policy_scheduler.h).
#include "orchestrate/policy/policy_scheduler.h"

#include <algorithm>

#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

namespace {

class SystemClock final : public SchedulerClock {
 public:
  SysSeconds Now() override { return std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now()); }
  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, SysSeconds deadline,
                 const std::function<bool()>& wake) override {
    cv.wait_until(lock, std::chrono::system_clock::time_point(deadline), wake);
  }
};

}  // namespace

SchedulerClock& SystemSchedulerClock() {
  static SystemClock clock;
  return clock;
}

PolicyScheduler::PolicyScheduler(Env& env, Policy policy, SchedulerOptions options)
    : env_(env),
      opt_(std::move(options)),
      clock_(opt_.clock != nullptr ? *opt_.clock : SystemSchedulerClock()),
      policy_(std::move(policy)) {
  status_.policy = policy_.name;
}

void PolicyScheduler::Loop() {
  while (!stop_.load()) {
    const SysSeconds next = Pass();
    std::unique_lock lock(mu_);
    status_.next_pass = next;
    clock_.WaitUntil(lock, cv_, next, [this] { return wake_ || stop_.load(); });
    wake_ = false;
  }
}

void PolicyScheduler::Replace(Policy policy) {
  std::lock_guard lock(mu_);
  policy_ = std::move(policy);
  status_.policy = policy_.name;
  wake_ = true;
  cv_.notify_all();
}

void PolicyScheduler::Stop(std::string reason) {
  std::lock_guard lock(mu_);
  stop_reason_ = std::move(reason);
  status_.stopping = true;
  stop_ = true;
  cv_.notify_all();
}

SchedulerStatus PolicyScheduler::status() const {
  std::lock_guard lock(mu_);
  return status_;
}

Policy PolicyScheduler::policy() const {
  std::lock_guard lock(mu_);
  return policy_;
}

SysSeconds PolicyScheduler::Pass() {
  Policy policy;
  {
    std::lock_guard lock(mu_);
    policy = policy_;
    status_.running = true;
  }
  RunOptions o = opt_.run;
  o.now = [this] { return clock_.Now(); };
  o.stop = &stop_;
  o.stop_reason = [this] {
    std::lock_guard lock(mu_);
    return stop_reason_.empty() ? std::string("stopped: the daemon is stopping") : stop_reason_;
  };
  o.manual = false;
  o.only_sources.clear();
  o.wait_for_lock = false;
  o.retry_failed_after = opt_.retry_failed_after;
  const SysSeconds start = clock_.Now();
  // Stopped before it began: nothing is started (and nothing recorded).
  auto report = stop_.load() ? Result<RunReport>(RunReport{}) : RunPolicyOnce(env_, policy, o);
  const bool busy = !report.ok() && report.error().code() == ErrorCode::kBusy;
  {
    // The counts first: whoever on_run tells sees them already.
    std::lock_guard lock(mu_);
    if (report.ok()) {
      // A source's failure stays until its next backup succeeds (a pass
      // with nothing due changes nothing); sources no longer in the
      // policy drop out.
      for (const auto& o : report->sources) {
        if (!o.ran) continue;
        if (o.record.result == "success") source_errors_.erase(o.source);
        else source_errors_[o.source] = o.record.error;
      }
      std::erase_if(source_errors_, [&](const auto& e) { return policy.FindSource(e.first) == nullptr; });
      status_.last_error.clear();
      for (const auto& [name, error] : source_errors_) {
        status_.last_error += (status_.last_error.empty() ? "" : "; ") + std::string("source ") + name + ": " + error;
      }
    } else {
      status_.last_error = report.error().ToString();
    }
    if (report.ok() && report->ran > 0) {
      ++status_.runs;
      if (report->failed > 0) ++status_.failed_runs;
    }
  }
  if (!report.ok()) {
    if (opt_.on_error) opt_.on_error(report.error());
  } else if (report->ran > 0 && opt_.on_run) {
    opt_.on_run(*report);
  }
  RefreshMetrics(policy);

  // The next pass: the next slot, the next metrics refresh, the retry of
  // a failed source (retry_failed_after), or a retry when another process
  // held the lock, whichever comes first. The slot is the one after the
  // pass began: a slot that came while it ran is due now (at once,
  // coalesced), not skipped.
  const SysSeconds now = clock_.Now();
  SysSeconds next = now + std::max(opt_.refresh, std::chrono::seconds(1));
  if (busy) next = std::min(next, now + std::max(opt_.busy_retry, std::chrono::seconds(1)));
  if (report.ok()) {
    for (const auto& o : report->sources) {
      // A source that ran is retried from this attempt, else from its last.
      std::optional<SysSeconds> retry = o.ran ? std::nullopt : o.due.retry;
      if (auto started = ParseRfc3339(o.record.started_at); o.ran && o.record.result != "success" && started.ok()) {
        retry = *started + opt_.retry_failed_after;
      }
      if (retry) next = std::min(next, std::max(*retry, now + std::chrono::seconds(1)));
    }
  }
  if (policy.schedule) {
    if (auto slot = policy.schedule->Next(start); slot.ok()) next = std::min(next, *slot);
  }
  std::lock_guard lock(mu_);
  status_.running = false;
  status_.last_pass = now;
  return next;
}

void PolicyScheduler::RefreshMetrics(const Policy& policy) {
  if (opt_.metrics == nullptr && opt_.metrics_textfile.empty()) return;
  Env& env = env_;
  const SysSeconds now = clock_.Now();
  for (const auto& s : policy.sources) first_seen_.emplace(s.name, now);
  auto fail = [this](const Error& e) {
    if (opt_.on_error) opt_.on_error(e);
  };
  auto catalog = PolicyCatalog::Open(env, opt_.run.catalog_path);
  if (!catalog.ok()) return fail(catalog.error());
  auto snap = CollectPolicyMetrics(policy, **catalog, env, now);
  if (!snap.ok()) return fail(snap.error());
  // A source that never ran is known since this daemon first saw it (a
  // source added by a reload counts from the reload).
  for (auto& m : snap->sources) {
    if (!m.stats.last_attempt) m.known_since = first_seen_[m.source];
  }
  if (!opt_.metrics_textfile.empty()) {
    if (Status s = WritePolicyMetricsTextfile(env, opt_.metrics_textfile, {*snap}); !s.ok()) fail(s.error());
  }
  if (opt_.metrics != nullptr) opt_.metrics->Update({std::move(*snap)});
}

}  // namespace barge::orchestrate
