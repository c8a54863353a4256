// RunCopy: the copy pipeline's flow graph. This is the only file that knows
// the order of the stages; the stages themselves are in stages.h and
// destination.h. Graph and node roles are described in copy.h.
#include "pipeline/copy.h"

#include <oneapi/tbb/enumerable_thread_specific.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>
#include <oneapi/tbb/task_group.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <tuple>

#include "blockio/thread.h"

namespace barge::pipeline {
namespace {

namespace flow = oneapi::tbb::flow;
using Clock = std::chrono::steady_clock;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Runs a stage body, turning an escaping exception (bad_alloc above all)
// into an Error: nothing may throw across a node boundary.
template <typename F>
auto Guard(std::string_view stage, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Error::IoError(std::string(stage) + ": out of memory").set_errno(ENOMEM);
  } catch (const std::system_error& e) {
    // std::thread's way of saying it could not start one.
    if (e.code().value() == EAGAIN) return ThreadStartError(stage, EAGAIN);
    return Error::IoError(std::string(stage) + ": unexpected exception: " + e.what());
  } catch (const std::exception& e) {
    // oneTBB's, when it cannot start a worker on the calling thread.
    if (std::string_view(e.what()).find("pthread_create") != std::string_view::npos) {
      return ThreadStartError(std::string(stage) + " worker", EAGAIN);
    }
    return Error::IoError(std::string(stage) + ": unexpected exception: " + e.what());
  }
}

// The first error of the job, shared by every node. Recording it cancels
// the graph: running bodies finish, queued messages are dropped, and the
// driver reads the error after wait_for_all(). Thread-safe.
class JobStatus {
 public:
  explicit JobStatus(oneapi::tbb::task_group_context& context) : context_(context) {}
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void Fail(Error error) {
    {
      std::lock_guard lock(mu_);
      if (!error_) error_ = std::move(error);
    }
    failed_.store(true, std::memory_order_release);
    context_.cancel_group_execution();
  }
  Error TakeError() {
    std::lock_guard lock(mu_);
    return std::move(*error_);
  }

 private:
  oneapi::tbb::task_group_context& context_;
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::optional<Error> error_;  // guarded by mu_
};

// Per destination: its failure (kIsolate) and progress for the stall check.
struct DestinationState {
  Destination* destination = nullptr;
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::optional<Error> error;  // guarded by mu
  std::atomic<uint64_t> delivered{0};
  std::atomic<uint64_t> consumed{0};
  std::atomic<int64_t> last_progress_ns{0};

  // Records the first failure; returns true if this call marked it.
  bool MarkFailed(Error e) {
    std::lock_guard lock(mu);
    if (failed.load(std::memory_order_relaxed)) return false;
    error = std::move(e);
    failed.store(true, std::memory_order_release);
    return true;
  }
};

uint64_t WorkBytesOf(const Chunk& chunk) {
  uint64_t total = 0;
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    if (chunk.states[i] != ClusterState::kSkip) total += chunk.ClusterLength(i);
  }
  return total;
}

// Everything one RunCopy call shares between its nodes and the watchdog.
class CopyJob {
 public:
  CopyJob(BlockSource& source, std::span<Destination* const> destinations, const CopyOptions& options,
          BufferPool& pool, ChunkPlanner& planner, formats::Compression compression)
      : source_(source),
        options_(options),
        pool_(pool),
        planner_(planner),
        reader_(source),
        processor_(options.cluster_bytes, options.strong_digests, options.weak_digests),
        compression_(compression),
        status_(context_),
        states_(destinations.size()),
        digests_({source.size_bytes(), options.cluster_bytes, options.record_zero_digests, options.base_digest,
                  options.base_next, options.digest_algorithm}) {
    for (size_t i = 0; i < destinations.size(); ++i) states_[i].destination = destinations[i];
    if (options.verify) verifier_.emplace(options.verify, source.name(), options.verify_holder);
    if (options.sha512) {
      if (options.sha512_stream != nullptr) {
        sha512_ = options.sha512_stream;
      } else {
        own_sha512_.emplace();
        sha512_ = &*own_sha512_;
      }
    }
  }

