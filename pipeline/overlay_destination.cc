// TopLayerAllocation and OverlayQcow2Destination.
#include "pipeline/overlay_destination.h"

#include <algorithm>

#include "blockio/buffer.h"

namespace barge::pipeline {

Result<RangeList> TopLayerAllocation(formats::Image& image) {
  // Map in windows, so a huge sparse disk never needs one giant extent list.
  constexpr uint64_t kWindow = 1ull << 30;
  const uint64_t size = image.size_bytes();
  RangeList out;
  for (uint64_t offset = 0; offset < size; offset += kWindow) {
    BARGE_ASSIGN_OR_RETURN(std::vector<formats::MappedExtent> mapped,
                           image.Map(offset, std::min(kWindow, size - offset)));
    for (const formats::MappedExtent& m : mapped) {
      if (m.depth != 0 || m.kind == ExtentKind::kHole || m.length == 0) continue;
      if (!out.empty() && out.back().end() == m.offset) {
        out.back().length += m.length;
      } else {
        out.push_back({m.offset, m.length});
      }
    }
  }
  return NormalizeRanges(std::move(out));
}

Result<std::unique_ptr<OverlayQcow2Destination>> OverlayQcow2Destination::Create(
    BlockSink& sink, formats::Qcow2WriterOptions options, const RangeList& allocated) {
  if (options.backing_file.empty()) {
    return Error::InvalidArgument("an overlay copy needs a backing file name").set_path(sink.name());
  }
  formats::Compression compression = options.compression;
  BARGE_ASSIGN_OR_RETURN(auto writer, formats::Qcow2Writer::Create(sink, std::move(options)));
  return std::unique_ptr<OverlayQcow2Destination>(
      new OverlayQcow2Destination(std::move(writer), sink.name(), compression, &allocated, nullptr));
}

Result<std::unique_ptr<OverlayQcow2Destination>> OverlayQcow2Destination::CreateDiff(
    BlockSink& sink, formats::Qcow2WriterOptions options, formats::Image& backing) {
  if (options.backing_file.empty()) {
    return Error::InvalidArgument("an overlay needs a backing file name").set_path(sink.name());
  }
  formats::Compression compression = options.compression;
  BARGE_ASSIGN_OR_RETURN(auto writer, formats::Qcow2Writer::Create(sink, std::move(options)));
  return std::unique_ptr<OverlayQcow2Destination>(
      new OverlayQcow2Destination(std::move(writer), sink.name(), compression, nullptr, &backing));
}

OverlayQcow2Destination::OverlayQcow2Destination(std::unique_ptr<formats::Qcow2Writer> writer,
                                                 std::string name, formats::Compression compression,
                                                 const RangeList* allocated, formats::Image* backing)
    : writer_(std::move(writer)),
      name_(std::move(name)),
      compression_(compression),
      allocated_(allocated),
      backing_(backing) {}

bool OverlayQcow2Destination::Overlaps(uint64_t begin, uint64_t end) {
  while (cursor_ < allocated_->size() && (*allocated_)[cursor_].end() <= begin) ++cursor_;
  return cursor_ < allocated_->size() && (*allocated_)[cursor_].offset < end;
}

Result<std::span<const std::byte>> OverlayQcow2Destination::ReadBacking(const Chunk& chunk) {
  below_.resize(chunk.length_bytes);
  const uint64_t size = backing_->size_bytes();
  const uint64_t in_backing =
      chunk.offset_bytes < size ? std::min<uint64_t>(chunk.length_bytes, size - chunk.offset_bytes) : 0;
  if (in_backing > 0) {
    Status st = backing_->ReadAt(chunk.offset_bytes, std::span(below_).first(in_backing));
    if (!st.ok()) return Error(std::move(st).error()).Wrap("read the backing image");
  }
  std::fill(below_.begin() + in_backing, below_.end(), std::byte{0});
  return std::span<const std::byte>(below_);
}

Status OverlayQcow2Destination::Consume(const Chunk& chunk) {
  BARGE_RETURN_IF_ERROR(CheckQcow2ClusterSize(chunk, *writer_, name_));
  std::span<const std::byte> below;
  if (backing_ != nullptr) {
    BARGE_ASSIGN_OR_RETURN(below, ReadBacking(chunk));
  }
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    const ClusterState state = chunk.states[i];
    if (state == ClusterState::kSkip) continue;
    const uint64_t begin = chunk.ClusterOffset(i);
    bool store;
    if (allocated_ != nullptr) {
      store = Overlaps(begin, begin + chunk.ClusterLength(i));
    } else {
      std::span<const std::byte> base = below.subspan(begin - chunk.offset_bytes, chunk.ClusterLength(i));
      const bool data = state == ClusterState::kData || state == ClusterState::kCompressed;
      store = data ? !std::equal(base.begin(), base.end(), chunk.ClusterData(i).begin()) : !IsAllZero(base);
    }
    if (!store) continue;  // left to the backing file
    BARGE_RETURN_IF_ERROR(StoreQcow2Cluster(*writer_, chunk, i, wants_compression(), /*store_zero=*/true, name_));
  }
  return OkStatus();
}

Status OverlayQcow2Destination::Finish() { return writer_->Finish(); }

}  // namespace barge::pipeline
