// qcow2 header and header-extension parsing. Every value comes from an
// untrusted file, so each one is range-checked before anything uses it.
#include "formats/qcow2_header.h"

#include <algorithm>
#include <vector>

#include "formats/units.h"

namespace barge::formats::qcow2 {

namespace {

constexpr uint32_t kMaxBackingFormatBytes = 15;  // qemu's buffer is 16 with NUL
constexpr uint32_t kMaxDataFileNameBytes = 4095;
constexpr uint32_t kMaxSnapshots = 65536;

Error Bad(std::string field, uint64_t offset, std::string why) {
  return Error::Corruption("qcow2 header: " + field + ": " + why).set_offset(offset);
}

bool HasNul(std::string_view s) { return s.find('\0') != std::string_view::npos; }

// Parses the extension records in [start, end) of cluster 0.
Status ParseExtensions(std::span<const std::byte> c0, uint64_t start, uint64_t end, Header& h) {
  std::vector<uint32_t> seen;
  uint64_t off = start;
  while (off < end) {
    if (end - off < 8) break;  // no room for another record: qemu stops here too
    uint32_t type = LoadBe32(c0.data() + off);
    uint32_t len = LoadBe32(c0.data() + off + 4);
    uint64_t data_off = off + 8;
    if (type == kExtEnd) {
      h.extensions_end = data_off;
      return OkStatus();
    }
    if (len > end - data_off) {
      return Bad("header extension " + Hex(type), off,
                 "length " + std::to_string(len) + " runs past the extension area");
    }
    if (std::find(seen.begin(), seen.end(), type) != seen.end()) {
      return Bad("header extension " + Hex(type), off, "appears twice");
    }
    seen.push_back(type);
    const char* data = reinterpret_cast<const char*>(c0.data() + data_off);
    switch (type) {
      case kExtBackingFormat:
        if (len > kMaxBackingFormatBytes) return Bad("backing format extension", off, "too long");
        h.backing_format.assign(data, len);
        if (HasNul(h.backing_format)) return Bad("backing format extension", off, "contains NUL");
        break;
      case kExtDataFile:
        if (len > kMaxDataFileNameBytes) return Bad("data file extension", off, "name too long");
        h.data_file.assign(data, len);
        if (HasNul(h.data_file)) return Bad("data file extension", off, "name contains NUL");
        break;
      case kExtBitmaps: {
        if (len != 24) return Bad("bitmaps extension", off, "length must be 24");
        const std::byte* p = c0.data() + data_off;
        h.has_bitmaps_extension = true;
        h.nb_bitmaps = LoadBe32(p);
        uint32_t reserved = LoadBe32(p + 4);
        h.bitmap_directory_size = LoadBe64(p + 8);
        h.bitmap_directory_offset = LoadBe64(p + 16);
        if (!(h.autoclear_features & kAutoclearBitmaps)) break;  // ignored, as qemu does
        if (reserved != 0) return Bad("bitmaps extension reserved", off + 12, "must be zero");
        if (h.nb_bitmaps == 0 || h.nb_bitmaps > kMaxBitmaps) {
          return Bad("bitmaps extension nb_bitmaps", off + 8, "must be 1.." + std::to_string(kMaxBitmaps));
        }
        if (h.bitmap_directory_size == 0 || h.bitmap_directory_size > kMaxBitmapDirectoryBytes) {
          return Bad("bitmaps extension directory_size", off + 16, "must be 1..64 MiB");
        }
        if (!IsClusterAligned(h.bitmap_directory_offset, h.cluster_bits) ||
            h.bitmap_directory_offset == 0) {
          return Bad("bitmaps extension directory_offset", off + 24,
                     Hex(h.bitmap_directory_offset) + " is not a non-zero cluster-aligned offset");
        }
        break;
      }
      case kExtCrypto:
        // Only LUKS images carry it, and crypt_method != 0 was refused already.
        return Bad("crypto extension", off, "present without encryption");
      default:
        break;  // feature name table and unknown extensions are ignored
    }
    off = data_off + ((uint64_t{len} + 7) & ~uint64_t{7});
  }
  h.extensions_end = std::min(off, end);
  return OkStatus();
}

}  // namespace

Result<Header> ParseHeader(std::span<const std::byte> c0, uint64_t file_size) {
  if (c0.size() < kV2HeaderLength) {
    return Bad("header", 0, "file too small (" + std::to_string(c0.size()) + " bytes)");
  }
  const std::byte* p = c0.data();
  if (LoadBe32(p) != kMagic) return Bad("magic", 0, "not a qcow2 image");
  Header h;
  h.version = LoadBe32(p + 4);
  if (h.version != 2 && h.version != 3) {
    return Error::NotSupported("qcow2 version " + std::to_string(h.version) + " is not supported")
        .set_offset(4);
  }
  h.backing_file_offset = LoadBe64(p + 8);
  h.backing_file_size = LoadBe32(p + 16);
  h.cluster_bits = LoadBe32(p + 20);
  if (h.cluster_bits < kMinClusterBits || h.cluster_bits > kMaxClusterBits) {
    return Bad("cluster_bits", 20, std::to_string(h.cluster_bits) + " is outside 9..21");
  }
  const uint64_t cs = h.cluster_size();
  h.size = LoadBe64(p + 24) & ~uint64_t{kSectorBytes - 1};
  h.crypt_method = LoadBe32(p + 32);
  h.l1_size = LoadBe32(p + 36);
  h.l1_table_offset = LoadBe64(p + 40);
  h.refcount_table_offset = LoadBe64(p + 48);
  h.refcount_table_clusters = LoadBe32(p + 56);
  h.nb_snapshots = LoadBe32(p + 60);
  h.snapshots_offset = LoadBe64(p + 64);

  if (h.version == 2) {
    h.header_length = kV2HeaderLength;
    h.refcount_order = 4;
  } else {
    if (c0.size() < kV3HeaderLength) return Bad("header", 0, "file too small for a v3 header");
    h.incompatible_features = LoadBe64(p + 72);
    h.compatible_features = LoadBe64(p + 80);
    h.autoclear_features = LoadBe64(p + 88);
    h.refcount_order = LoadBe32(p + 96);
    h.header_length = LoadBe32(p + 100);
    if (h.header_length < kV3HeaderLength || h.header_length % 8 != 0) {
      return Bad("header_length", 100, std::to_string(h.header_length) +
                                           " must be >= 104 and a multiple of 8");
    }
    if (h.header_length > cs || h.header_length > c0.size()) {
      return Bad("header_length", 100, "runs past cluster 0 or the end of the file");
    }
    if (h.header_length > kV3HeaderLength) h.compression_type = static_cast<uint8_t>(p[104]);
  }

  if (h.crypt_method != 0) {
    return Error::NotSupported("encrypted qcow2 images (crypt_method " +
                               std::to_string(h.crypt_method) + ") are not supported")
        .set_offset(32);
  }
  if (uint64_t unknown = h.incompatible_features & ~kIncompatKnown) {
    return Error::NotSupported("qcow2 image uses unknown incompatible feature bits " + Hex(unknown))
        .set_offset(72);
  }
  if (h.compression_type != kCompressionDeflate && h.compression_type != kCompressionZstd) {
    return Error::NotSupported("unknown qcow2 compression type " +
                               std::to_string(h.compression_type))
        .set_offset(104);
  }
  if ((h.compression_type != 0) != bool(h.incompatible_features & kIncompatCompression)) {
    return Bad("compression_type", 104, "must be non-zero exactly when incompatible bit 3 is set");
  }
  if (h.refcount_order > kMaxRefcountOrder) {
    return Bad("refcount_order", 96, std::to_string(h.refcount_order) + " is outside 0..6");
  }
  if (h.extended_l2() && h.cluster_bits < 14) {
    return Bad("cluster_bits", 20, "extended L2 needs clusters of at least 16 KiB");
  }
  if (h.data_file_raw() && !h.has_data_file()) {
    return Bad("autoclear_features", 88, "data-file-raw set without an external data file");
  }

  // L1 table: bounded, inside the file, and big enough for the disk.
  if (uint64_t{h.l1_size} * 8 > kMaxL1Bytes) {
    return Bad("l1_size", 36, std::to_string(h.l1_size) + " entries exceed the 32 MiB limit");
  }
  const uint64_t l2_covers = h.l2_entries() << h.cluster_bits;
  const uint64_t l1_needed = h.size / l2_covers + (h.size % l2_covers != 0);
  if (l1_needed > h.l1_size) {
    return Bad("l1_size", 36, "L1 table is too small for virtual size " + std::to_string(h.size));
  }
  if (h.l1_size > 0) {
    if (!IsClusterAligned(h.l1_table_offset, h.cluster_bits) || h.l1_table_offset == 0) {
      return Bad("l1_table_offset", 40, Hex(h.l1_table_offset) + " is not cluster aligned");
    }
    if (h.l1_table_offset > file_size || uint64_t{h.l1_size} * 8 > file_size - h.l1_table_offset) {
      return Bad("l1_table_offset", 40, "L1 table at " + Hex(h.l1_table_offset) +
                                            " runs past the end of the file");
    }
  }
  // Refcount table: the reader never needs it, the checker reads it.
  if (!IsClusterAligned(h.refcount_table_offset, h.cluster_bits) || h.refcount_table_offset == 0) {
    return Bad("refcount_table_offset", 48, Hex(h.refcount_table_offset) +
                                                " is not a non-zero cluster-aligned offset");
  }
  if (h.refcount_table_bytes() > kMaxRefcountTableBytes) {
    return Bad("refcount_table_clusters", 56, "refcount table exceeds the 8 MiB limit");
  }
  if (h.nb_snapshots > kMaxSnapshots) {
    return Bad("nb_snapshots", 60, std::to_string(h.nb_snapshots) + " exceeds 65536");
  }
  if (h.nb_snapshots > 0 && (!IsClusterAligned(h.snapshots_offset, h.cluster_bits) ||
                             h.snapshots_offset == 0 || h.snapshots_offset >= file_size)) {
    return Bad("snapshots_offset", 64, Hex(h.snapshots_offset) + " is not a valid table offset");
  }

  // Extensions run to the backing name, else to the end of cluster 0.
  const uint64_t area_end_limit = std::min<uint64_t>(cs, c0.size());
  uint64_t ext_end = area_end_limit;
  if (h.backing_file_offset != 0) {
    if (h.backing_file_size > kMaxBackingFileNameBytes) {
      return Bad("backing_file_size", 16, std::to_string(h.backing_file_size) + " exceeds 1023");
    }
    if (h.backing_file_offset > cs ||
        h.backing_file_offset + h.backing_file_size > area_end_limit) {
      return Bad("backing_file_offset", 8, "backing file name lies outside cluster 0");
    }
    if (h.backing_file_offset < h.header_length) {
      return Bad("backing_file_offset", 8, "backing file name overlaps the header");
    }
    ext_end = h.backing_file_offset;
  }
  BARGE_RETURN_IF_ERROR(ParseExtensions(c0, h.header_length, ext_end, h));
  if (h.backing_file_offset != 0) {
    h.backing_file.assign(reinterpret_cast<const char*>(c0.data() + h.backing_file_offset),
                          h.backing_file_size);
    if (h.backing_file.empty() || HasNul(h.backing_file)) {
      return Bad("backing file name", h.backing_file_offset, "empty or contains NUL");
    }
  }
  if (h.has_data_file() && h.data_file.empty()) {
    return Bad("incompatible_features", 72,
               "external data file flag set but no data-file extension names it");
  }
  if (!h.has_data_file()) h.data_file.clear();
  if (h.data_file_raw() && !h.backing_file.empty()) {
    return Bad("autoclear_features", 88, "data-file-raw cannot be used with a backing file");
  }
  return h;
}

Result<Header> ReadHeader(BlockSource& file) {
  const uint64_t file_size = file.size_bytes();
  // Read the fixed part first: cluster_bits says how much of cluster 0 to read.
  std::vector<std::byte> head(std::min<uint64_t>(file_size, kV3HeaderLengthWithCompression));
  BARGE_RETURN_IF_ERROR(file.ReadAt(0, head));
  if (head.size() < kV2HeaderLength) return ParseHeader(head, file_size);
  uint32_t cluster_bits = LoadBe32(head.data() + 20);
  if (cluster_bits < kMinClusterBits || cluster_bits > kMaxClusterBits) {
    return ParseHeader(head, file_size);  // reports the bad field
  }
  std::vector<std::byte> c0(std::min<uint64_t>(file_size, ClusterSize(cluster_bits)));
  BARGE_RETURN_IF_ERROR(file.ReadAt(0, c0));
  return ParseHeader(c0, file_size);
}

}  // namespace barge::formats::qcow2