  Status Run();
  CopyResult TakeResult();

 private:
  Chunk* Plan(oneapi::tbb::flow_control& fc);
  bool Read(Chunk* chunk);
  bool Process(Chunk* chunk);
  bool Ordered(Chunk* chunk);
  // A skipped zero run must not hide a cluster the digests say holds data.
  Status CheckZeroRun(const Chunk& chunk) const;
  void Write(size_t index, Chunk* chunk);
  // Returns a chunk every destination is done with; opens the gate.
  void Recycle(Chunk* chunk);
  void DestinationFailed(size_t index, Error error);
  void Watchdog(std::mutex& mu, std::condition_variable& cv, const bool& done);
  void CheckStalls();

  BlockSource& source_;
  const CopyOptions& options_;
  BufferPool& pool_;
  ChunkPlanner& planner_;
  Reader reader_;
  ClusterProcessor processor_;
  formats::Compression compression_;
  std::optional<Verifier> verifier_;

  oneapi::tbb::task_group_context context_;
  JobStatus status_;
  std::vector<DestinationState> states_;
  std::atomic<size_t> failed_destinations_{0};
  flow::limiter_node<Chunk*>* gate_ = nullptr;  // lives in Run(), set while the graph exists

  // One compressor per worker thread: its context is big and not shareable.
  oneapi::tbb::enumerable_thread_specific<std::unique_ptr<formats::ClusterCompressor>> compressors_;

  std::atomic<uint64_t> bytes_read_{0};
  // Touched only by the serial in-order node (then by the driver after it).
  std::optional<Sha512Stream> own_sha512_;
  Sha512Stream* sha512_ = nullptr;  // own_sha512_'s, or options.sha512_stream
  DigestCollector digests_;
  std::vector<formats::StrongDigestEntry> strong_;
  uint64_t bytes_processed_ = 0;
  ClusterCounts counts_;
  int64_t last_progress_call_ns_ = 0;
  std::string sha512_hex_;
};

Chunk* CopyJob::Plan(oneapi::tbb::flow_control& fc) {
  if (status_.failed()) {
    fc.stop();
    return nullptr;
  }
  if (Status cancelled = CheckCancel(options_.cancel, "copy cancelled", source_.name()); !cancelled.ok()) {
    status_.Fail(std::move(cancelled).error());
    fc.stop();
    return nullptr;
  }
  // A chunk is always free here: the gate lets at most capacity-1 chunks
  // past it, chunks go back to the pool before the gate reopens, and this
  // body runs only when the node holds no chunk of its own.
  Chunk* chunk = pool_.TryAcquire();
  if (chunk == nullptr) {
    status_.Fail(Error::InvalidArgument("internal: buffer pool exhausted at the input node"));
    fc.stop();
    return nullptr;
  }
  StageTimer timer(options_.stats, Stage::kExtents, 0);
  Result<bool> planned = Guard("plan", [&] { return planner_.Next(*chunk); });
  if (!planned.ok() || !*planned) {
    pool_.Release(chunk);
    if (!planned.ok()) status_.Fail(std::move(planned).error().Wrap("plan"));
    fc.stop();
    return nullptr;
  }
  return chunk;
}

bool CopyJob::Read(Chunk* chunk) {
  if (status_.failed()) return false;
  StageTimer timer(options_.stats, Stage::kRead, chunk->length_bytes);
  Result<uint64_t> n = Guard("read", [&] { return reader_.Read(*chunk); });
  if (!n.ok()) {
    status_.Fail(std::move(n).error().Wrap("read"));
    return false;
  }
  bytes_read_.fetch_add(*n, std::memory_order_relaxed);
  return true;
}

