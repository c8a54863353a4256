// barge map's merged extents and barge compare's byte comparison.
#include "pipeline/image_inspect.h"

#include <algorithm>
#include <cstring>

#include "blockio/buffer.h"

namespace barge::pipeline {

std::vector<const formats::Image*> BackingChain(const formats::Image& top) {
  std::vector<const formats::Image*> chain;
  for (const formats::Image* i = &top; i != nullptr; i = i->backing()) chain.push_back(i);
  return chain;
}

namespace {

// The file a layer's host offsets point into: its external data file when
// it has one (the path barge opened it at: map opens it), else the layer's
// own file.
std::string HostFile(const formats::ImageInfo& info) {
  return info.data_file.empty() ? info.path : info.data_file_path;
}

bool AllZeroKinds(const ExtentList& extents) {
  return std::all_of(extents.begin(), extents.end(), [](const Extent& e) { return e.kind != ExtentKind::kData; });
}

constexpr uint64_t kCompareChunk = 4 << 20;

}  // namespace

MapEntry ToMapEntry(const formats::MappedExtent& e, const std::vector<const formats::Image*>& chain) {
  const int bottom = static_cast<int>(chain.size()) - 1;
  MapEntry m;
  m.start = e.offset;
  m.length = e.length;
  // A layer of the chain (the text table names chain[depth]'s file).
  m.depth = e.depth < 0 ? bottom : std::clamp(e.depth, 0, bottom);
  const formats::ImageInfo& layer = chain[m.depth]->info();
  const bool raw_layer = layer.format == formats::ImageFormat::kRaw;
  m.present = e.kind != ExtentKind::kHole || raw_layer;
  m.zero = e.kind != ExtentKind::kData;
  m.data = e.kind == ExtentKind::kData;
  m.compressed = e.compressed;
  m.offset = e.host_offset;
  if (raw_layer && !m.offset) m.offset = e.offset;
  if (m.offset) m.file = HostFile(layer);
  return m;
}

void AppendMerged(std::vector<MapEntry>& map, const MapEntry& e) {
  if (!map.empty()) {
    MapEntry& last = map.back();
    const bool contiguous_host =
        (!last.offset && !e.offset) || (last.offset && e.offset && *last.offset + last.length == *e.offset);
    if (last.depth == e.depth && last.present == e.present && last.zero == e.zero && last.data == e.data &&
        last.compressed == e.compressed && last.file == e.file && contiguous_host &&
        last.start + last.length == e.start) {
      last.length += e.length;
      return;
    }
  }
  map.push_back(e);
}

Result<std::vector<MapEntry>> MapImage(formats::Image& image) {
  const std::vector<const formats::Image*> chain = BackingChain(image);
  const uint64_t size = image.size_bytes();
  const uint64_t window = std::max<uint64_t>(1ull << 30, ((size >> 12) + (1ull << 30) - 1) & ~((1ull << 30) - 1));
  std::vector<MapEntry> all;
  for (uint64_t off = 0; off < size; off += window) {
    BARGE_ASSIGN_OR_RETURN(std::vector<formats::MappedExtent> part, image.Map(off, std::min(window, size - off)));
    for (const formats::MappedExtent& mapped : part) AppendMerged(all, ToMapEntry(mapped, chain));
  }
  return all;
}

Result<std::optional<uint64_t>> FirstDifference(BlockSource& a, BlockSource& b, uint64_t offset,
                                                uint64_t length) {
  AlignedBuffer ba(kCompareChunk), bb(kCompareChunk);
  for (uint64_t off = offset; off < offset + length; off += kCompareChunk) {
    const uint64_t n = std::min(kCompareChunk, offset + length - off);
    BARGE_ASSIGN_OR_RETURN(ExtentList ea, a.Extents(off, n));
    BARGE_ASSIGN_OR_RETURN(ExtentList eb, b.Extents(off, n));
    if (AllZeroKinds(ea) && AllZeroKinds(eb)) continue;
    ba.resize(n);
    bb.resize(n);
    BARGE_RETURN_IF_ERROR(a.ReadAt(off, ba.span()));
    BARGE_RETURN_IF_ERROR(b.ReadAt(off, bb.span()));
    if (std::memcmp(ba.data(), bb.data(), n) != 0) {
      for (uint64_t i = 0; i < n; ++i) {
        if (ba.data()[i] != bb.data()[i]) return std::optional<uint64_t>(off + i);
      }
    }
  }
  return std::optional<uint64_t>();
}

Result<std::optional<uint64_t>> FirstNonZero(BlockSource& source, uint64_t offset, uint64_t end) {
  AlignedBuffer buf(kCompareChunk);
  for (uint64_t off = offset; off < end; off += kCompareChunk) {
    const uint64_t n = std::min(kCompareChunk, end - off);
    BARGE_ASSIGN_OR_RETURN(ExtentList e, source.Extents(off, n));
    if (AllZeroKinds(e)) continue;
    buf.resize(n);
    BARGE_RETURN_IF_ERROR(source.ReadAt(off, buf.span()));
    for (uint64_t i = 0; i < n; ++i) {
      if (buf.data()[i] != std::byte{0}) return std::optional<uint64_t>(off + i);
    }
  }
  return std::optional<uint64_t>();
}

Result<ImageComparison> CompareImages(BlockSource& a, BlockSource& b, bool strict_size) {
  ImageComparison c;
  c.a_size = a.size_bytes();
  c.b_size = b.size_bytes();
  if (strict_size && c.sizes_differ()) return c;
  BARGE_ASSIGN_OR_RETURN(c.first_difference, FirstDifference(a, b, 0, std::min(c.a_size, c.b_size)));
  if (!c.first_difference && c.sizes_differ()) {
    // The larger image's tail must read as zeros, as qemu-img compare says.
    BlockSource& bigger = c.a_size > c.b_size ? a : b;
    BARGE_ASSIGN_OR_RETURN(c.first_difference,
                           FirstNonZero(bigger, std::min(c.a_size, c.b_size), std::max(c.a_size, c.b_size)));
  }
  c.identical = !c.first_difference;
  return c;
}

}  // namespace barge::pipeline
