// The message of the copy pipeline: one window of whole clusters of the
// guest disk, its per-cluster state and digests, and the buffers holding its
// bytes and compressed payloads. Chunks live in a BufferPool and are reused.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "blockio/buffer.h"
#include "formats/digest.h"
#include "formats/strong_digest_table.h"

namespace barge::pipeline {

// What one cluster of a chunk holds. The planner sets kSkip, kHole, kZero or
// kData; the processor may turn kData into kZero (all bytes zero) or
// kCompressed (a payload exists in the scratch area).
enum class ClusterState : uint8_t {
  kSkip,        // outside the work set: not read, not written, no digest
  kHole,        // unallocated in the source per its extents: not read, reads as zeros
  kZero,        // reads as zeros (per extents, or detected after reading)
  kData,        // bytes in data(); to be stored as is
  kCompressed,  // bytes in data() and a compressed payload in Payload(i)
};
std::string_view ClusterStateName(ClusterState state);

// One window [offset_bytes, offset_bytes + length_bytes) of the guest disk:
// a multiple of the cluster size except at the end of the disk. Cluster i of
// the chunk is guest cluster first_cluster() + i; its bytes are at
// data()[i * cluster_bytes] (valid only for kData/kCompressed and kZero
// clusters that were read).
//
// Threads: a chunk moves through the pipeline one stage at a time; after the
// in-order stage it is read (never written) by every destination at once.
struct Chunk {
  // Allocates the buffers once: `chunk_bytes` of data and, when
  // `with_scratch`, as much again for compressed payloads. Throws bad_alloc.
  Chunk(uint32_t chunk_bytes, uint32_t cluster_bytes, bool with_scratch);
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  // Plan, set by ChunkPlanner::Next.
  uint64_t sequence = 0;      // 0, 1, 2, ... in guest order; the sequencer's key
  uint64_t offset_bytes = 0;  // window start, a multiple of chunk_capacity_bytes
  uint64_t length_bytes = 0;  // window length (short at the end of the disk)
  std::vector<ClusterState> states;        // one per cluster of the window
  // A run of clusters [zero_run_begin, zero_run_end) just before the window
  // that the planner skipped because the source reads them as zeros
  // (ChunkPlanner's skip_zero_extents). Such a chunk has no window of its
  // own (length_bytes 0, offset_bytes at the run's end); the in-order stage
  // checks and folds the run in time independent of its length, and
  // destinations see no cluster of it.
  uint64_t zero_run_begin = 0;
  uint64_t zero_run_end = 0;
  uint64_t zero_run_clusters() const { return zero_run_end - zero_run_begin; }
  // Set by ClusterProcessor for every cluster but kSkip.
  std::vector<formats::Digest128> digests;
  // SHA-256 per cluster, set by a ClusterProcessor made with strong
  // digests for every kData/kCompressed cluster (else empty).
  std::vector<formats::StrongDigest> strong;
  // Compressed payload size of each kCompressed cluster (else 0).
  std::vector<uint32_t> payload_bytes;

  // Refcount of destinations that still have to consume this chunk. Shared
  // because one read feeds every destination (fan-out); the last one to
  // finish returns the chunk to the pool.
  std::atomic<uint32_t> pending_consumers{0};
  // Index of this chunk in its BufferPool (set by the pool).
  size_t pool_slot = 0;

  uint32_t cluster_bytes() const { return cluster_bytes_; }
  uint32_t capacity_bytes() const { return static_cast<uint32_t>(data_.capacity()); }
  uint64_t first_cluster() const { return offset_bytes / cluster_bytes_; }
  size_t cluster_count() const { return states.size(); }
  // Guest offset of cluster i of this chunk.
  uint64_t ClusterOffset(size_t i) const { return offset_bytes + uint64_t{cluster_bytes_} * i; }
  // Logical length of cluster i (the last cluster of a disk may be short).
  uint32_t ClusterLength(size_t i) const;

  // The logical bytes of cluster i (ClusterLength(i) of them).
  std::span<const std::byte> ClusterData(size_t i) const;
  std::span<std::byte> MutableClusterData(size_t i);
  // Bytes [byte_offset, byte_offset + length) of the window.
  std::span<std::byte> WindowBytes(uint64_t byte_offset, uint64_t length);
  std::span<const std::byte> WindowBytes(uint64_t byte_offset, uint64_t length) const;
  // The whole cluster-sized slot of cluster i (for zero padding a short one).
  std::span<std::byte> ClusterSlot(size_t i);

  bool has_scratch() const { return scratch_.capacity() != 0; }
  // Compressed payload of cluster i (payload_bytes[i] bytes).
  std::span<const std::byte> Payload(size_t i) const;
  // Where the processor puts the payload of cluster i (cluster_bytes long).
  std::span<std::byte> PayloadSlot(size_t i);

  // Resets the plan for a window; states become kSkip, digests cleared.
  void Reset(uint64_t sequence, uint64_t offset_bytes, uint64_t length_bytes);

 private:
  uint32_t cluster_bytes_;
  AlignedBuffer data_;
  AlignedBuffer scratch_;
};

}  // namespace barge::pipeline