bool CopyJob::Process(Chunk* chunk) {
  if (status_.failed()) return false;
  formats::ClusterCompressor* compressor = nullptr;
  Status s = Guard("process", [&]() -> Status {
    if (compression_ != formats::Compression::kNone) {
      auto& local = compressors_.local();
      if (!local) local = std::make_unique<formats::ClusterCompressor>(compression_, options_.compression_level);
      compressor = local.get();
    }
    ProcessTimings timings;
    Status st = processor_.Process(*chunk, compressor, options_.stats ? &timings : nullptr);
    if (options_.stats) {
      options_.stats->Add(Stage::kZeroDetect, chunk->length_bytes, timings.zero_detect_ns);
      options_.stats->Add(Stage::kHash, chunk->length_bytes, timings.hash_ns + timings.strong_hash_ns);
      if (compressor) options_.stats->Add(Stage::kCompress, chunk->length_bytes, timings.compress_ns);
    }
    return st;
  });
  if (!s.ok()) {
    status_.Fail(std::move(s).error().Wrap("process"));
    return false;
  }
  return true;
}

Status CopyJob::CheckZeroRun(const Chunk& chunk) const {
  if (!options_.verify || !options_.verify_zero_run) return OkStatus();
  std::optional<uint64_t> bad = options_.verify_zero_run(chunk.zero_run_begin, chunk.zero_run_end);
  if (!bad) return OkStatus();
  const uint64_t offset = *bad * options_.cluster_bytes;
  std::optional<formats::Digest128> want = options_.verify(*bad);
  std::string holder = options_.verify_holder ? options_.verify_holder(offset) : std::string();
  return Error::Corruption("cluster " + std::to_string(*bad) + " at guest offset " + std::to_string(offset) +
                           " reads as zeros but its expected digest is " + (want ? want->ToHex() : "?") +
                           " (data missing)")
      .set_path(holder.empty() ? source_.name() : holder)
      .set_range(offset, options_.cluster_bytes)
      .Wrap("verify");
}

