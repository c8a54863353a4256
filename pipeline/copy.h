// RunCopy: the one copy engine every job runs on. A oneTBB flow graph moves
// the work set of a source through read, zero detection, hashing and
// compression into one or more destinations, with bounded memory.
//
// The graph (wired in copy.cc, the only place that knows the order):
//
//   plan (input_node, serial)          ChunkPlanner: needs the extent cursor
//     -> gate (limiter_node)           at most pool-size-1 chunks in flight
//     -> read (parallel*)              Reader; *serial if the source cannot
//                                      serve parallel reads
//     -> process (parallel)            ClusterProcessor: zero detect, xxh3,
//                                      compress with a per-thread compressor
//     -> sequencer_node                restores guest order
//     -> ordered (serial)              verify, SHA-512 stream, image digest
//                                      fold, progress: streams need order
//     -> write[i] (serial, one per     Destination::Consume: writers are
//        destination)                  sequential and want guest order
//
// Chunks (buffers) come from a fixed BufferPool; the last destination to
// consume a chunk returns it to the pool and opens the gate for the next.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "blockio/extent.h"
#include "blockio/nbd.h"
#include "blockio/source.h"
#include "formats/digest.h"
#include "formats/image.h"
#include "formats/strong_digest_table.h"
#include "pipeline/buffer_pool.h"
#include "pipeline/destination.h"
#include "pipeline/stages.h"
#include "pipeline/stats.h"

