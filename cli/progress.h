// Progress output for long jobs: a bar with rate and ETA on stderr when it
// is a terminal, "progress" events (about one a second) under --json,
// nothing otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

#include "cli/output.h"

namespace barge::cli {

// Thread-safe; Update may be called from any thread. `out` must outlive it.
class ProgressReporter {
 public:
  ProgressReporter(Output& out, std::string job);
  // Draws the bar into `bar` whether or not it is a terminal (tests).
  // `bar` must outlive it.
  ProgressReporter(Output& out, std::string job, std::FILE* bar);
  // Events carry `fields` besides the job's (e.g. {"disk": "vda"}: one
  // reporter per disk of a VM backup). Elapsed time and rate count from
  // `start` (the job's start: a reporter made at a disk's first report
  // would divide the bytes already done by almost no time).
  ProgressReporter(Output& out, std::string job, nlohmann::json fields, std::chrono::steady_clock::time_point start);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  void Update(uint64_t done_bytes, uint64_t total_bytes);
  // Ends the bar line (a final update should come first).
  void Done();

 private:
  enum class Mode : uint8_t { kNone, kBar, kEvents };
  Output& out_;
  Mode mode_;
  std::string job_;
  nlohmann::json fields_ = nlohmann::json::object();
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_;
  std::FILE* bar_ = stderr;
  bool drew_ = false;
  size_t drawn_width_ = 0;  // of the line on screen, for blanking what a shorter one leaves
};

}  // namespace barge::cli