bool CopyJob::Ordered(Chunk* chunk) {
  if (status_.failed()) return false;
  Status s = Guard("ordered", [&]() -> Status {
    if (chunk->zero_run_clusters() > 0) {
      BARGE_RETURN_IF_ERROR(CheckZeroRun(*chunk));
      counts_.hole += chunk->zero_run_clusters();
      bytes_processed_ += std::min(chunk->zero_run_end * options_.cluster_bytes, source_.size_bytes()) -
                          chunk->zero_run_begin * options_.cluster_bytes;
    }
    if (verifier_) {
      StageTimer timer(options_.stats, Stage::kVerify, chunk->length_bytes);
      Status v = verifier_->Check(*chunk);
      if (!v.ok()) return std::move(v).error().Wrap("verify");
    }
    if (sha512_) {
      StageTimer timer(options_.stats, Stage::kSha512, chunk->length_bytes);
      Status st = sha512_->UpdateChunk(*chunk);
      if (!st.ok()) return std::move(st).error().Wrap("sha512");
    }
    if (options_.weak_digests) BARGE_RETURN_IF_ERROR(digests_.Consume(*chunk));
    if (options_.strong_digests) {
      for (size_t i = 0; i < chunk->cluster_count(); ++i) {
        ClusterState state = chunk->states[i];
        if (state == ClusterState::kData || state == ClusterState::kCompressed) {
          strong_.push_back({chunk->first_cluster() + i, chunk->strong[i]});
        }
      }
    }
    for (ClusterState state : chunk->states) {
      switch (state) {
        case ClusterState::kSkip: break;
        case ClusterState::kHole: ++counts_.hole; break;
        case ClusterState::kZero: ++counts_.zero; break;
        case ClusterState::kData: ++counts_.data; break;
        case ClusterState::kCompressed: ++counts_.compressed; break;
      }
    }
    bytes_processed_ += WorkBytesOf(*chunk);
    if (options_.progress) {
      int64_t now = NowNs();
      if (now - last_progress_call_ns_ >= 100'000'000) {
        last_progress_call_ns_ = now;
        options_.progress(bytes_processed_, planner_.work_bytes());
      }
    }
    return OkStatus();
  });
  if (!s.ok()) {
    status_.Fail(std::move(s).error());
    return false;
  }
  if (states_.empty()) {
    Recycle(chunk);
    return false;
  }
  chunk->pending_consumers.store(static_cast<uint32_t>(states_.size()), std::memory_order_relaxed);
  int64_t now = NowNs();
  for (DestinationState& d : states_) {
    // An idle destination starts its stall clock when work arrives.
    if (d.consumed.load(std::memory_order_relaxed) == d.delivered.load(std::memory_order_relaxed)) {
      d.last_progress_ns.store(now, std::memory_order_relaxed);
    }
    d.delivered.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

void CopyJob::Write(size_t index, Chunk* chunk) {
  DestinationState& d = states_[index];
  if (!d.failed.load(std::memory_order_acquire) && !status_.failed()) {
    StageTimer timer(options_.stats, Stage::kWrite, WorkBytesOf(*chunk));
    Status s = Guard("write", [&] { return d.destination->Consume(*chunk); });
    if (!s.ok()) DestinationFailed(index, std::move(s).error().Wrap("write " + d.destination->name()));
  }
  d.consumed.fetch_add(1, std::memory_order_relaxed);
  d.last_progress_ns.store(NowNs(), std::memory_order_relaxed);
  // The last destination done with the chunk recycles it (acq_rel: the
  // others' reads of the buffer happen before the reader refills it).
  if (chunk->pending_consumers.fetch_sub(1, std::memory_order_acq_rel) == 1) Recycle(chunk);
}

void CopyJob::Recycle(Chunk* chunk) {
  // Release before decrementing: the gate may admit the input node's next
  // chunk at once, and that chunk needs a free buffer.
  pool_.Release(chunk);
  gate_->decrementer().try_put(flow::continue_msg());
}

void CopyJob::DestinationFailed(size_t index, Error error) {
  if (options_.failure_policy == DestinationFailurePolicy::kFailJob) {
    states_[index].MarkFailed(error);
    status_.Fail(std::move(error));
    return;
  }
  if (!states_[index].MarkFailed(error)) return;
  size_t failed = failed_destinations_.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (failed == states_.size()) {
    status_.Fail(Error(error).Wrap("every destination failed; the last"));
  }
}

void CopyJob::CheckStalls() {
  if (options_.stall_timeout.count() <= 0) return;
  const int64_t limit_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.stall_timeout).count();
  const int64_t now = NowNs();
  for (size_t i = 0; i < states_.size(); ++i) {
    DestinationState& d = states_[i];
    if (d.failed.load(std::memory_order_acquire)) continue;
    if (d.consumed.load(std::memory_order_relaxed) >= d.delivered.load(std::memory_order_relaxed)) continue;
    if (now - d.last_progress_ns.load(std::memory_order_relaxed) < limit_ns) continue;
    DestinationFailed(i, Error::IoError("write " + d.destination->name() + ": no progress for " +
                                        std::to_string(options_.stall_timeout.count()) + " ms (stalled)")
                             .set_path(d.destination->name())
                             .set_errno(ETIMEDOUT));
  }
}

void CopyJob::Watchdog(std::mutex& mu, std::condition_variable& cv, const bool& done) {
  std::unique_lock lock(mu);
  while (!done) {
    cv.wait_for(lock, std::chrono::milliseconds(20));
    if (done) break;
    if (Status cancelled = CheckCancel(options_.cancel, "copy cancelled", source_.name());
        !cancelled.ok() && !status_.failed()) {
      status_.Fail(std::move(cancelled).error());
    }
    CheckStalls();
  }
}

Status CopyJob::Run() {
  {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    auto watchdog = StartThread("copy watchdog", [&] { Watchdog(mu, cv, done); });
    // Started before the graph exists: leaving a scope with edges made but
    // the graph never run is not safe in oneTBB (its destructor runs
    // forwarding tasks of nodes already destroyed).
    if (!watchdog.ok()) return watchdog.error();
    // Stops the watchdog however this scope is left (wait_for_all rethrows
    // an exception that escaped TBB's own machinery, e.g. bad_alloc), after
    // the graph (declared below) has waited for its tasks.
    struct StopWatchdog {
      std::mutex& mu;
      std::condition_variable& cv;
      bool& done;
      std::thread& thread;
      ~StopWatchdog() {
        {
          std::lock_guard lock(mu);
          done = true;
        }
        cv.notify_all();
        thread.join();
      }
    } stop{mu, cv, done, *watchdog};
    flow::graph g(context_);

    flow::input_node<Chunk*> plan(g, [this](oneapi::tbb::flow_control& fc) { return Plan(fc); });
    flow::limiter_node<Chunk*> gate(g, pool_.capacity() - 1);
    gate_ = &gate;

    using Stage1 = flow::multifunction_node<Chunk*, std::tuple<Chunk*>>;
    // Dropping a chunk on error is fine: the graph is cancelled by then and
    // the pool takes every chunk back after wait_for_all().
    const size_t read_concurrency =
        source_.capabilities().parallel_reads ? flow::unlimited : flow::serial;
    Stage1 read(g, read_concurrency, [this](Chunk* c, Stage1::output_ports_type& out) {
      if (Read(c)) std::get<0>(out).try_put(c);
    });
    Stage1 process(g, flow::unlimited, [this](Chunk* c, Stage1::output_ports_type& out) {
      if (Process(c)) std::get<0>(out).try_put(c);
    });
    flow::sequencer_node<Chunk*> sequencer(g, [](Chunk* const& c) -> size_t { return c->sequence; });
    Stage1 ordered(g, flow::serial, [this](Chunk* c, Stage1::output_ports_type& out) {
      if (Ordered(c)) std::get<0>(out).try_put(c);
    });
    std::vector<std::unique_ptr<flow::function_node<Chunk*>>> writers;
    writers.reserve(states_.size());
    for (size_t i = 0; i < states_.size(); ++i) {
      // Serial and queueing: the queue is FIFO, and `ordered` emits in guest
      // order, so each destination sees chunks in guest order. A lone
      // destination that needs no order (raw at guest offsets) gets parallel
      // writes; with several, a stalled one must not hold every thread.
      const size_t concurrency = states_.size() == 1 && states_[i].destination->concurrent_consume()
                                     ? flow::unlimited
                                     : flow::serial;
      writers.push_back(std::make_unique<flow::function_node<Chunk*>>(
          g, concurrency, [this, i](Chunk* c) {
            Write(i, c);
            return flow::continue_msg();
          }));
    }

    flow::make_edge(plan, gate);
    flow::make_edge(gate, read);
    flow::make_edge(flow::output_port<0>(read), process);
    flow::make_edge(flow::output_port<0>(process), sequencer);
    flow::make_edge(sequencer, ordered);
    for (auto& w : writers) flow::make_edge(flow::output_port<0>(ordered), *w);

    plan.activate();
    g.wait_for_all();
  }
  gate_ = nullptr;
  // Chunks held by messages a cancelled graph dropped come back here.
  pool_.ReclaimAll();
  if (status_.failed()) return status_.TakeError();

  for (DestinationState& d : states_) {
    if (d.failed.load(std::memory_order_acquire)) continue;
    Status s = Guard("finish", [&] { return d.destination->Finish(); });
    if (s.ok()) continue;
    Error e = std::move(s).error().Wrap("finish " + d.destination->name());
    if (options_.failure_policy == DestinationFailurePolicy::kFailJob) return e;
    DestinationFailed(static_cast<size_t>(&d - states_.data()), std::move(e));
    if (status_.failed()) return status_.TakeError();
  }
  if (options_.weak_digests) BARGE_RETURN_IF_ERROR(digests_.Finish());
  if (sha512_) {
    BARGE_ASSIGN_OR_RETURN(sha512_hex_, sha512_->FinishHex());
  }
  if (options_.progress) options_.progress(bytes_processed_, planner_.work_bytes());
  return OkStatus();
}

CopyResult CopyJob::TakeResult() {
  CopyResult r;
  r.bytes_read = bytes_read_.load();
  r.bytes_processed = bytes_processed_;
  r.clusters = counts_;
  for (DestinationState& d : states_) {
    DestinationResult dr;
    dr.name = d.destination->name();
    if (d.failed.load()) dr.status = *d.error;
    dr.chunks_consumed = d.consumed.load();
    r.destinations.push_back(std::move(dr));
  }
  r.sha512_hex = std::move(sha512_hex_);
  if (options_.weak_digests) {
    r.image_digest = digests_.image_digest();
    r.cluster_digests = digests_.TakeClusterDigests();
  }
  r.strong_digests = std::move(strong_);
  r.pool_chunks = pool_.capacity();
  r.pool_high_water = pool_.high_water();
  r.pool_bytes = pool_.footprint_bytes();
  return r;
}

}  // namespace

