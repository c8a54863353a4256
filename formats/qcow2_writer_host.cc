// Appends clusters and packed compressed payloads for the one-pass qcow2
// writer and keeps their refcounts (QCOW2.md §3, §4).
#include "formats/qcow2_writer_host.h"

#include <algorithm>
#include <string>
#include <vector>

#include "formats/qcow2_format.h"

namespace barge::formats::qcow2 {

HostFile::HostFile(BlockSink& sink, uint32_t cluster_bits, uint32_t refcount_order)
    : sink_(sink),
      cluster_bits_(cluster_bits),
      refcount_order_(refcount_order),
      refcounts_(cluster_bits, refcount_order) {}

Status HostFile::WriteOut(uint64_t offset, std::span<const std::byte> data, std::string_view what) {
  Status st = sink_.WriteAt(offset, data);
  if (!st.ok()) {
    return std::move(st).error().Wrap("qcow2 writer: writing " + std::string(what) + " at offset " +
                                      std::to_string(offset));
  }
  return OkStatus();
}

Status HostFile::WriteAt(uint64_t offset, std::span<const std::byte> data, std::string_view what) {
  BARGE_RETURN_IF_ERROR(FlushAppends());
  return WriteOut(offset, data, what);
}

Status HostFile::FlushAppends() {
  if (buffer_.empty()) return OkStatus();
  Status st = WriteSparse();
  buffer_offset_ += buffer_.size();
  buffer_.clear();
  return st;
}

Status HostFile::WriteSparse() {
  const std::span<const std::byte> bytes(buffer_);
  if (!sink_.capabilities().zero_initialized) return WriteOut(buffer_offset_, bytes, "appended clusters");
  // On a sink that reads unwritten bytes as zeros, all-zero 4 KiB blocks
  // (the unused tail of the L1 table's cluster and of the last packed
  // cluster, zero blocks inside data) are left unwritten: the file then
  // takes no more space than qemu-img's. The file's length is set by the
  // refcount area, which is written last.
  Status st = WriteSkippingZeroBlocks(sink_, buffer_offset_, bytes);
  if (!st.ok()) {
    return std::move(st).error().Wrap("qcow2 writer: writing appended clusters at offset " +
                                      std::to_string(buffer_offset_));
  }
  return OkStatus();
}

Status HostFile::Append(uint64_t offset, std::span<const std::byte> data, std::string_view what) {
  // Appends only move forward; a gap (the unused tail of a packed cluster
  // before an aligned append) is filled with zeros, as a hole would read.
  if (!buffer_.empty() && offset < buffer_offset_ + buffer_.size()) {
    return Error::InvalidArgument("qcow2 writer: append of " + std::string(what) + " at offset " +
                                  std::to_string(offset) + " behind the end of the buffered data");
  }
  if (buffer_.empty()) {
    buffer_offset_ = offset;
  } else if (offset - (buffer_offset_ + buffer_.size()) > kAppendBufferBytes) {
    BARGE_RETURN_IF_ERROR(FlushAppends());
    buffer_offset_ = offset;
  }
  if (buffer_.capacity() < kAppendBufferBytes) buffer_.reserve(kAppendBufferBytes + cluster_size());
  buffer_.resize(offset - buffer_offset_, std::byte{0});
  buffer_.insert(buffer_.end(), data.begin(), data.end());
  if (buffer_.size() >= kAppendBufferBytes) return FlushAppends();
  return OkStatus();
}

uint64_t HostFile::PlaceClusters() const {
  uint64_t cs = cluster_size();
  return (end_bytes_ + cs - 1) & ~(cs - 1);
}

Result<uint64_t> HostFile::AppendClusters(std::span<const std::byte> data, std::string_view what) {
  if (data.empty()) return uint64_t{0};
  uint64_t cs = cluster_size();
  uint64_t offset = PlaceClusters();
  uint64_t clusters = (data.size() + cs - 1) >> cluster_bits_;
  BARGE_RETURN_IF_ERROR(Append(offset, data, what));
  uint64_t tail = clusters * cs - data.size();
  if (tail > 0) {
    // Zeros to the cluster's end: written where the sink is not
    // zero-initialized (the tail must read as zeros), else skipped as any
    // zero block (WriteSparse). The file's length, covering every cluster
    // it references, comes from the refcount area, written last.
    std::vector<std::byte> zeros(tail);
    BARGE_RETURN_IF_ERROR(Append(offset + data.size(), zeros, what));
  }
  BARGE_RETURN_IF_ERROR(refcounts_.AddReference(offset >> cluster_bits_, clusters));
  end_bytes_ = offset + clusters * cs;
  return offset;
}

Result<uint64_t> HostFile::SkipClusters(uint64_t bytes) {
  if (bytes == 0) return uint64_t{0};
  if (!buffer_.empty()) return Error::InvalidArgument("qcow2 writer: skip with appends buffered");
  uint64_t cs = cluster_size();
  uint64_t offset = PlaceClusters();
  uint64_t clusters = (bytes + cs - 1) >> cluster_bits_;
  BARGE_RETURN_IF_ERROR(refcounts_.AddReference(offset >> cluster_bits_, clusters));
  end_bytes_ = offset + clusters * cs;
  return offset;
}

Result<uint64_t> HostFile::PlacePacked(uint64_t payload_bytes) const {
  uint64_t cs = cluster_size();
  if (payload_bytes == 0 || payload_bytes > cs - kSectorBytes) {
    return Error::InvalidArgument("qcow2 writer: compressed payload of " + std::to_string(payload_bytes) +
                                  " bytes (must be 1.." + std::to_string(cs - kSectorBytes) + ")");
  }
  uint64_t offset = end_bytes_;
  // A partly used cluster is shared with the payloads before it; if its
  // refcount is already at the maximum (always with 1-bit refcounts), move
  // to the next cluster, leaving the rest of this one unused.
  if ((offset & (cs - 1)) != 0 &&
      refcounts_.RefcountOf(offset >> cluster_bits_) >= refcounts_.max_refcount()) {
    offset = (offset + cs - 1) & ~(cs - 1);
  }
  // The compressed descriptor holds byte offsets below 2^(70-cluster_bits).
  if (offset + payload_bytes > (uint64_t{1} << CompressedOffsetBits(cluster_bits_)) ||
      offset + payload_bytes > (uint64_t{1} << 56)) {
    return Error::NotSupported("qcow2 writer: compressed data beyond the offset limit of " +
                               std::to_string(cluster_bits_) + "-bit clusters");
  }
  return offset;
}

Result<uint64_t> HostFile::AppendPacked(std::span<const std::byte> payload) {
  BARGE_ASSIGN_OR_RETURN(uint64_t offset, PlacePacked(payload.size()));
  BARGE_RETURN_IF_ERROR(Append(offset, payload, "a compressed cluster"));
  uint64_t first = offset >> cluster_bits_;
  uint64_t last = (offset + payload.size() - 1) >> cluster_bits_;
  BARGE_RETURN_IF_ERROR(refcounts_.AddReference(first, last - first + 1));
  end_bytes_ = offset + payload.size();
  return offset;
}

Result<uint64_t> HostFile::SkipPacked(uint64_t payload_bytes) {
  if (!buffer_.empty()) return Error::InvalidArgument("qcow2 writer: skip with appends buffered");
  BARGE_ASSIGN_OR_RETURN(uint64_t offset, PlacePacked(payload_bytes));
  uint64_t first = offset >> cluster_bits_;
  uint64_t last = (offset + payload_bytes - 1) >> cluster_bits_;
  BARGE_RETURN_IF_ERROR(refcounts_.AddReference(first, last - first + 1));
  end_bytes_ = offset + payload_bytes;
  return offset;
}

Result<RefcountLayout> HostFile::WriteRefcountArea() {
  uint64_t cs = cluster_size();
  uint64_t base = (end_bytes_ + cs - 1) >> cluster_bits_;
  BARGE_RETURN_IF_ERROR(FlushAppends());
  RefcountLayout layout = PlanRefcountArea(base, cluster_bits_, refcount_order_);
  BARGE_RETURN_IF_ERROR(refcounts_.WriteArea(sink_, layout));
  end_bytes_ = layout.end_offset;
  return layout;
}

}  // namespace barge::formats::qcow2
