// Chunk: buffers allocated once, views computed from the window.
#include "pipeline/chunk.h"

#include <algorithm>
#include <cassert>

namespace barge::pipeline {

std::string_view ClusterStateName(ClusterState state) {
  switch (state) {
    case ClusterState::kSkip: return "skip";
    case ClusterState::kHole: return "hole";
    case ClusterState::kZero: return "zero";
    case ClusterState::kData: return "data";
    case ClusterState::kCompressed: return "compressed";
  }
  return "unknown";
}

Chunk::Chunk(uint32_t chunk_bytes, uint32_t cluster_bytes, bool with_scratch)
    : cluster_bytes_(cluster_bytes),
      data_(chunk_bytes),
      scratch_(with_scratch ? chunk_bytes : 0) {
  assert(cluster_bytes != 0 && chunk_bytes % cluster_bytes == 0);
  size_t clusters = chunk_bytes / cluster_bytes;
  // Touch every page now: first-touch faults inside the copy cost more
  // than the copy itself on some VMs.
  data_.Zero();
  scratch_.Zero();
  // Reserved once so that Reset never allocates in the hot path.
  states.reserve(clusters);
  digests.reserve(clusters);
  strong.reserve(clusters);
  payload_bytes.reserve(clusters);
}

uint32_t Chunk::ClusterLength(size_t i) const {
  uint64_t start = uint64_t{cluster_bytes_} * i;
  return static_cast<uint32_t>(std::min<uint64_t>(cluster_bytes_, length_bytes - start));
}

std::span<const std::byte> Chunk::ClusterData(size_t i) const {
  return {data_.data() + uint64_t{cluster_bytes_} * i, ClusterLength(i)};
}

std::span<std::byte> Chunk::MutableClusterData(size_t i) {
  return {data_.data() + uint64_t{cluster_bytes_} * i, ClusterLength(i)};
}

std::span<std::byte> Chunk::WindowBytes(uint64_t byte_offset, uint64_t length) {
  assert(byte_offset + length <= data_.capacity());
  return {data_.data() + byte_offset, static_cast<size_t>(length)};
}

std::span<const std::byte> Chunk::WindowBytes(uint64_t byte_offset, uint64_t length) const {
  assert(byte_offset + length <= data_.capacity());
  return {data_.data() + byte_offset, static_cast<size_t>(length)};
}

std::span<std::byte> Chunk::ClusterSlot(size_t i) {
  return {data_.data() + uint64_t{cluster_bytes_} * i, cluster_bytes_};
}

std::span<const std::byte> Chunk::Payload(size_t i) const {
  return {scratch_.data() + uint64_t{cluster_bytes_} * i, payload_bytes[i]};
}

std::span<std::byte> Chunk::PayloadSlot(size_t i) {
  assert(has_scratch());
  return {scratch_.data() + uint64_t{cluster_bytes_} * i, cluster_bytes_};
}

void Chunk::Reset(uint64_t seq, uint64_t offset, uint64_t length) {
  assert(length <= data_.capacity());
  sequence = seq;
  offset_bytes = offset;
  length_bytes = length;
  zero_run_begin = 0;
  zero_run_end = 0;
  size_t clusters = (length + cluster_bytes_ - 1) / cluster_bytes_;
  states.assign(clusters, ClusterState::kSkip);
  digests.assign(clusters, formats::Digest128{});
  strong.clear();
  payload_bytes.assign(clusters, 0);
  pending_consumers.store(0, std::memory_order_relaxed);
}

}  // namespace barge::pipeline
