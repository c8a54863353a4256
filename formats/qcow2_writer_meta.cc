// Header, header extensions and persistent bitmaps for the one-pass qcow2
// writer (QCOW2.md §1, §6, §7).
#include "formats/qcow2_writer_meta.h"

#include <algorithm>
#include <set>
#include <string>

#include "formats/qcow2_format.h"

namespace barge::formats::qcow2 {
namespace {

// qemu's limits for one bitmap's table (block/qcow2-bitmap.c).
constexpr uint64_t kMaxBitmapTableEntries = 0x8000000;
constexpr uint32_t kMinGranularityBits = 9;
constexpr uint32_t kMaxGranularityBits = 31;

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

void AppendExtension(std::vector<std::byte>& out, uint32_t type, std::span<const std::byte> data) {
  size_t at = out.size();
  out.resize(at + 8 + Align8(data.size()));
  StoreBe32(out.data() + at, type);
  StoreBe32(out.data() + at + 4, static_cast<uint32_t>(data.size()));
  std::copy(data.begin(), data.end(), out.begin() + at + 8);
}

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

uint32_t Log2(uint64_t power_of_two) {
  uint32_t bits = 0;
  while ((uint64_t{1} << bits) < power_of_two) ++bits;
  return bits;
}

// Sets bits [from, to) of a little-endian-bit-order bitmap chunk.
void SetBits(std::byte* chunk, uint64_t from, uint64_t to) {
  while (from < to && from % 8 != 0) {
    chunk[from / 8] |= std::byte(1u << (from % 8));
    ++from;
  }
  if (to - from >= 8) {
    uint64_t whole = (to - from) / 8;
    std::fill(chunk + from / 8, chunk + from / 8 + whole, std::byte{0xff});
    from += whole * 8;
  }
  for (; from < to; ++from) chunk[from / 8] |= std::byte(1u << (from % 8));
}

// Writes one bitmap's data clusters and table; returns the table offset.
Result<uint64_t> WriteOneBitmap(HostFile& host, const BitmapSpec& spec, uint64_t virtual_size,
                                uint64_t table_entries) {
  uint64_t cs = host.cluster_size();
  uint64_t gran = spec.granularity_bytes;
  uint64_t total_bits = DivRoundUp(virtual_size, gran);
  uint64_t bits_per_chunk = cs * 8;
  std::vector<uint64_t> table(table_entries, 0);
  std::vector<std::byte> chunk(cs);
  uint64_t current = UINT64_MAX;  // chunk index held in `chunk`

  auto flush = [&]() -> Status {
    if (current == UINT64_MAX) return OkStatus();
    BARGE_ASSIGN_OR_RETURN(uint64_t offset, host.AppendClusters(chunk, "bitmap data"));
    table[current] = offset;
    std::fill(chunk.begin(), chunk.end(), std::byte{0});
    current = UINT64_MAX;
    return OkStatus();
  };

  for (const Range& r : NormalizeRanges(spec.dirty)) {
    uint64_t end = std::min(r.end(), virtual_size);
    if (r.offset >= end) continue;
    uint64_t bit = r.offset / gran;
    uint64_t bit_end = std::min(DivRoundUp(end, gran), total_bits);
    while (bit < bit_end) {
      uint64_t index = bit / bits_per_chunk;
      if (index != current) {
        BARGE_RETURN_IF_ERROR(flush());
        current = index;
      }
      uint64_t chunk_end = std::min(bit_end, (index + 1) * bits_per_chunk);
      SetBits(chunk.data(), bit - index * bits_per_chunk, chunk_end - index * bits_per_chunk);
      bit = chunk_end;
    }
  }
  BARGE_RETURN_IF_ERROR(flush());

  std::vector<std::byte> table_bytes(table_entries * 8);
  for (uint64_t i = 0; i < table_entries; ++i) StoreBe64(table_bytes.data() + i * 8, table[i]);
  return host.AppendClusters(table_bytes, "a bitmap table");
}

}  // namespace

Result<std::vector<std::byte>> EncodeHeader(const HeaderFields& f) {
  std::vector<std::byte> out(kV3HeaderLengthWithCompression);
  std::byte* h = out.data();
  StoreBe32(h + 0, kMagic);
  StoreBe32(h + 4, 3);
  StoreBe32(h + 20, f.cluster_bits);
  StoreBe64(h + 24, f.virtual_size);
  StoreBe32(h + 32, 0);  // no encryption
  StoreBe32(h + 36, f.l1_size);
  StoreBe64(h + 40, f.l1_table_offset);
  StoreBe64(h + 48, f.refcount_table_offset);
  StoreBe32(h + 56, f.refcount_table_clusters);
  StoreBe64(h + 72, f.incompatible_features);
  StoreBe64(h + 80, 0);  // compatible features
  StoreBe64(h + 88, f.autoclear_features);
  StoreBe32(h + 96, f.refcount_order);
  StoreBe32(h + 100, kV3HeaderLengthWithCompression);
  h[104] = std::byte(f.compression_type);

  // qemu writes the backing format or data file first.
  if (!f.backing_format.empty()) AppendExtension(out, kExtBackingFormat, AsBytes(f.backing_format));
  if (!f.data_file.empty()) AppendExtension(out, kExtDataFile, AsBytes(f.data_file));
  if (f.bitmap_count > 0) {
    std::byte ext[24] = {};
    StoreBe32(ext, f.bitmap_count);
    StoreBe64(ext + 8, f.bitmap_directory_size);
    StoreBe64(ext + 16, f.bitmap_directory_offset);
    AppendExtension(out, kExtBitmaps, ext);
  }
  out.resize(out.size() + 8);  // end marker
  // The name goes after the end marker: qemu stops parsing extensions at
  // backing_file_offset.
  if (!f.backing_file.empty()) {
    StoreBe64(out.data() + 8, out.size());
    StoreBe32(out.data() + 16, static_cast<uint32_t>(f.backing_file.size()));
    auto name = AsBytes(f.backing_file);
    out.insert(out.end(), name.begin(), name.end());
  }
  if (out.size() > ClusterSize(f.cluster_bits)) {
    return Error::InvalidArgument("qcow2 writer: header, extensions and backing file name need " +
                                  std::to_string(out.size()) + " bytes, more than one " +
                                  std::to_string(ClusterSize(f.cluster_bits)) + "-byte cluster");
  }
  return out;
}

uint64_t BitmapTableEntries(uint64_t virtual_size, uint64_t granularity_bytes,
                            uint32_t cluster_bits) {
  uint64_t bits = DivRoundUp(virtual_size, granularity_bytes);
  return DivRoundUp(DivRoundUp(bits, 8), ClusterSize(cluster_bits));
}

Status ValidateBitmaps(const std::vector<BitmapSpec>& bitmaps, uint64_t virtual_size,
                       uint32_t cluster_bits) {
  if (bitmaps.size() > kMaxBitmaps) {
    return Error::InvalidArgument("qcow2 writer: more than " + std::to_string(kMaxBitmaps) +
                                  " bitmaps");
  }
  if (!bitmaps.empty() && virtual_size == 0) {
    return Error::InvalidArgument("qcow2 writer: bitmaps need a non-empty disk");
  }
  std::set<std::string_view> names;
  uint64_t directory_bytes = 0;
  for (const BitmapSpec& b : bitmaps) {
    if (b.name.empty() || b.name.size() > kMaxBitmapNameBytes) {
      return Error::InvalidArgument("qcow2 writer: bitmap name must be 1.." +
                                    std::to_string(kMaxBitmapNameBytes) + " bytes");
    }
    if (!names.insert(b.name).second) {
      return Error::InvalidArgument("qcow2 writer: duplicate bitmap name '" + b.name + "'");
    }
    uint64_t g = b.granularity_bytes;
    if (g == 0 || (g & (g - 1)) != 0 || Log2(g) < kMinGranularityBits ||
        Log2(g) > kMaxGranularityBits) {
      return Error::InvalidArgument("qcow2 writer: bitmap '" + b.name + "' granularity " +
                                    std::to_string(g) + " is not a power of two from 512 to 2^31");
    }
    if (BitmapTableEntries(virtual_size, g, cluster_bits) > kMaxBitmapTableEntries) {
      return Error::InvalidArgument("qcow2 writer: bitmap '" + b.name +
                                    "' is too large; use a coarser granularity");
    }
    directory_bytes += Align8(kBitmapDirEntryFixedBytes + b.name.size());
  }
  if (directory_bytes > kMaxBitmapDirectoryBytes) {
    return Error::InvalidArgument("qcow2 writer: bitmap directory larger than 64 MiB");
  }
  return OkStatus();
}

Result<BitmapDirectory> WriteBitmaps(HostFile& host, const std::vector<BitmapSpec>& bitmaps,
                                     uint64_t virtual_size) {
  BitmapDirectory dir;
  if (bitmaps.empty()) return dir;
  std::vector<std::byte> entries;
  for (const BitmapSpec& b : bitmaps) {
    uint64_t table_entries = BitmapTableEntries(virtual_size, b.granularity_bytes, host.cluster_bits());
    BARGE_ASSIGN_OR_RETURN(uint64_t table_offset,
                           WriteOneBitmap(host, b, virtual_size, table_entries));
    size_t at = entries.size();
    entries.resize(at + Align8(kBitmapDirEntryFixedBytes + b.name.size()));
    std::byte* e = entries.data() + at;
    StoreBe64(e + 0, table_offset);
    StoreBe32(e + 8, static_cast<uint32_t>(table_entries));
    StoreBe32(e + 12, b.enabled ? kBitmapAuto : 0);  // in_use stays clear
    e[16] = std::byte(kBitmapTypeDirtyTracking);
    e[17] = std::byte(Log2(b.granularity_bytes));
    StoreBe16(e + 18, static_cast<uint16_t>(b.name.size()));
    StoreBe32(e + 20, 0);  // no extra data
    auto name = AsBytes(b.name);
    std::copy(name.begin(), name.end(), e + kBitmapDirEntryFixedBytes);
  }
  BARGE_ASSIGN_OR_RETURN(dir.offset, host.AppendClusters(entries, "the bitmap directory"));
  dir.count = static_cast<uint32_t>(bitmaps.size());
  dir.size_bytes = entries.size();
  return dir;
}

}  // namespace barge::formats::qcow2
