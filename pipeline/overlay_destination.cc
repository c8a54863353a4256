// TopLayerAllocation and OverlayQcow2Destination.
#include "pipeline/overlay_destination.h"

#include <algorithm>

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
      new OverlayQcow2Destination(std::move(writer), sink.name(), compression, allocated));
}

OverlayQcow2Destination::OverlayQcow2Destination(std::unique_ptr<formats::Qcow2Writer> writer,
                                                 std::string name, formats::Compression compression,
                                                 const RangeList& allocated)
    : writer_(std::move(writer)), name_(std::move(name)), compression_(compression), allocated_(allocated) {}

bool OverlayQcow2Destination::Overlaps(uint64_t begin, uint64_t end) {
  while (cursor_ < allocated_.size() && allocated_[cursor_].end() <= begin) ++cursor_;
  return cursor_ < allocated_.size() && allocated_[cursor_].offset < end;
}

Status OverlayQcow2Destination::Consume(const Chunk& chunk) {
  BARGE_RETURN_IF_ERROR(CheckQcow2ClusterSize(chunk, *writer_, name_));
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    if (chunk.states[i] == ClusterState::kSkip) continue;
    const uint64_t begin = chunk.ClusterOffset(i);
    if (!Overlaps(begin, begin + chunk.ClusterLength(i))) continue;  // left to the backing file
    BARGE_RETURN_IF_ERROR(StoreQcow2Cluster(*writer_, chunk, i, wants_compression(), /*store_zero=*/true, name_));
  }
  return OkStatus();
}

Status OverlayQcow2Destination::Finish() { return writer_->Finish(); }

}  // namespace barge::pipeline
