// `barge bench`: each pipeline stage alone on the same disk, then the whole
// pipeline (a backup-like RunCopy into a qcow2 file), with wall time, CPU
// time (getrusage deltas), peak RSS and threads for each. No TBB types here.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/image.h"

namespace barge::pipeline {

struct BenchOptions {
  std::string source;                 // raw disk file to read
  std::string workdir = "/var/tmp";   // where output files go (deleted after)
  uint32_t cluster_bytes = 64 << 10;
  uint32_t chunk_bytes = 1 << 20;
  uint64_t memory_bytes = 256ull << 20;
  int threads = 0;                    // 0 = all cores
  formats::Compression compression = formats::Compression::kZstd;
  int compression_level = formats::kDefaultZstdLevel;
  // Drop the source's pages (fdatasync + POSIX_FADV_DONTNEED) before the read
  // stage and before the end-to-end run: "cold" page cache for that file.
  bool cold = false;
  // May be null; set true to stop (kCancelled): polled per chunk or window
  // of chunks in every stage, and by the end-to-end copy.
  const std::atomic<bool>* cancel = nullptr;
};

// One measured run (a stage alone, or the pipeline).
struct BenchMeasure {
  std::string name;
  std::string note;            // what exactly was measured
  uint64_t input_bytes = 0;    // bytes the stage itself handled
  uint64_t output_bytes = 0;   // compressed payload bytes, file bytes, ...
  double wall_seconds = 0;
  double user_seconds = 0;     // getrusage(RUSAGE_SELF) deltas
  double system_seconds = 0;
  uint64_t peak_rss_bytes = 0; // VmHWM after resetting it at the start
  int threads = 1;             // threads running the stage
  uint64_t in_flight = 0;      // requests (read) or chunks (pipeline) in flight at most
  bool serial = false;         // one thread by nature (in-order stream)
  // Part of the backup path the end-to-end run measures (SHA-512 is not:
  // only replication streams it).
  bool in_backup_path = true;
};

struct BenchReport {
  uint64_t logical_bytes = 0;    // virtual size of the disk
  uint64_t allocated_bytes = 0;  // bytes the read stage read
  int threads = 0;               // resolved thread count
  std::vector<BenchMeasure> stages;  // read, zero, xxh3, sha512, compress, write
  BenchMeasure end_to_end;
  uint64_t pool_chunks = 0;
  uint64_t pool_bytes = 0;
  uint64_t data_clusters = 0, compressed_clusters = 0, zero_clusters = 0, hole_clusters = 0;
};

// The smallest generated disk `barge bench` measures: below it every stage
// finishes within a few chunks and timer noise is all the table shows.
inline constexpr uint64_t kMinBenchDiskBytes = 64ull << 20;

// Runs every stage alone, then the end-to-end copy. An empty source is
// kInvalidArgument (nothing to measure). Progress lines (one per
// phase) go to `log` when not null.
// Reads the source and writes (then removes) its output files in
// `options.workdir` through `env`.
Result<BenchReport> RunBench(Env& env, const BenchOptions& options,
                             void (*log)(const std::string&) = nullptr);

// Process peak resident memory (VmHWM) and its reset (/proc/self/clear_refs;
// best effort: without it the peak is since the process started).
// VmHWM of /proc/self/status (getrusage's maxrss without /proc), and its
// reset through /proc/self/clear_refs (a no-op where it cannot be written:
// the next figure is then the process's peak so far).
uint64_t PeakRssBytes(Env& env);
void ResetPeakRss(Env& env);

}  // namespace barge::pipeline
