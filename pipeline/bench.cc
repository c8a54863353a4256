#include "pipeline/bench.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "blockio/buffer.h"
#include "blockio/path.h"
#include "blockio/thread.h"
#include "formats/digest.h"
#include "formats/qcow2_compress.h"
#include "formats/units.h"
#include "pipeline/chunk.h"
#include "pipeline/copy.h"
#include "pipeline/destination_spec.h"
#include "pipeline/endpoints.h"
#include "pipeline/stages.h"

namespace barge::pipeline {
namespace {

int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

double Seconds(const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6; }

// Wall and CPU time of a scope, added to a measure (so windows accumulate).
class Meter {
 public:
  explicit Meter(BenchMeasure& m) : m_(m), start_(std::chrono::steady_clock::now()) { getrusage(RUSAGE_SELF, &ru_); }
  ~Meter() {
    rusage now;
    getrusage(RUSAGE_SELF, &now);
    m_.wall_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    m_.user_seconds += Seconds(now.ru_utime) - Seconds(ru_.ru_utime);
    m_.system_seconds += Seconds(now.ru_stime) - Seconds(ru_.ru_stime);
  }
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;

 private:
  BenchMeasure& m_;
  std::chrono::steady_clock::time_point start_;
  rusage ru_{};
};

// Calls fn(chunk, k, bytes) for each data cluster k of `c`; returns the
// bytes it covered.
template <typename Fn>
uint64_t ForEachDataCluster(Chunk& c, Fn fn) {
  uint64_t bytes = 0;
  for (size_t k = 0; k < c.cluster_count(); ++k) {
    if (c.states[k] != ClusterState::kData) continue;
    auto d = c.ClusterData(k);
    bytes += d.size();
    fn(c, k, d);
  }
  return bytes;
}

// Runs fn(item, thread) for item in [0, n) on `threads` threads; returns the
// first error.
template <typename Fn>
Status ParallelFor(int threads, size_t n, Fn fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status first;
  auto work = [&](int t) {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      Status s = fn(i, t);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = std::move(s);
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  Status started;
  for (int t = 1; t < threads && started.ok(); ++t) {
    auto thread = StartThread("bench worker", work, t);
    if (thread.ok()) {
      pool.push_back(std::move(thread).value());
    } else {
      started = thread.error();
      next.store(n);  // the started ones stop; the run fails
    }
  }
  if (started.ok()) work(0);
  for (auto& th : pool) th.join();
  if (!started.ok()) return started;
  return first;
}

// The file's pages leave the page cache (written back first), so the
// next read comes from the disk. Best effort, as the hint it is.
void DropFileCache(Env& env, const std::string& path) {
  auto source = env.OpenSource(path);
  if (source.ok()) (*source)->DontNeed(0, 0);  // 0: to the end of the file
}

// A new, private folder "barge-bench-PID-XXXXXX" under `workdir` (mkdtemp:
// 0700, ours; never a name someone planted in a shared workdir).
Result<std::string> MakeScratchFolder(Env& env, const std::string& workdir) {
  return env.CreateTempDir(workdir, "barge-bench-" + std::to_string(::getpid()) + "-");
}

// A bench output file `name` in its own fresh scratch folder; the folder
// goes with the guard.
struct FileGuard {
  Env& env;
  std::string dir;
  std::string path;
  ~FileGuard() {
    if (!dir.empty()) {
      IgnoreError(env.RemoveTree(dir), "a scratch folder of a finished measurement; nothing depends on it");
    }
  }
};
Result<std::unique_ptr<FileGuard>> ScratchFile(Env& env, const std::string& workdir, const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(std::string dir, MakeScratchFolder(env, workdir));
  // Built in place: a temporary guard would remove the folder on its way out.
  return std::unique_ptr<FileGuard>(new FileGuard{env, dir, JoinPath(dir, name)});
}

Result<BenchMeasure> ReadStage(Env& env, BlockSource& source, const BenchOptions& o, int threads) {
  BenchMeasure m;
  m.name = "read";
  m.threads = threads;
  m.in_flight = static_cast<uint64_t>(threads);
  m.note = "io_uring file source, allocated extents only (SEEK_DATA/SEEK_HOLE), one chunk batch per thread";
  if (o.cold) DropFileCache(env, o.source);
  ResetPeakRss(env);
  ChunkPlanner planner(source, WholeDisk(source), o.cluster_bytes, o.chunk_bytes);
  std::mutex mu;
  std::atomic<uint64_t> bytes{0};
  Reader reader(source);
  std::vector<std::unique_ptr<Chunk>> chunks;
  for (int t = 0; t < threads; ++t) chunks.push_back(std::make_unique<Chunk>(o.chunk_bytes, o.cluster_bytes, false));
  Status st;
  {
    Meter meter(m);
    st = ParallelFor(threads, static_cast<size_t>(threads), [&](size_t, int t) -> Status {
      Chunk& c = *chunks[static_cast<size_t>(t)];
      for (;;) {
        BARGE_RETURN_IF_ERROR(CheckCancel(o.cancel, "bench interrupted", o.source));
        Result<bool> more = [&] {
          std::lock_guard<std::mutex> lock(mu);
          return planner.Next(c);
        }();
        if (!more.ok()) return std::move(more).error();
        if (!*more) return OkStatus();
        auto n = reader.Read(c);
        if (!n.ok()) return std::move(n).error();
        bytes.fetch_add(*n, std::memory_order_relaxed);
      }
    });
  }
  if (!st.ok()) return std::move(st).error().Wrap("bench read");
  m.input_bytes = bytes.load();
  m.output_bytes = m.input_bytes;
  m.peak_rss_bytes = PeakRssBytes(env);
  return m;
}

// zero, xxh3, compress, sha512, write: each alone over windows of chunks held
// in memory (reading them is not timed; the read stage measures that).
Result<std::vector<BenchMeasure>> CpuStages(Env& env, BlockSource& source, const BenchOptions& o, int threads) {
  const bool compress = o.compression != formats::Compression::kNone;
  BenchMeasure zero, hash, comp, sha, write;
  zero.name = "zero-detect";
  zero.note = "IsAllZero over every read cluster";
  hash.name = "xxh3-128";
  hash.note = "HashCluster over non-zero clusters";
  comp.name = "compress";
  comp.note = std::string(formats::CompressionName(o.compression)) + ":" + std::to_string(o.compression_level) +
              " per cluster, one compressor per thread";
  sha.name = "sha512";
  sha.note = "Sha512Stream over the whole logical disk, in order (zeros for holes)";
  sha.serial = true;
  sha.in_backup_path = false;
  write.name = "qcow2-write";
  write.note = "Qcow2Destination into a file in the workdir, payloads precompressed, then Finish";
  write.serial = true;
  zero.threads = hash.threads = comp.threads = threads;

  const uint64_t footprint = uint64_t{o.chunk_bytes} * (compress ? 2 : 1);
  const size_t window = static_cast<size_t>(std::max<uint64_t>(4, o.memory_bytes / footprint));
  std::vector<std::unique_ptr<Chunk>> chunks;
  for (size_t i = 0; i < window; ++i) chunks.push_back(std::make_unique<Chunk>(o.chunk_bytes, o.cluster_bytes, compress));
  zero.in_flight = hash.in_flight = comp.in_flight = sha.in_flight = write.in_flight = window;

  std::vector<std::unique_ptr<formats::ClusterCompressor>> compressors;
  if (compress) {
    for (int t = 0; t < threads; ++t)
      compressors.push_back(std::make_unique<formats::ClusterCompressor>(o.compression, o.compression_level));
  }
  Sha512Stream sha_stream;

  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<FileGuard> out, ScratchFile(env, o.workdir, "stage.qcow2"));
  BARGE_ASSIGN_OR_RETURN(auto sink, env.OpenSink(out->path, SinkMode::kCreateNew));
  DestinationSpec dest_spec;
  dest_spec.virtual_size = source.size_bytes();
  dest_spec.cluster_bytes = o.cluster_bytes;
  dest_spec.compression = o.compression;
  BARGE_ASSIGN_OR_RETURN(auto dest, MakeDestination(*sink, dest_spec));

  ChunkPlanner planner(source, WholeDisk(source), o.cluster_bytes, o.chunk_bytes);
  Reader reader(source);
  ResetPeakRss(env);
  std::atomic<uint64_t> zero_in{0}, hash_in{0}, comp_in{0}, comp_out{0};
  for (bool done = false; !done;) {
    BARGE_RETURN_IF_ERROR(CheckCancel(o.cancel, "bench interrupted", o.source));
    size_t n = 0;
    while (n < window) {
      BARGE_ASSIGN_OR_RETURN(bool more, planner.Next(*chunks[n]));
      if (!more) {
        done = true;
        break;
      }
      ++n;
    }
    if (n == 0) break;
    BARGE_RETURN_IF_ERROR(ParallelFor(threads, n, [&](size_t i, int) -> Status {
      auto r = reader.Read(*chunks[i]);
      if (!r.ok()) return std::move(r).error();
      return OkStatus();
    }));
    {
      Meter meter(zero);
      BARGE_RETURN_IF_ERROR(ParallelFor(threads, n, [&](size_t i, int) -> Status {
        zero_in.fetch_add(ForEachDataCluster(*chunks[i], [](Chunk& c, size_t k, std::span<const std::byte> d) {
                            if (IsAllZero(d)) c.states[k] = ClusterState::kZero;
                          }),
                          std::memory_order_relaxed);
        return OkStatus();
      }));
    }
    {
      Meter meter(hash);
      BARGE_RETURN_IF_ERROR(ParallelFor(threads, n, [&](size_t i, int) -> Status {
        hash_in.fetch_add(ForEachDataCluster(*chunks[i], [&](Chunk& c, size_t k, std::span<const std::byte> d) {
                            c.digests[k] = formats::HashCluster(d, o.cluster_bytes);
                          }),
                          std::memory_order_relaxed);
        return OkStatus();
      }));
    }
    if (compress) {
      Meter meter(comp);
      BARGE_RETURN_IF_ERROR(ParallelFor(threads, n, [&](size_t i, int t) -> Status {
        Chunk& c = *chunks[i];
        uint64_t in = 0, outb = 0;
        for (size_t k = 0; k < c.cluster_count(); ++k) {
          if (c.states[k] != ClusterState::kData) continue;
          auto d = c.ClusterData(k);
          std::span<const std::byte> whole = d;
          if (d.size() < o.cluster_bytes) {
            auto slot = c.ClusterSlot(k);
            std::memset(slot.data() + d.size(), 0, slot.size() - d.size());
            whole = slot;
          }
          in += whole.size();
          auto p = compressors[static_cast<size_t>(t)]->CompressInto(whole, c.PayloadSlot(k));
          if (!p.ok()) return std::move(p).error();
          if (*p > 0) {
            c.payload_bytes[k] = static_cast<uint32_t>(*p);
            c.states[k] = ClusterState::kCompressed;
            outb += *p;
          } else {
            outb += d.size();
          }
        }
        comp_in.fetch_add(in, std::memory_order_relaxed);
        comp_out.fetch_add(outb, std::memory_order_relaxed);
        return OkStatus();
      }));
    }
    {
      Meter meter(sha);
      for (size_t i = 0; i < n; ++i) {
        BARGE_RETURN_IF_ERROR(sha_stream.UpdateChunk(*chunks[i]));
        sha.input_bytes += chunks[i]->length_bytes;
      }
    }
    {
      Meter meter(write);
      for (size_t i = 0; i < n; ++i) {
        BARGE_RETURN_IF_ERROR(dest->Consume(*chunks[i]));
        for (size_t k = 0; k < chunks[i]->cluster_count(); ++k) {
          switch (chunks[i]->states[k]) {
            case ClusterState::kCompressed: write.input_bytes += chunks[i]->payload_bytes[k]; break;
            case ClusterState::kData: write.input_bytes += chunks[i]->ClusterLength(k); break;
            default: break;
          }
        }
      }
    }
  }
  {
    Meter meter(write);
    BARGE_RETURN_IF_ERROR(dest->Finish());
  }
  {
    Meter meter(sha);
    BARGE_RETURN_IF_ERROR(sha_stream.FinishHex());
  }
  write.output_bytes = sink->size_bytes();
  zero.input_bytes = zero_in.load();
  hash.input_bytes = hash_in.load();
  comp.input_bytes = comp_in.load();
  comp.output_bytes = comp_out.load();
  uint64_t peak = PeakRssBytes(env);
  for (BenchMeasure* m : {&zero, &hash, &comp, &sha, &write}) m->peak_rss_bytes = peak;
  std::vector<BenchMeasure> out_stages{zero, hash};
  if (compress) out_stages.push_back(comp);
  out_stages.push_back(sha);
  out_stages.push_back(write);
  return out_stages;
}

Result<BenchMeasure> EndToEnd(Env& env, BlockSource& source, const BenchOptions& o, int threads,
                              BenchReport& report) {
  BenchMeasure m;
  m.name = "end-to-end";
  m.note = "RunCopy (plan, read, zero+xxh3+compress, in-order digest) into a Qcow2Destination file, like backup";
  m.threads = threads;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<FileGuard> out, ScratchFile(env, o.workdir, "e2e.qcow2"));
  BARGE_ASSIGN_OR_RETURN(auto sink, env.OpenSink(out->path, SinkMode::kCreateNew));
  DestinationSpec dest_spec;
  dest_spec.virtual_size = source.size_bytes();
  dest_spec.cluster_bytes = o.cluster_bytes;
  dest_spec.compression = o.compression;
  BARGE_ASSIGN_OR_RETURN(auto dest, MakeDestination(*sink, dest_spec));
  CopyOptions c;
  c.cluster_bytes = o.cluster_bytes;
  c.chunk_bytes = o.chunk_bytes;
  c.memory_bytes = o.memory_bytes;
  c.threads = threads;
  c.compression = o.compression;
  c.compression_level = o.compression_level;
  c.cancel = o.cancel;
  if (o.cold) DropFileCache(env, o.source);
  ResetPeakRss(env);
  Destination* dests[] = {dest.get()};
  Result<CopyResult> r = Error::IoError("not run");
  {
    Meter meter(m);
    r = RunCopy(source, WholeDisk(source), dests, c);
  }
  if (!r.ok()) return std::move(r).error().Wrap("bench end-to-end");
  m.peak_rss_bytes = PeakRssBytes(env);
  m.input_bytes = r->bytes_processed;
  m.output_bytes = sink->size_bytes();
  m.in_flight = r->pool_high_water;
  report.pool_chunks = r->pool_chunks;
  report.pool_bytes = r->pool_bytes;
  report.data_clusters = r->clusters.data;
  report.compressed_clusters = r->clusters.compressed;
  report.zero_clusters = r->clusters.zero;
  report.hole_clusters = r->clusters.hole;
  return m;
}

}  // namespace

