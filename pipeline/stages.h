// The stages of the copy pipeline as plain classes (no TBB types): planning
// chunks from a work set and the source's extents, reading, zero detection
// plus hashing plus compression, the in-order SHA-512 stream, and digest
// verification. pipeline/copy.cc wires them into a flow graph; tests call
// them directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "blockio/error.h"
#include "blockio/extent.h"
#include "blockio/source.h"
#include "formats/digest.h"
#include "formats/qcow2_compress.h"
#include "pipeline/chunk.h"

namespace barge::pipeline {

// Turns a work set (guest byte ranges; widened to whole clusters) and the
// source's extents into chunk plans: windows of chunk_bytes aligned to
// chunk_bytes, each holding at least one cluster of the work set. Clusters
// outside the work set are kSkip; clusters wholly unallocated are kHole;
// clusters reading as zero (zero extents, or zero and hole mixed) are kZero
// and are not read; everything else is kData (to be read). Extents are asked
// for in large spans (extent_query_bytes), clipped to the current work range.
// With skip_zero_extents, whole windows the extents report as holes or zero
// are not planned one by one: one chunk without a window carries the run
// (Chunk::zero_run_begin/end), so a thin disk costs what its data costs.
//
// One thread at a time (the graph's serial input node).
class ChunkPlanner {
 public:
  // `source` must outlive the planner. cluster_bytes: power of two >= 512;
  // chunk_bytes: a multiple of it.
  ChunkPlanner(BlockSource& source, const RangeList& work, uint32_t cluster_bytes,
               uint32_t chunk_bytes, uint64_t extent_query_bytes = uint64_t{1} << 30,
               bool skip_zero_extents = false);

  // Plans the next chunk into `chunk` (Reset, then states).
  // Returns: true when a chunk was planned; false when the work set is done;
  // the source's error (wrapped "extents") when Extents() fails.
  Result<bool> Next(Chunk& chunk);

  // Bytes of the work set after widening to whole clusters and clipping to
  // the source's size: the "total" of progress reports.
  uint64_t work_bytes() const { return work_bytes_; }
  const RangeList& aligned_work() const { return work_; }

 private:
  Result<ClusterState> Classify(uint64_t cluster_offset, uint64_t cluster_end, uint64_t range_end);
  // Where the run of hole or zero extents starting at `offset` ends
  // (at most `range_end`); `offset` itself when it is data.
  Result<uint64_t> ZeroRunEnd(uint64_t offset, uint64_t range_end);
  // Makes cache_ cover `offset` (a query clipped to range_end).
  Status Cover(uint64_t offset, uint64_t range_end);
  // Fills cache_ with the extents of [offset, offset + length).
  Status Query(uint64_t offset, uint64_t length);

  BlockSource& source_;
  const uint64_t size_bytes_;
  const uint32_t cluster_bytes_;
  const uint32_t chunk_bytes_;
  const uint64_t extent_query_bytes_;
  const bool has_extents_;
  const bool skip_zero_extents_;
  RangeList work_;
  uint64_t work_bytes_ = 0;
  size_t range_index_ = 0;
  uint64_t position_ = 0;
  uint64_t next_sequence_ = 0;
  // Extents of [cache_begin_, cache_end_), and a cursor into them.
  ExtentList cache_;
  uint64_t cache_begin_ = 0;
  uint64_t cache_end_ = 0;
  size_t cache_index_ = 0;
};

// Reads the kData clusters of a chunk: each run of adjacent kData clusters is
// one request (up to the whole window), all runs in one ReadMany batch. The
// source is hinted ahead of the pass (ReadAheadMark): chunks come in guest
// order with holes skipped. Thread-safe if the source is (BlockSource
// promises it).
class Reader {
 public:
  explicit Reader(BlockSource& source) : source_(source) {}  // source must outlive
  // Returns the bytes read, or the first failing read's error (with the
  // guest offset and length of the run when the source gave none).
  Result<uint64_t> Read(Chunk& chunk);

 private:
  BlockSource& source_;
  ReadAheadMark read_ahead_;
};

// Time spent per sub-step of ClusterProcessor::Process, for JobStats.
struct ProcessTimings {
  uint64_t zero_detect_ns = 0;
  uint64_t hash_ns = 0;
  uint64_t strong_hash_ns = 0;
  uint64_t compress_ns = 0;
  uint64_t compressed_clusters = 0;
};

// Per cluster of a chunk: zero detection (kData -> kZero), xxh3-128 digest of
// every cluster but kSkip (zero ones get the zero digest without hashing),
// and, given a compressor, compression (kData -> kCompressed when it saves a
// sector; stored raw otherwise). A short last cluster is zero padded in its
// slot before compression. Stateless apart from constants: thread-safe; the
// compressor is per thread.
class ClusterProcessor {
 public:
  // strong: also SHA-256 every cluster that stays data (Chunk::strong).
  // weak false: no xxh3 digest (Chunk::digests left as they are): a scan
  // that only wants the strong ones.
  explicit ClusterProcessor(uint32_t cluster_bytes, bool strong = false, bool weak = true);
  // `compressor` may be null (no destination wants compression); `timings`
  // may be null. Errors come from the compressor only.
  Status Process(Chunk& chunk, formats::ClusterCompressor* compressor,
                 ProcessTimings* timings = nullptr) const;

 private:
  uint32_t cluster_bytes_;
  bool strong_;
  bool weak_;
  formats::Digest128 zero_digest_;
};

// SHA-256 of one cluster's bytes zero-padded to `cluster_bytes` (the strong
// digest of docs/formats/backup.md). Thread-safe: one OpenSSL context per
// thread, reused, over SHA-256 fetched once (OpenSSL picks its SHA-NI or
// AVX2 code by the CPU).
formats::StrongDigest StrongHashCluster(std::span<const std::byte> data, uint32_t cluster_bytes);

// Expected digest of a guest cluster, or nullopt when there is none to check.
using DigestLookup = std::function<std::optional<formats::Digest128>(uint64_t cluster_index)>;

// The file that holds a guest offset's bytes (in a backing chain: the layer
// the bytes come from), or "" when not known.
using HolderLookup = std::function<std::string(uint64_t guest_offset)>;

// Compares each cluster's digest (all but kSkip) with the expected one.
// Thread-safe if the lookups are.
class Verifier {
 public:
  Verifier(DigestLookup expected, std::string source_name, HolderLookup holder = nullptr)
      : expected_(std::move(expected)), source_name_(std::move(source_name)), holder_(std::move(holder)) {}
  // kCorruption naming the guest offset of the first mismatching cluster of
  // the chunk (with set_range) and the file holding it (the holder lookup's
  // answer, else the source), else ok.
  Status Check(const Chunk& chunk) const;

 private:
  DigestLookup expected_;
  std::string source_name_;
  HolderLookup holder_;
};

// SHA-512 of the logical content, fed in guest order (OpenSSL EVP). One
// thread at a time.
class Sha512Stream {
 public:
  Sha512Stream();
  ~Sha512Stream();
  Sha512Stream(const Sha512Stream&) = delete;
  Sha512Stream& operator=(const Sha512Stream&) = delete;

  Status Update(std::span<const std::byte> data);
  Status UpdateZeros(uint64_t count);
  // Feeds every cluster of the chunk but kSkip: bytes for data, zeros for
  // holes and zero clusters (which may not have been read).
  Status UpdateChunk(const Chunk& chunk);
  // 128 lowercase hex digits. Nothing may be added afterwards.
  Result<std::string> FinishHex();
  // Starts over, as a new stream.
  void Reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace barge::pipeline