size_t MaxThreads() {
  return std::max<size_t>(16, 8 * std::max(1u, std::thread::hardware_concurrency()));
}

namespace {
// oneTBB starts at most one worker per core unless told otherwise. The limit
// is process-wide (the smallest of all live global_control objects wins),
// so it is raised once, to MaxThreads(), for the life of the process, and
// each copy's own task_arena sets that copy's concurrency: concurrent
// copies (the disks of a VM backup) never clamp each other.
void RaiseParallelismLimit() {
  static oneapi::tbb::global_control limit(oneapi::tbb::global_control::max_allowed_parallelism,
                                           MaxThreads());
}
// Worker threads of a copy: --threads when given; else the cores, or one
// more than the source's blocking read streams when those are more (a read
// stage task waits in nbd_poll for the network, holding its thread: with
// only the cores' threads, 2 cores kept 2 of 4 NBD connections busy and a
// TLS copy ran 1.3x slower than with 4 workers).
int ArenaThreads(int threads, const SourceCapabilities& caps) {
  if (threads > 0) return threads;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (!caps.parallel_reads || caps.blocking_read_streams <= 1) return oneapi::tbb::task_arena::automatic;
  return std::min(static_cast<int>(MaxThreads()), std::max(cores, static_cast<int>(caps.blocking_read_streams) + 1));
}

// Address space a worker thread takes: oneTBB's 4 MiB stack, its guard
// page and the per-thread state of a copy (a compressor's context).
constexpr uint64_t kWorkerAddressBytes = 8ull << 20;
// Kept free besides the workers and the pool: one malloc arena (glibc
// reserves 64 MiB of address space for each) and room for small maps.
constexpr uint64_t kAddressMarginBytes = 96ull << 20;

// The address space still free under RLIMIT_AS: the largest reservation
// (PROT_NONE, nothing touched) mmap grants now, to 1 MiB, at most `upper`.
uint64_t FreeAddressSpace(uint64_t upper) {
  uint64_t lo = 0, hi = upper;
  while (hi - lo > (uint64_t{1} << 20)) {
    const uint64_t mid = lo + (hi - lo) / 2;
    void* p = ::mmap(nullptr, mid, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      hi = mid;
    } else {
      ::munmap(p, mid);
      lo = mid;
    }
  }
  return lo;
}

// Under an address-space limit (ulimit -v) a worker that cannot get its
// stack makes oneTBB fail on one of its own threads, where nothing can catch
// it: std::terminate, which cli/interrupt.cc reports, but other workers may
// crash meanwhile (seen: SIGSEGV in a flow-graph task). So under such a
// limit the arena gets only the workers that fit in the address space still
// free (FreeAddressSpace: the buffer pool is already mapped) less a margin,
// at kWorkerAddressBytes each, and glibc is held to two malloc arenas (each
// reserves 64 MiB). The calling thread always works: with no room for
// more, the copy runs on it alone. Without a limit: `arena_threads`.
int FitArenaThreads(int arena_threads) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return arena_threads;
  static const bool arenas_capped = [] { return ::mallopt(M_ARENA_MAX, 2) == 1; }();
  static_cast<void>(arenas_capped);
  const uint64_t free_bytes = FreeAddressSpace(limit.rlim_cur);
  const uint64_t room = free_bytes > kAddressMarginBytes ? free_bytes - kAddressMarginBytes : 0;
  int wanted = arena_threads > 0 ? arena_threads
                                 : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The calling thread joins the arena: wanted - 1 new threads.
  return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(wanted), room / kWorkerAddressBytes + 1));
}

}  // namespace