namespace {

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

std::string CpuModel(Env& env) {
  auto text = env.ReadFile("/proc/cpuinfo");
  if (!text.ok()) return "unknown";
  for (size_t at = 0; at < text->size();) {
    size_t end = text->find('\n', at);
    if (end == std::string::npos) end = text->size();
    std::string line = text->substr(at, end - at);
    at = end + 1;
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

std::string FilesystemOf(Env& env, const std::string& path) {
  auto space = env.Space(path);
  if (!space.ok() || space->filesystem_type == 0) return "unknown";
  switch (static_cast<unsigned long>(space->filesystem_type)) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x2FC12FC1: return "zfs";
    case 0x6969: return "nfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(space->filesystem_type));
      return buf;
    }
  }
}

// Removes the scratch folder `dir`, all of it but `disk` when keep_disk.
Status RemoveScratch(Env& env, const std::string& dir, bool keep_disk, const std::string& disk) {
  if (!keep_disk) return env.RemoveTree(dir);
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    if (JoinPath(dir, name) != disk) BARGE_RETURN_IF_ERROR(env.RemoveTree(JoinPath(dir, name)));
  }
  return OkStatus();
}

}  // namespace

BenchSummary SummarizeBench(const BenchReport& r) {
  BenchSummary s;
  s.logical_mib = MiB(r.logical_bytes);
  const BenchMeasure* slowest = nullptr;
  double cpu_sum_wall = 0;  // CPU stages share the same cores
  for (const auto& m : r.stages) {
    if (!m.in_backup_path) continue;
    s.stages_cpu_seconds += m.user_seconds + m.system_seconds;
    if (slowest == nullptr || m.wall_seconds > slowest->wall_seconds) slowest = &m;
    if (m.name != "read" && m.name != "qcow2-write") cpu_sum_wall += m.wall_seconds;
    if (m.name == "compress") {
      double cpu = m.user_seconds + m.system_seconds;
      if (cpu > 0) s.compress_mib_s_per_core = MiB(m.input_bytes) / cpu;
    }
    if (m.name == "read" && m.wall_seconds > 0) s.read_mib_s = MiB(m.input_bytes) / m.wall_seconds;
  }
  const BenchMeasure& e = r.end_to_end;
  const double logical = s.logical_mib;
  s.end_to_end_logical_mib_s = e.wall_seconds > 0 ? logical / e.wall_seconds : 0;
  if (slowest) s.slowest_stage = slowest->name;
  s.slowest_logical_mib_s = slowest && slowest->wall_seconds > 0 ? logical / slowest->wall_seconds : 0;
  s.ratio = s.slowest_logical_mib_s > 0 ? s.end_to_end_logical_mib_s / s.slowest_logical_mib_s : 0;
  s.cpu_stages_sum_logical_mib_s = cpu_sum_wall > 0 ? logical / cpu_sum_wall : 0;
  s.end_to_end_cpu_seconds = e.user_seconds + e.system_seconds;
  // In CPU seconds, not wall time: on a busy machine a stage's wall time
  // also counts the other processes' share of the cores.
  double slowest_cpu_wall = 0;  // the slowest stage's CPU seconds per thread it ran on
  for (const auto& m : r.stages) {
    if (!m.in_backup_path) continue;
    const int threads = m.serial ? 1 : std::max(m.threads, 1);
    slowest_cpu_wall = std::max(slowest_cpu_wall, (m.user_seconds + m.system_seconds) / threads);
  }
  if (slowest_cpu_wall > 0 && r.threads > 0) {
    s.cpu_ceiling_ratio = slowest_cpu_wall / std::max(slowest_cpu_wall, s.stages_cpu_seconds / r.threads);
  }
  return s;
}

