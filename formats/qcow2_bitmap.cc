// qcow2 persistent bitmaps: directory validation (qemu's limits) and the
// conversion of one bitmap's table and data clusters into guest byte ranges.
#include "formats/qcow2_bitmap.h"

#include <algorithm>
#include <set>

#include "formats/qcow2_image.h"

namespace barge::formats::qcow2 {

namespace {

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 bitmap directory: " + what).set_offset(offset);
}

// Table entries a bitmap of this granularity needs for the disk.
uint64_t NeededTableEntries(uint64_t size, uint32_t granularity_bits, uint32_t cluster_bits) {
  uint64_t bits = (size >> granularity_bits) + ((size & ((uint64_t{1} << granularity_bits) - 1)) != 0);
  uint64_t bytes = bits / 8 + (bits % 8 != 0);
  return SizeToClusters(bytes, cluster_bits);
}

}  // namespace

Result<std::vector<BitmapEntry>> ReadBitmapDirectory(BlockSource& file, const Header& h) {
  std::vector<BitmapEntry> out;
  if (!h.bitmaps_valid()) return out;
  const uint64_t file_size = file.size_bytes();
  // The header parser bounded directory_size (<= 64 MiB) and the count.
  if (h.bitmap_directory_offset > file_size ||
      h.bitmap_directory_size > file_size - h.bitmap_directory_offset) {
    return Bad("directory lies beyond the end of the file", h.bitmap_directory_offset);
  }
  std::vector<std::byte> dir(h.bitmap_directory_size);
  BARGE_RETURN_IF_ERROR(file.ReadAt(h.bitmap_directory_offset, dir));
  std::set<std::string> names;
  uint64_t pos = 0;
  for (uint32_t i = 0; i < h.nb_bitmaps; ++i) {
    const uint64_t at = h.bitmap_directory_offset + pos;
    if (dir.size() - pos < kBitmapDirEntryFixedBytes) return Bad("entry " + std::to_string(i) + " truncated", at);
    const std::byte* p = dir.data() + pos;
    BitmapEntry e;
    e.entry_offset = at;
    e.info.table_offset = LoadBe64(p);
    e.info.table_size = LoadBe32(p + 8);
    e.info.flags = LoadBe32(p + 12);
    const uint8_t type = static_cast<uint8_t>(p[16]);
    e.granularity_bits = static_cast<uint8_t>(p[17]);
    const uint16_t name_size = LoadBe16(p + 18);
    const uint32_t extra_size = LoadBe32(p + 20);
    const std::string label = "entry " + std::to_string(i);
    if (type != kBitmapTypeDirtyTracking) return Bad(label + ": type must be 1", at + 16);
    if (e.granularity_bits < 9 || e.granularity_bits > 31) return Bad(label + ": granularity_bits outside 9..31", at + 17);
    if (extra_size != 0) return Bad(label + ": extra data is not supported", at + 20);
    if (e.info.flags & ~(kBitmapInUse | kBitmapAuto)) return Bad(label + ": reserved flags set", at + 12);
    if (name_size == 0 || name_size > kMaxBitmapNameBytes) return Bad(label + ": name_size outside 1..1023", at + 18);
    const uint64_t entry_bytes = (kBitmapDirEntryFixedBytes + uint64_t{name_size} + 7) & ~uint64_t{7};
    if (dir.size() - pos < entry_bytes) return Bad(label + ": runs past directory_size", at);
    e.info.name.assign(reinterpret_cast<const char*>(p + kBitmapDirEntryFixedBytes), name_size);
    if (e.info.name.find('\0') != std::string::npos) return Bad(label + ": name contains NUL", at + 24);
    if (!names.insert(e.info.name).second) return Bad(label + ": duplicate name '" + e.info.name + "'", at + 24);
    if (!IsClusterAligned(e.info.table_offset, h.cluster_bits) || e.info.table_offset == 0 ||
        (e.info.table_offset & ~kBitmapTableOffsetMask) != 0) {
      return Bad(label + ": bitmap_table_offset is not a cluster-aligned offset", at);
    }
    if (e.info.table_size != NeededTableEntries(h.size, e.granularity_bits, h.cluster_bits)) {
      return Bad(label + ": bitmap_table_size " + std::to_string(e.info.table_size) +
                     " does not match the virtual size and granularity", at + 8);
    }
    if (e.info.table_offset > file_size || uint64_t{e.info.table_size} * 8 > file_size - e.info.table_offset) {
      return Bad(label + ": bitmap table lies beyond the end of the file", at);
    }
    e.info.granularity_bytes = uint32_t{1} << e.granularity_bits;
    e.info.in_use = e.info.flags & kBitmapInUse;
    e.info.enabled = e.info.flags & kBitmapAuto;
    out.push_back(std::move(e));
    pos += entry_bytes;
  }
  if (pos != dir.size()) return Bad("directory_size does not match the entries", h.bitmap_directory_offset);
  return out;
}

}  // namespace barge::formats::qcow2

