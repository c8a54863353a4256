// Progress bar and progress events.
#include "cli/progress.h"

#include <unistd.h>

#include <cstdio>

#include "cli/common.h"
#include "formats/units.h"

namespace barge::cli {

ProgressReporter::ProgressReporter(Output& out, std::string job)
    : out_(out),
      mode_(out.json() ? Mode::kEvents : ::isatty(STDERR_FILENO) ? Mode::kBar : Mode::kNone),
      job_(std::move(job)), start_(std::chrono::steady_clock::now()),
      last_(start_ - std::chrono::seconds(10)) {}

ProgressReporter::ProgressReporter(Output& out, std::string job, std::FILE* bar)
    : ProgressReporter(out, std::move(job)) {
  mode_ = Mode::kBar;
  bar_ = bar;
}

ProgressReporter::ProgressReporter(Output& out, std::string job, nlohmann::json fields,
                                   std::chrono::steady_clock::time_point start)
    : ProgressReporter(out, std::move(job)) {
  fields_ = std::move(fields);
  start_ = start;
}

ProgressReporter::~ProgressReporter() { Done(); }

void ProgressReporter::Update(uint64_t done, uint64_t total) {
  if (mode_ == Mode::kNone) return;
  std::lock_guard lock(mu_);
  auto now = std::chrono::steady_clock::now();
  bool final = done >= total;
  auto interval = mode_ == Mode::kBar ? std::chrono::milliseconds(200) : std::chrono::milliseconds(1000);
  if (!final && now - last_ < interval) return;
  last_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
  double pct = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  if (mode_ == Mode::kEvents) {
    nlohmann::json event = {{"job", job_},
                            {"done_bytes", done},
                            {"total_bytes", total},
                            {"percent", static_cast<int>(pct * 10) / 10.0},
                            {"bytes_per_second", static_cast<uint64_t>(rate)},
                            {"elapsed_seconds", secs}};
    event.update(fields_);
    out_.Progress(event);
    return;
  }
  constexpr int kWidth = 30;
  int filled = static_cast<int>(pct / 100 * kWidth);
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0;
  std::string line = job_ + " [" + bar + "] " + Format("%5.1f%% ", pct) +
                     formats::HumanBytes(static_cast<uint64_t>(rate)) + "/s ETA " + formats::HumanSeconds(eta);
  // "\r" only moves the cursor: blank what a longer line drew before
  // ("ETA 10 s" after "ETA 1.5 min" left "ETA 10 s s").
  const size_t width = line.size();
  if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
  std::fprintf(bar_, "\r%s", line.c_str());
  std::fflush(bar_);
  drawn_width_ = width;
  drew_ = true;
}

void ProgressReporter::Done() {
  std::lock_guard lock(mu_);
  if (mode_ == Mode::kBar && drew_) {
    std::fprintf(bar_, "\n");
    std::fflush(bar_);
    drew_ = false;
    drawn_width_ = 0;
  }
}

}  // namespace barge::cli
