// Progress output for long jobs: a bar with rate and ETA on a terminal,
// periodic JSON lines with --json, nothing otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace barge::cli {

enum class ProgressMode : uint8_t { kNone, kBar, kJsonLines };

// Picks kBar when stderr is a terminal, kJsonLines for --json, else kNone.
ProgressMode ChooseProgressMode(bool json);

// Thread-safe; Update may be called from any thread.
class ProgressReporter {
 public:
  ProgressReporter(ProgressMode mode, std::string label);
  ~ProgressReporter();
  void Update(uint64_t done_bytes, uint64_t total_bytes);
  // Ends the bar line (a final update should come first).
  void Done();

 private:
  ProgressMode mode_;
  std::string label_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
  bool drew_ = false;
};

}  // namespace barge::cli
