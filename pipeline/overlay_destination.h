// Writing one layer of a chain: the allocation map of an image's top layer,
// and a qcow2 destination that stores only the clusters of such a map while
// the copy reads (and hashes) the whole guest view. `barge replicate
// --backing keep` uses both: the SHA-512 covers the logical disk, the copy
// holds the top layer and names the same backing file.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

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

  const std::string& name() const override { return name_; }
  formats::Compression compression() const override { return compression_; }
  Status Consume(const Chunk& chunk) override;
  Status Finish() override;

 private:
  OverlayQcow2Destination(std::unique_ptr<formats::Qcow2Writer> writer, std::string name,
                          formats::Compression compression, const RangeList& allocated);
  // True when [begin, end) overlaps `allocated_`. Calls come in increasing
  // guest order, so a cursor walks the list once.
  bool Overlaps(uint64_t begin, uint64_t end);

  std::unique_ptr<formats::Qcow2Writer> writer_;
  std::string name_;
  formats::Compression compression_;
  const RangeList& allocated_;
  size_t cursor_ = 0;
};

}  // namespace barge::pipeline
