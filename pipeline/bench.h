// `barge bench`: each pipeline stage alone on the same disk, then the whole
// pipeline (a backup-like RunCopy into a qcow2 file), with wall time, CPU
// time (getrusage deltas), peak RSS and threads for each. No TBB types here.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/image.h"
#include "pipeline/disk_generator.h"

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

// What `barge bench` runs: in a new private folder "barge-bench-PID-XXXXXX"
// under `workdir`, a generated disk (source "") or the outputs of a given
// one; the folder is removed afterwards (a generated disk kept with `keep`).
struct BenchRequest {
  std::string source;        // raw disk file to measure; "" generates one
  uint64_t size_bytes = 0;   // of the generated disk (CheckGeneratedDiskSize)
  uint64_t seed = 1;         // of the generated disk
  std::string workdir = "/var/tmp";
  bool keep = false;         // keep the generated disk (BenchRun::kept)
  // Geometry, compression, cold and cancel of the run (cancel stops the
  // disk's generation too); source and workdir are set by RunBenchRequest.
  BenchOptions options;
  void (*generate_log)(const std::string&) = nullptr;  // the "generating" line
  void (*stage_log)(const std::string&) = nullptr;     // RunBench's progress lines
};

// The numbers derived from a report: logical MiB/s (virtual size / wall
// time), the slowest backup-path stage, the machine's limits.
struct BenchSummary {
  double logical_mib = 0;           // the disk's virtual size
  std::string slowest_stage;        // backup path; "" when none
  double slowest_logical_mib_s = 0;
  // The CPU stages of the backup path (all but read and qcow2-write)
  // share the same cores: logical MiB/s over their summed wall time.
  double cpu_stages_sum_logical_mib_s = 0;
  double read_mib_s = 0;            // allocated bytes
  double compress_mib_s_per_core = 0;
  double end_to_end_logical_mib_s = 0;
  double ratio = 0;                 // end to end over the slowest stage
  // The most `ratio` can be on these cores when every stage is CPU-bound:
  // the end-to-end run does every backup-path stage's work, so it takes at
  // least their summed CPU seconds over the threads. The slowest stage's
  // CPU seconds per thread it ran on, over that bound (at most 1); 0 when
  // unknown.
  double cpu_ceiling_ratio = 0;
  double stages_cpu_seconds = 0;    // CPU seconds of the backup-path stages alone
  double end_to_end_cpu_seconds = 0;
};
BenchSummary SummarizeBench(const BenchReport& report);

// The machine a bench ran on, as its report names it.
struct BenchMachine {
  std::string cpu;         // /proc/cpuinfo's model name, or "unknown"
  std::string kernel;      // uname's sysname and release
  std::string filesystem;  // of the workdir: a name, its magic in hex, or "unknown"
};
BenchMachine DescribeMachine(Env& env, const std::string& workdir);

struct BenchRun {
  BenchReport report;
  BenchSummary summary;
  std::string source;            // the disk measured
  std::optional<DiskMix> mix;    // of the generated disk
  bool kept = false;             // the generated disk was kept, at `source`
  std::string scratch;           // the scratch folder
  std::optional<Error> not_removed;  // the scratch folder could not be removed
};

// Makes the scratch folder, generates the disk when asked, runs RunBench and
// removes the scratch folder. A failure to remove it fails a failed run
// (with the run's error) and is BenchRun::not_removed of a measured one.
Result<BenchRun> RunBenchRequest(Env& env, const BenchRequest& request);

// Process peak resident memory (VmHWM) and its reset (/proc/self/clear_refs;
// best effort: without it the peak is since the process started).
// VmHWM of /proc/self/status (getrusage's maxrss without /proc), and its
// reset through /proc/self/clear_refs (a no-op where it cannot be written:
// the next figure is then the process's peak so far).
uint64_t PeakRssBytes(Env& env);
void ResetPeakRss(Env& env);

}  // namespace barge::pipeline