size_t PoolChunkCount(uint64_t memory_bytes, uint32_t chunk_bytes, bool with_scratch, int threads,
                      size_t destinations) {
  uint64_t footprint = ChunkFootprintBytes(chunk_bytes, with_scratch);
  uint64_t ceiling = std::max<uint64_t>(4, footprint ? memory_bytes / footprint : 4);
  uint64_t workers = threads > 0 ? static_cast<uint64_t>(threads)
                                 : std::max(1u, std::thread::hardware_concurrency());
  uint64_t wanted = std::max<uint64_t>(8, 4 * workers + 2 * destinations);
  return static_cast<size_t>(std::min(ceiling, wanted));
}

namespace {
// A source whose reads wait on a network peer (SourceCapabilities::
// blocking_read_streams > 1: an NBD export's connections, an http(s)
// object's ranged GETs) is read in calls of at least this many of its
// requests. Calls share each connection's queue (blockio/nbd.cc), so a
// connection no longer idles between calls, but fewer, bigger calls still
// cost less waiting and handing over; with 1 MiB requests (NBD over TLS
// until issue 41's bench, http(s) now) 4 MiB calls instead of 1 MiB were
// faster (docs/benchmarks.md). NBD (256 KiB requests, with and without
// TLS) keeps the 1 MiB chunk.
constexpr uint32_t kRemoteRequestsPerCall = 4;

// The chunk size RunCopy uses: `chunk_bytes`, raised for a remote source
// to kRemoteRequestsPerCall of its requests, halved as needed, a multiple
// of the cluster size, and only while memory_bytes holds the pool's
// wanted chunk count (see PoolChunkCount).
uint32_t SourceChunkBytes(uint32_t chunk_bytes, uint32_t cluster_bytes, const SourceCapabilities& caps,
                          uint64_t memory_bytes, bool with_scratch, int threads, size_t destinations) {
  if (caps.blocking_read_streams <= 1) return chunk_bytes;
  const uint64_t preferred64 = uint64_t{caps.preferred_request_bytes} * kRemoteRequestsPerCall;
  const uint32_t preferred = static_cast<uint32_t>(std::min<uint64_t>(preferred64, 64u << 20));
  if (preferred <= chunk_bytes) return chunk_bytes;
  uint64_t workers = threads > 0 ? static_cast<uint64_t>(threads)
                                 : std::max(1u, std::thread::hardware_concurrency());
  uint64_t wanted = std::max<uint64_t>(8, 4 * workers + 2 * destinations);
  uint32_t best = chunk_bytes;
  for (uint32_t c = ChunkBytesFor(preferred, cluster_bytes); c > chunk_bytes; c = ChunkBytesFor(c / 2, cluster_bytes)) {
    if (memory_bytes / ChunkFootprintBytes(c, with_scratch) >= wanted) {
      best = c;
      break;
    }
    if (c == cluster_bytes) break;
  }
  return best;
}
}  // namespace