namespace barge::pipeline {

enum class DestinationFailurePolicy : uint8_t {
  // The first error anywhere cancels the whole copy (backups, restores).
  kFailJob,
  // A failing destination is marked failed with its error and skipped; the
  // others continue (replication). The copy fails only when every
  // destination failed, or the source / a shared stage failed.
  kIsolate,
};

// Memory: the pool holds enough chunks to keep every worker and destination
// busy, max(8, 4 * threads + 2 * destinations), but never more than
// memory_bytes / footprint (and at least 4), where the footprint is
// chunk_bytes, doubled when a destination wants compression (payload
// scratch). memory_bytes is a ceiling, not a target: a pool far larger than
// the work in flight only costs page faults and cache misses (measured: a
// raw copy ran 3x slower with 256 chunks than with 16 on 2 cores). Nothing
// else grows with the disk but the recorded cluster digests (16 bytes +
// index per stored cluster).
// The pool's chunk count for these options (threads 0 = all cores).
size_t PoolChunkCount(uint64_t memory_bytes, uint32_t chunk_bytes, bool with_scratch,
                      int threads = 0, size_t destinations = 1);

// The chunk size a job copies with for a given cluster size: `chunk_bytes`
// rounded down to whole clusters, at least one cluster (CopyOptions wants a
// multiple of cluster_bytes).
inline uint32_t ChunkBytesFor(uint32_t chunk_bytes, uint32_t cluster_bytes) {
  return std::max(chunk_bytes / cluster_bytes * cluster_bytes, cluster_bytes);
}

// The most worker threads a copy may ask for: 8 per core, at least 16.
// More only cost switching (5000 threads on 2 cores made a 0.1 s convert
// take 11 s) or fail to start.
size_t MaxThreads();

class Sha512Stream;

struct CopyOptions {
  uint32_t cluster_bytes = 64 << 10;   // power of two >= 512; the qcow2 cluster size
  uint32_t chunk_bytes = 1 << 20;      // multiple of cluster_bytes; largest single read
  uint64_t memory_bytes = 256ull << 20;
  int threads = 0;                     // worker threads, 0..MaxThreads(); 0 = all cores
  // Compression for destinations that want it: must be their type (else
  // kInvalidArgument), or kNone to store every cluster raw.
  formats::Compression compression = formats::Compression::kZstd;
  int compression_level = formats::kDefaultZstdLevel;
  bool sha512 = false;                 // SHA-512 of the work set's bytes in guest order
  // With sha512: go on with this stream (already fed with the bytes before
  // the work: a resumed copy's kept part) instead of a new one; it must
  // outlive the call, and is finished by it.
  Sha512Stream* sha512_stream = nullptr;
  // Expected digest per cluster: a mismatch fails the copy with kCorruption
  // before the chunk reaches any destination.
  DigestLookup verify;
  // With `verify`: the file a mismatching cluster is named by (a chain's
  // damaged layer); unset: the source.
  HolderLookup verify_holder;
  // How the image digest folds the clusters (a manifest's algorithm when
  // the result is compared with one).
  formats::ImageDigestAlgorithm digest_algorithm = formats::kCurrentImageDigestAlgorithm;
  // Image digest: clusters outside the work set (an incremental's parent).
  BaseDigestLookup base_digest;
  // Optional, with base_digest: the first cluster at or after c that
  // base_digest may list (UINT64_MAX: none), so that the fold skips the
  // clusters between in time independent of their number.
  BaseNextLookup base_next;
  // Record zero clusters of the work set in cluster_digests too.
  bool record_zero_digests = false;
  // Runs of whole windows the source's extents report as holes or zero are
  // not read, hashed or handed to destinations one cluster at a time: the
  // image digest folds them as zero clusters and `verify_zero_run` checks
  // them, in time independent of their length. Only for destinations that
  // leave such clusters alone (a new qcow2 image without backing file, a new
  // or zero-initialized raw file); not with record_zero_digests or sha512
  // (kInvalidArgument).
  bool skip_zero_extents = false;
  // With verify and skip_zero_extents: the first cluster of
  // [begin_cluster, end_cluster) whose expected digest is not the zero
  // cluster's, or nullopt. A run skipped over such a cluster fails the copy
  // with kCorruption, as a mismatching cluster does.
  std::function<std::optional<uint64_t>(uint64_t begin_cluster, uint64_t end_cluster)> verify_zero_run;
  // SHA-256 of every data cluster of the work set (strong_digests), in the
  // parallel process stage (docs/formats/backup.md, strong digest table).
  bool strong_digests = false;
  // xxh3-128 of every cluster (cluster_digests, image_digest, `verify`).
  // false: a scan that needs only strong_digests (a digest incremental's
  // comparison) skips them: cluster_digests stays empty and image_digest
  // zero. Then strong_digests must be set, and `verify` and destinations
  // are refused (kInvalidArgument): both need the per-cluster digests.
  bool weak_digests = true;
  // (bytes done, bytes total) from the in-order stage, at most ~10 per
  // second, and once at the end. Must not block.
  std::function<void(uint64_t, uint64_t)> progress;
  JobStats* stats = nullptr;                 // may be null; must outlive the call
  const std::atomic<bool>* cancel = nullptr; // may be null; set true to stop (kCancelled)
  DestinationFailurePolicy failure_policy = DestinationFailurePolicy::kFailJob;
  // A destination with work queued and no chunk finished for this long
  // fails (as if it returned kIoError). Zero: never. A call that never
  // returns still holds the copy until it does.
  std::chrono::milliseconds stall_timeout{0};
  // Use this pool instead of making one (its geometry must match); it must
  // outlive the call. Lets tests read the pool's counters.
  BufferPool* pool = nullptr;
  // How the job's NBD sources and outputs reconnect after a drop (the
  // jobs hand it to their SourceSpec and OutputSpec); the copy engine
  // itself does not use it.
  NbdRetryPolicy nbd_retry;
};

struct ClusterCounts {
  uint64_t hole = 0;
  uint64_t zero = 0;        // from extents and detected
  uint64_t data = 0;        // stored raw
  uint64_t compressed = 0;  // with a compressed payload
};

struct DestinationResult {
  std::string name;
  Status status;  // ok, or why it failed (kIsolate)
  uint64_t chunks_consumed = 0;
};

struct CopyResult {
  uint64_t bytes_read = 0;       // read from the source
  uint64_t bytes_processed = 0;  // logical bytes of the work set handled
  ClusterCounts clusters;
  std::vector<DestinationResult> destinations;
  std::string sha512_hex;        // empty unless options.sha512
  formats::Digest128 image_digest;
  // Data clusters (and zero ones if record_zero_digests), in guest order.
  std::vector<ClusterDigest> cluster_digests;
  // With options.strong_digests: the data clusters' SHA-256, in guest order
  // (clusters that read as zero are not listed).
  std::vector<formats::StrongDigestEntry> strong_digests;
  std::chrono::nanoseconds elapsed{0};
  size_t pool_chunks = 0;        // chunks in the pool
  size_t pool_high_water = 0;    // most chunks out at once
  uint64_t pool_bytes = 0;       // memory held by the pool
};

// Copies `work` (guest byte ranges, widened to whole clusters) of `source`
// into every destination, in guest order per destination, then calls Finish
// on each destination that did not fail. `source` and the destinations must
// outlive the call. Blocks until done.
// Returns: the result; or the first error (wrapped with the stage's name:
// "read", "process", "verify", "write <destination>", ...), kCancelled when
// options.cancel was set, kInvalidArgument for bad options. On error nothing
// is leaked and every chunk is back in the pool.
Result<CopyResult> RunCopy(BlockSource& source, const RangeList& work,
                           std::span<Destination* const> destinations, const CopyOptions& options);

// kCancelled saying `what`, naming `path`, once `cancel` is set (it may be
// null: never): how every long job checks CopyOptions::cancel and the like
// between steps. One relaxed load while not cancelled; any thread.
Status CheckCancel(const std::atomic<bool>* cancel, std::string_view what, std::string_view path);

// The whole disk as a work set.
inline RangeList WholeDisk(const BlockSource& source) { return {{0, source.size_bytes()}}; }

}  // namespace barge::pipeline
