// Writing one layer of a chain: the allocation map of an image's top layer,
// and a qcow2 destination that stores only the clusters of such a map while
// the copy reads (and hashes) the whole guest view. `barge replicate
// --backing keep` uses both: the SHA-512 covers the logical disk, the copy
// holds the top layer and names the same backing file. `barge convert
// --backing` stores only what differs from the backing image.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/extent.h"
#include "blockio/sink.h"
#include "formats/image.h"
#include "formats/qcow2_writer.h"
#include "pipeline/destination.h"

namespace barge::pipeline {

// Guest byte ranges that `image`'s top layer holds itself (data, compressed
// or zero clusters: depth 0 of Image::Map, holes excluded), normalized.
// Everything else falls through to the backing chain.
Result<RangeList> TopLayerAllocation(formats::Image& image);

// Writes a new qcow2 overlay through formats::Qcow2Writer. A cluster that
// overlaps `allocated` is stored from the chunk's logical bytes: data as data
// (compressed when the destination wants it), zero and hole clusters as qcow2
// zero clusters (they must not fall through to the backing file). Every other
// cluster is left unallocated, so it reads from the backing file named in the
// writer options. A copy cluster larger than the source's may so hold a few
// bytes the source took from its backing file; the guest view is the same.
class OverlayQcow2Destination final : public Destination {
 public:
  // `sink` and `allocated` (normalized, as from TopLayerAllocation) must
  // outlive the destination.
  static Result<std::unique_ptr<OverlayQcow2Destination>> Create(BlockSink& sink,
                                                                formats::Qcow2WriterOptions options,
                                                                const RangeList& allocated);
  // The same, deciding per cluster by content instead: a cluster is stored
  // when its bytes differ from what `backing` (the image the backing file
  // name refers to; it must outlive the destination) reads there, zero and
  // hole clusters included; clusters that read the same are left to it.
  static Result<std::unique_ptr<OverlayQcow2Destination>> CreateDiff(BlockSink& sink,
                                                                    formats::Qcow2WriterOptions options,
                                                                    formats::Image& backing);

  const std::string& name() const override { return name_; }
  formats::Compression compression() const override { return compression_; }
  std::optional<formats::Qcow2WriterStats> qcow2_stats() const override { return writer_->stats(); }
  Status Consume(const Chunk& chunk) override;
  Status Finish() override;

 private:
  OverlayQcow2Destination(std::unique_ptr<formats::Qcow2Writer> writer, std::string name,
                          formats::Compression compression, const RangeList* allocated,
                          formats::Image* backing);
  // True when [begin, end) overlaps `allocated_`. Calls come in increasing
  // guest order, so a cursor walks the list once.
  bool Overlaps(uint64_t begin, uint64_t end);
  // What the backing image reads over the chunk's window (zeros past its end).
  Result<std::span<const std::byte>> ReadBacking(const Chunk& chunk);

  std::unique_ptr<formats::Qcow2Writer> writer_;
  std::string name_;
  formats::Compression compression_;
  const RangeList* allocated_;     // set: store the clusters overlapping it
  formats::Image* backing_;        // set: store the clusters that differ from it
  std::vector<std::byte> below_;   // ReadBacking's buffer (Consume is serial)
  size_t cursor_ = 0;
};

}  // namespace barge::pipeline