namespace barge::formats {

using namespace qcow2;

namespace {

// 16 bytes each: 256 MiB. A 1 TiB disk tracked at 64 KiB has 16M granules,
// so only a pathological (or crafted) bitmap has more separate ranges.
constexpr size_t kMaxDirtyRanges = size_t{1} << 24;

}  // namespace

Result<RangeList> ReadBitmapDirtyRanges(const Image& image, std::string_view bitmap_name) {
  const Qcow2Image* q = AsQcow2(image);
  if (!q) return Error::NotSupported("persistent bitmaps exist only in qcow2 images").set_path(image.info().path);
  const Header& h = q->header();
  BlockSource& file = q->file();
  BARGE_ASSIGN_OR_RETURN(std::vector<BitmapEntry> entries, ReadBitmapDirectory(file, h));
  auto it = std::find_if(entries.begin(), entries.end(),
                         [&](const BitmapEntry& e) { return e.info.name == bitmap_name; });
  if (it == entries.end()) {
    return Error::NotFound("no bitmap named '" + std::string(bitmap_name) + "'").set_path(image.info().path);
  }
  const BitmapEntry& e = *it;
  if (e.info.in_use) {
    return Error::Corruption("bitmap '" + e.info.name +
                             "' is in use (not saved cleanly, e.g. after a crash); its contents "
                             "cannot be trusted")
        .set_path(image.info().path)
        .set_offset(e.entry_offset);
  }
  std::vector<std::byte> table(uint64_t{e.info.table_size} * 8);
  BARGE_RETURN_IF_ERROR(file.ReadAt(e.info.table_offset, table));
  const uint64_t cs = h.cluster_size();
  const uint64_t bits_per_cluster = cs * 8;
  const uint32_t gbits = e.granularity_bits;
  RangeList ranges;
  const uint64_t total_bits = (h.size >> gbits) + ((h.size & ((uint64_t{1} << gbits) - 1)) != 0);
  // Bits past the disk's end are ignored; shifts stay below the size.
  auto add_bits = [&](uint64_t first_bit, uint64_t count) {
    if (first_bit >= total_bits) return;
    count = std::min(count, total_bits - first_bit);
    const uint64_t start = first_bit << gbits;
    const uint64_t end = first_bit + count == total_bits ? h.size : (first_bit + count) << gbits;
    if (!ranges.empty() && ranges.back().end() == start) {
      ranges.back().length = end - ranges.back().offset;
    } else {
      ranges.push_back({start, end - start});
    }
  };
  auto too_fragmented = [&]() {
    return Error::NotSupported("bitmap '" + e.info.name + "' has more than " + std::to_string(kMaxDirtyRanges) +
                               " separate dirty ranges; take a full backup instead")
        .set_path(image.info().path);
  };
  std::vector<std::byte> data(cs);
  // Each data cluster belongs to one table entry (its refcount is 1). A
  // crafted table that names one cluster of alternating bits in every
  // entry turned a 400 KB file into billions of ranges; the file now has to
  // hold every bit it sets.
  std::set<uint64_t> data_clusters;
  for (uint64_t i = 0; i < e.info.table_size; ++i) {
    const uint64_t entry_at = e.info.table_offset + 8 * i;
    const uint64_t entry = LoadBe64(table.data() + 8 * i);
    if (entry & kBitmapTableReservedMask) {
      return Error::Corruption("bitmap table entry has reserved bits set").set_path(image.info().path).set_offset(entry_at);
    }
    const uint64_t data_offset = entry & kBitmapTableOffsetMask;
    const uint64_t first_bit = i * bits_per_cluster;
    if (ranges.size() > kMaxDirtyRanges) return too_fragmented();
    if (data_offset == 0) {
      if (entry & 1) add_bits(first_bit, bits_per_cluster);
      continue;
    }
    if (!IsClusterAligned(data_offset, h.cluster_bits) || data_offset > file.size_bytes() ||
        cs > file.size_bytes() - data_offset) {
      return Error::Corruption("bitmap data cluster offset is misaligned or beyond the end of the file")
          .set_path(image.info().path)
          .set_offset(entry_at);
    }
    if (!data_clusters.insert(data_offset).second) {
      return Error::Corruption("bitmap '" + e.info.name + "' names data cluster " + std::to_string(data_offset) +
                               " in more than one table entry")
          .set_path(image.info().path)
          .set_offset(entry_at);
    }
    BARGE_RETURN_IF_ERROR(file.ReadAt(data_offset, data));
    for (uint64_t byte = 0; byte < cs; ++byte) {
      const uint8_t b = static_cast<uint8_t>(data[byte]);
      if (b == 0) continue;
      if (b == 0xff) {
        add_bits(first_bit + byte * 8, 8);
        continue;
      }
      for (uint32_t bit = 0; bit < 8; ++bit) {
        if ((b >> bit) & 1) add_bits(first_bit + byte * 8 + bit, 1);
      }
    }
  }
  if (ranges.size() > kMaxDirtyRanges) return too_fragmented();
  return NormalizeRanges(std::move(ranges));
}

}  // namespace barge::formats