BenchMachine DescribeMachine(Env& env, const std::string& workdir) {
  utsname u{};
  ::uname(&u);
  return {CpuModel(env), std::string(u.sysname) + " " + u.release, FilesystemOf(env, workdir)};
}

Result<BenchRun> RunBenchRequest(Env& env, const BenchRequest& request) {
  // Everything the run writes lives in one new folder under the workdir.
  BARGE_ASSIGN_OR_RETURN(std::string dir, MakeScratchFolder(env, request.workdir));
  BenchRun run;
  run.scratch = dir;
  run.source = request.source;
  if (run.source.empty()) {
    run.source = JoinPath(dir, "disk.raw");
    DiskGeneratorOptions g;
    g.size_bytes = request.size_bytes;
    g.seed = request.seed;
    g.cancel = request.options.cancel;
    if (request.generate_log) {
      request.generate_log("generating " + formats::HumanBytes(request.size_bytes) + " disk (seed " +
                           std::to_string(request.seed) + ")");
    }
    auto mix = GenerateDisk(env, run.source, g);
    if (!mix.ok()) return std::move(mix).error().Also(RemoveScratch(env, dir, false, ""));
    run.mix = *mix;
    run.kept = request.keep;
  }
  BenchOptions o = request.options;
  o.source = run.source;
  o.workdir = dir;
  auto report = RunBench(env, o, request.stage_log);
  Status removed = RemoveScratch(env, dir, run.kept, run.source);
  if (!report.ok()) return std::move(report).error().Also(removed);
  if (!removed.ok()) run.not_removed = std::move(removed).error();
  run.report = std::move(report).value();
  run.summary = SummarizeBench(run.report);
  return run;
}

