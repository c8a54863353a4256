// Looking at images the way qemu-img does (barge map, barge compare): the
// merged extent map of a whole image, and the first byte where two images
// read differently. The cli prints what these return.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/source.h"
#include "formats/image.h"

namespace barge::pipeline {

// The layers of `top`'s backing chain, `top` itself first.
std::vector<const formats::Image*> BackingChain(const formats::Image& top);

// One extent as qemu-img map --output=json reports it, plus barge's
// "compressed" and "file".
struct MapEntry {
  uint64_t start = 0, length = 0;
  int depth = 0;  // the layer of the chain that answers (BackingChain's index)
  bool present = false, zero = false, data = false, compressed = false;
  std::optional<uint64_t> offset;
  std::string file;  // the file `offset` points into ("" = none)
};

// `e` as qemu-img map shows it, `chain` being BackingChain of the image
// mapped: a raw layer's holes are present zeros at their own offset (the
// raw file answers for them), a qcow2 hole is "not present"; `file` is the
// layer's external data file (the path barge opened it at) when it has
// one, else the layer's own file.
MapEntry ToMapEntry(const formats::MappedExtent& e, const std::vector<const formats::Image*>& chain);

// Appends `e` to `map`, or lengthens the last entry instead when `e`
// continues it, as qemu-img map merges neighbours: the same layer and
// kind, the same file, adjacent guest ranges and adjacent host offsets
// (or none on both).
void AppendMerged(std::vector<MapEntry>& map, const MapEntry& e);

// The whole guest view of `image`, mapped and merged (ToMapEntry,
// AppendMerged). Read in windows of 1 GiB, or 1/4096 of the disk when
// larger: a hostile image may claim 2 EiB, and Map's own cost is per L1
// entry and per allocated cluster, not per byte.
Result<std::vector<MapEntry>> MapImage(formats::Image& image);

// The first byte of [offset, offset + length) where `a` and `b` differ, or
// nullopt. Ranges both report as holding no data are not read.
Result<std::optional<uint64_t>> FirstDifference(BlockSource& a, BlockSource& b, uint64_t offset,
                                                uint64_t length);

// The first non-zero byte of [offset, end) of `source`, or nullopt. Ranges
// it reports as holding no data are not read.
Result<std::optional<uint64_t>> FirstNonZero(BlockSource& source, uint64_t offset, uint64_t end);

// What qemu-img compare says of two guest views.
struct ImageComparison {
  uint64_t a_size = 0, b_size = 0;
  bool identical = false;
  // The first byte that reads differently; none when identical, and none
  // when `strict_size` refused images of different sizes unread.
  std::optional<uint64_t> first_difference;
  bool sizes_differ() const { return a_size != b_size; }
};

// Compares `a` and `b` as qemu-img compare does: with `strict_size`,
// images of different sizes differ (nothing is read); otherwise the common
// range is compared, then the larger image's tail must read as zeros (the
// images are then identical although their sizes differ).
Result<ImageComparison> CompareImages(BlockSource& a, BlockSource& b, bool strict_size);

}  // namespace barge::pipeline
