// The host side of the one-pass qcow2 writer: appends clusters and packed
// compressed payloads to the sink in order and counts their references.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "blockio/sink.h"
#include "formats/qcow2_refcount_builder.h"

namespace barge::formats::qcow2 {

// Single-threaded. `sink` must outlive it.
class HostFile {
 public:
  HostFile(BlockSink& sink, uint32_t cluster_bits, uint32_t refcount_order);

  uint32_t cluster_bits() const { return cluster_bits_; }
  uint64_t cluster_size() const { return uint64_t{1} << cluster_bits_; }
  // First byte not yet used (not cluster aligned after a packed payload).
  uint64_t end_bytes() const { return end_bytes_; }
  RefcountBuilder& refcounts() { return refcounts_; }

  // Writes `data` at the next cluster boundary, zero-padded to whole
  // clusters, with one reference on each. An empty span takes no cluster and
  // returns 0. Returns the offset. `what` names the structure in errors.
  Result<uint64_t> AppendClusters(std::span<const std::byte> data, std::string_view what);

  // Writes a compressed payload (1 .. cluster_size-512 bytes) at the current
  // byte position, sharing the partly used cluster when its refcount has
  // room, else starting a fresh cluster (always so with refcount order 0).
  // Adds one reference to every cluster the payload touches. Returns the
  // host byte offset.
  Result<uint64_t> AppendPacked(std::span<const std::byte> payload);

  // Resume (Qcow2Writer::Resume): take the place AppendClusters or
  // AppendPacked would for `bytes`, with the same references, and write
  // nothing (the bytes are already in the file). Nothing may be buffered.
  // Return the offset.
  Result<uint64_t> SkipClusters(uint64_t bytes);
  Result<uint64_t> SkipPacked(uint64_t payload_bytes);

  // Writes raw bytes at `offset` (the header), without counting anything.
  // Appended bytes still buffered are written first.
  Status WriteAt(uint64_t offset, std::span<const std::byte> data, std::string_view what);

  // Sizes, counts and writes the refcount area after everything appended so
  // far. Nothing may be appended afterwards. Returns the layout.
  Result<RefcountLayout> WriteRefcountArea();

  // Writes out the appended bytes still buffered.
  Status FlushAppends();

 private:
  // Appends go to one contiguous buffer written out in large requests
  // (kAppendBufferBytes): a compressed image is mostly payloads of a few
  // KiB, and one write per payload costs far more than one per few MiB.
  static constexpr size_t kAppendBufferBytes = 4 << 20;
  // Where the next AppendClusters goes, and the next AppendPacked of
  // `payload_bytes` (its errors as AppendPacked says).
  uint64_t PlaceClusters() const;
  Result<uint64_t> PlacePacked(uint64_t payload_bytes) const;
  Status Append(uint64_t offset, std::span<const std::byte> data, std::string_view what);
  Status WriteOut(uint64_t offset, std::span<const std::byte> data, std::string_view what);
  // Writes the buffer, leaving all-zero 4 KiB blocks unwritten where the
  // sink reads them as zeros.
  Status WriteSparse();

  BlockSink& sink_;  // borrowed; must outlive this object
  uint32_t cluster_bits_;
  uint32_t refcount_order_;
  uint64_t end_bytes_ = 0;
  RefcountBuilder refcounts_;
  // Bytes appended but not yet written; they belong at buffer_offset_.
  std::vector<std::byte> buffer_;
  uint64_t buffer_offset_ = 0;
};

}  // namespace barge::formats::qcow2
