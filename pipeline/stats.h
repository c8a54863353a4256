// Per-stage counters (bytes, items, busy time) shared by every job and by
// `barge bench`. Updated with relaxed atomics from any thread.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace barge::pipeline {

// kWrite adds one item per destination and chunk; kSha512 is the in-order
// SHA-512 stream.
enum class Stage : uint8_t { kExtents, kRead, kZeroDetect, kHash, kCompress, kWrite, kVerify, kSha512, kCount };
std::string_view StageName(Stage stage);

struct StageCounters {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> items{0};
  std::atomic<uint64_t> busy_ns{0};
};

struct StageSnapshot {
  uint64_t bytes = 0;
  uint64_t items = 0;
  uint64_t busy_ns = 0;
};

// Thread-safe.
class JobStats {
 public:
  void Add(Stage stage, uint64_t bytes, uint64_t busy_ns) {
    StageCounters& c = counters_[static_cast<size_t>(stage)];
    c.bytes.fetch_add(bytes, std::memory_order_relaxed);
    c.items.fetch_add(1, std::memory_order_relaxed);
    c.busy_ns.fetch_add(busy_ns, std::memory_order_relaxed);
  }
  StageSnapshot Get(Stage stage) const;

 private:
  std::array<StageCounters, static_cast<size_t>(Stage::kCount)> counters_;
};

// Adds the elapsed time of a scope to one stage's counters.
class StageTimer {
 public:
  StageTimer(JobStats* stats, Stage stage, uint64_t bytes)
      : stats_(stats), stage_(stage), bytes_(bytes), start_(std::chrono::steady_clock::now()) {}
  ~StageTimer() {
    if (stats_ == nullptr) return;
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now() - start_).count();
    stats_->Add(stage_, bytes_, static_cast<uint64_t>(ns));
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  JobStats* stats_;  // may be null; must outlive the timer
  Stage stage_;
  uint64_t bytes_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace barge::pipeline