uint64_t PeakRssBytes(Env& env) {
  if (auto status = env.ReadFile("/proc/self/status"); status.ok()) {
    size_t at = status->find("\nVmHWM:");
    if (at != std::string::npos) return std::strtoull(status->c_str() + at + 7, nullptr, 10) * 1024;
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

void ResetPeakRss(Env& env) {
  FileOptions o;
  o.write_behind = false;
  o.sync = false;
  auto clear_refs = env.OpenSink("/proc/self/clear_refs", SinkMode::kExisting, o);
  if (!clear_refs.ok()) return;  // no /proc: documented in bench.h
  IgnoreError((*clear_refs)->WriteAt(0, std::as_bytes(std::span("5", 1))),
              "a measurement aid: without the reset the figure is the peak so far, as bench.h says");
}

Result<BenchReport> RunBench(Env& env, const BenchOptions& o, void (*log)(const std::string&)) {
  if (o.cluster_bytes < 512 || (o.cluster_bytes & (o.cluster_bytes - 1)) != 0 || o.chunk_bytes < o.cluster_bytes ||
      o.chunk_bytes % o.cluster_bytes != 0) {
    return Error::InvalidArgument("bench: cluster size must be a power of two >= 512 dividing the chunk size");
  }
  SourceSpec spec;
  spec.location = o.source;
  spec.format = "raw";
  BARGE_ASSIGN_OR_RETURN(OpenedSource opened, OpenSource(env, spec));
  BlockSource& source = *opened.image;
  if (source.size_bytes() == 0) {
    return Error::InvalidArgument("the source is empty: nothing to measure").set_path(o.source);
  }
  BenchReport report;
  report.threads = ResolveThreads(o.threads);
  report.logical_bytes = source.size_bytes();

  if (log) log("stage: read");
  BARGE_ASSIGN_OR_RETURN(BenchMeasure read, ReadStage(env, source, o, report.threads));
  report.allocated_bytes = read.input_bytes;
  report.stages.push_back(read);
  if (log) log("stages: zero-detect, xxh3-128, compress, sha512, qcow2-write");
  BARGE_ASSIGN_OR_RETURN(auto cpu, CpuStages(env, source, o, report.threads));
  for (auto& m : cpu) report.stages.push_back(std::move(m));
  if (log) log("end to end");
  BARGE_ASSIGN_OR_RETURN(report.end_to_end, EndToEnd(env, source, o, report.threads, report));
  return report;
}

}  // namespace barge::pipeline