Status CheckCancel(const std::atomic<bool>* cancel, std::string_view what, std::string_view path) {
  if (cancel == nullptr || !cancel->load(std::memory_order_relaxed)) return OkStatus();
  return Error::Cancelled(std::string(what)).set_path(std::string(path));
}

Result<CopyResult> RunCopy(BlockSource& source, const RangeList& work,
                           std::span<Destination* const> destinations, const CopyOptions& options) {
  const auto start = Clock::now();
  const uint32_t cluster = options.cluster_bytes;
  if (cluster < 512 || (cluster & (cluster - 1)) != 0) {
    return Error::InvalidArgument("copy: cluster size must be a power of two >= 512");
  }
  if (options.chunk_bytes < cluster || options.chunk_bytes % cluster != 0) {
    return Error::InvalidArgument("copy: chunk size must be a multiple of the cluster size");
  }
  if (options.threads < 0 || static_cast<size_t>(options.threads) > MaxThreads()) {
    return Error::InvalidArgument("copy: threads must be from 0 to " + std::to_string(MaxThreads()) +
                                  ", not " + std::to_string(options.threads));
  }
  if (destinations.size() > std::numeric_limits<uint32_t>::max()) {
    return Error::InvalidArgument("copy: too many destinations");
  }
  if (!options.weak_digests && (!options.strong_digests || options.verify || !destinations.empty())) {
    return Error::InvalidArgument("copy: a scan without xxh3 digests takes strong digests, and no verify or destination");
  }
  bool compress = false;
  for (Destination* d : destinations) {
    if (d == nullptr) return Error::InvalidArgument("copy: null destination");
    if (!d->wants_compression() || options.compression == formats::Compression::kNone) continue;
    if (d->compression() != options.compression) {
      return Error::InvalidArgument("copy: destination " + d->name() + " stores " +
                                    std::string(formats::CompressionName(d->compression())) +
                                    " but the copy compresses with " +
                                    std::string(formats::CompressionName(options.compression)));
    }
    compress = true;
  }

  // A remote source is read in bigger calls (SourceChunkBytes) when the
  // copy owns its pool.
  uint32_t chunk_bytes = options.chunk_bytes;
  if (options.pool == nullptr) {
    chunk_bytes = SourceChunkBytes(options.chunk_bytes, cluster, source.capabilities(), options.memory_bytes,
                                   compress, options.threads, destinations.size());
  }

  std::unique_ptr<BufferPool> own_pool;
  BufferPool* pool = options.pool;
  if (pool == nullptr) {
    BufferPoolOptions po;
    po.chunk_bytes = chunk_bytes;
    po.cluster_bytes = cluster;
    po.with_scratch = compress;
    po.count = PoolChunkCount(options.memory_bytes, chunk_bytes, compress, options.threads,
                              destinations.size());
    BARGE_ASSIGN_OR_RETURN(own_pool, BufferPool::Create(po));
    pool = own_pool.get();
  } else {
    const BufferPoolOptions& po = pool->options();
    if (po.chunk_bytes != options.chunk_bytes || po.cluster_bytes != cluster || (compress && !po.with_scratch) ||
        pool->capacity() < 2 || pool->outstanding() != 0) {
      return Error::InvalidArgument("copy: the given buffer pool does not fit the copy's geometry");
    }
  }

  if (options.skip_zero_extents && (options.record_zero_digests || options.sha512)) {
    return Error::InvalidArgument("copy: skipping zero extents records no zero digests and streams no SHA-512");
  }
  ChunkPlanner planner(source, work, cluster, chunk_bytes, uint64_t{1} << 30, options.skip_zero_extents);
  auto compression = compress ? options.compression : formats::Compression::kNone;
  std::unique_ptr<CopyJob> job;
  Status status = Guard("copy", [&]() -> Status {
    job = std::make_unique<CopyJob>(source, destinations, options, *pool, planner, compression);
    RaiseParallelismLimit();
    oneapi::tbb::task_arena arena(FitArenaThreads(ArenaThreads(options.threads, source.capabilities())));
    // The graph is built inside the arena so its tasks run on its threads.
    return arena.execute([&] { return job->Run(); });
  });
  if (!status.ok()) {
    pool->ReclaimAll();
    return std::move(status).error();
  }
  CopyResult result = job->TakeResult();
  result.elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start);
  return result;
}

}  // namespace barge::pipeline
