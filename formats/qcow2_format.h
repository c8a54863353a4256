// qcow2 on-disk constants, big-endian helpers and unit conversions shared by
// the reader, writer and checker. The byte layout is in docs/formats/qcow2.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "blockio/error.h"
#include "formats/sector.h"

namespace barge::formats::qcow2 {

inline constexpr uint32_t kMagic = 0x514649fb;  // "QFI\xfb"
inline constexpr uint32_t kMinClusterBits = 9;
inline constexpr uint32_t kMaxClusterBits = 21;
inline constexpr uint32_t kDefaultClusterBits = 16;
inline constexpr uint32_t kMaxRefcountOrder = 6;
inline constexpr uint32_t kV2HeaderLength = 72;
inline constexpr uint32_t kV3HeaderLength = 104;
inline constexpr uint32_t kV3HeaderLengthWithCompression = 112;
inline constexpr uint32_t kMaxBackingFileNameBytes = 1023;
inline constexpr uint64_t kMaxL1Bytes = 32ull << 20;             // qemu's cap
inline constexpr uint64_t kMaxRefcountTableBytes = 8ull << 20;   // qemu's cap
inline constexpr uint64_t kMaxBitmapDirectoryBytes = 64ull << 20;
inline constexpr uint32_t kMaxBitmaps = 65535;
inline constexpr uint32_t kMaxBitmapNameBytes = 1023;

// Incompatible feature bits.
inline constexpr uint64_t kIncompatDirty = 1ull << 0;
inline constexpr uint64_t kIncompatCorrupt = 1ull << 1;
inline constexpr uint64_t kIncompatDataFile = 1ull << 2;
inline constexpr uint64_t kIncompatCompression = 1ull << 3;
inline constexpr uint64_t kIncompatExtendedL2 = 1ull << 4;
inline constexpr uint64_t kIncompatKnown = 0x1f;
// Compatible feature bits.
inline constexpr uint64_t kCompatLazyRefcounts = 1ull << 0;
// Autoclear feature bits.
inline constexpr uint64_t kAutoclearBitmaps = 1ull << 0;
inline constexpr uint64_t kAutoclearDataFileRaw = 1ull << 1;

// Header extension types.
inline constexpr uint32_t kExtEnd = 0;
inline constexpr uint32_t kExtBackingFormat = 0xe2792aca;
inline constexpr uint32_t kExtFeatureTable = 0x6803f857;
inline constexpr uint32_t kExtBitmaps = 0x23852875;
inline constexpr uint32_t kExtCrypto = 0x0537be77;
inline constexpr uint32_t kExtDataFile = 0x44415441;

// Header compression_type byte (offset 104).
inline constexpr uint8_t kCompressionDeflate = 0;
inline constexpr uint8_t kCompressionZstd = 1;

// L1/L2 entry fields.
inline constexpr uint64_t kOflagCopied = 1ull << 63;
inline constexpr uint64_t kOflagCompressed = 1ull << 62;
inline constexpr uint64_t kOflagZero = 1ull << 0;
inline constexpr uint64_t kL1OffsetMask = 0x00fffffffffffe00ull;
inline constexpr uint64_t kL1ReservedMask = 0x7f000000000001ffull;
inline constexpr uint64_t kL2OffsetMask = 0x00fffffffffffe00ull;
inline constexpr uint64_t kL2ReservedMask = 0x3f000000000001feull;
inline constexpr uint64_t kRefcountTableOffsetMask = 0xfffffffffffffe00ull;
inline constexpr uint64_t kBitmapTableOffsetMask = 0x00fffffffffffe00ull;
inline constexpr uint64_t kBitmapTableReservedMask = 0xff000000000001feull;

// Bitmap directory entry flags.
inline constexpr uint32_t kBitmapInUse = 1u << 0;
inline constexpr uint32_t kBitmapAuto = 1u << 1;
inline constexpr uint32_t kBitmapExtraDataCompatible = 1u << 2;
inline constexpr uint8_t kBitmapTypeDirtyTracking = 1;
inline constexpr uint32_t kBitmapDirEntryFixedBytes = 24;

// Snapshot table.
inline constexpr uint32_t kSnapshotFixedBytes = 40;

// Big-endian loads and stores on byte spans (no alignment assumed).
inline uint16_t LoadBe16(const std::byte* p) {
  return static_cast<uint16_t>((uint16_t(p[0]) << 8) | uint16_t(p[1]));
}
inline uint32_t LoadBe32(const std::byte* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
inline uint64_t LoadBe64(const std::byte* p) {
  return (uint64_t(LoadBe32(p)) << 32) | LoadBe32(p + 4);
}
inline void StoreBe16(std::byte* p, uint16_t v) {
  p[0] = std::byte(v >> 8);
  p[1] = std::byte(v);
}
inline void StoreBe32(std::byte* p, uint32_t v) {
  p[0] = std::byte(v >> 24);
  p[1] = std::byte(v >> 16);
  p[2] = std::byte(v >> 8);
  p[3] = std::byte(v);
}
inline void StoreBe64(std::byte* p, uint64_t v) {
  StoreBe32(p, uint32_t(v >> 32));
  StoreBe32(p + 4, uint32_t(v));
}

// Unit conversions (qemu's offset_into_cluster / size_to_clusters).
inline uint64_t ClusterSize(uint32_t cluster_bits) { return 1ull << cluster_bits; }
// The cluster_bits of a cluster size: a power of two from 512 to 2M
// (kMinClusterBits..kMaxClusterBits), else kInvalidArgument.
inline Result<uint32_t> ClusterBitsOf(uint64_t cluster_bytes) {
  for (uint32_t bits = kMinClusterBits; bits <= kMaxClusterBits; ++bits) {
    if (cluster_bytes == ClusterSize(bits)) return bits;
  }
  return Error::InvalidArgument("cluster size must be a power of two from 512 to 2M, not " +
                                std::to_string(cluster_bytes));
}
inline uint64_t OffsetIntoCluster(uint64_t offset_bytes, uint32_t cluster_bits) {
  return offset_bytes & (ClusterSize(cluster_bits) - 1);
}
inline uint64_t SizeToClusters(uint64_t size_bytes, uint32_t cluster_bits) {
  return (size_bytes + ClusterSize(cluster_bits) - 1) >> cluster_bits;
}
inline bool IsClusterAligned(uint64_t offset_bytes, uint32_t cluster_bits) {
  return OffsetIntoCluster(offset_bytes, cluster_bits) == 0;
}
// Entries per L2 table: cs/8, or cs/16 with extended L2.
inline uint64_t L2Entries(uint32_t cluster_bits, bool extended_l2) {
  return ClusterSize(cluster_bits) / (extended_l2 ? 16 : 8);
}
// L1 entries needed to map `virtual_size` bytes.
inline uint64_t L1EntriesFor(uint64_t virtual_size, uint32_t cluster_bits, bool extended_l2) {
  uint64_t l2_bytes_covered = L2Entries(cluster_bits, extended_l2) << cluster_bits;
  return (virtual_size + l2_bytes_covered - 1) / l2_bytes_covered;
}
// Refcount entries per refcount block.
inline uint64_t RefcountsPerBlock(uint32_t cluster_bits, uint32_t refcount_order) {
  return (ClusterSize(cluster_bits) * 8) >> refcount_order;
}
// Compressed descriptor: bit x = 70 - cluster_bits splits offset and sectors.
inline uint32_t CompressedOffsetBits(uint32_t cluster_bits) { return 70 - cluster_bits; }

// What an L2 entry makes of its guest cluster: qemu's QCow2ClusterType,
// decided as its qcow2_get_cluster_type does, so that the reader, map and
// check agree on it. With extended L2 the ZERO flag is not used (the
// subcluster bitmaps say what is zero), so only kCompressed, kNormal and
// kUnallocated occur there.
enum class ClusterType : uint8_t {
  kUnallocated,  // nothing here: the backing file's bytes (or zeros)
  kNormal,       // data at the entry's offset (in the data file when there is one)
  kCompressed,   // a compressed payload (DecodeCompressed)
  kZeroPlain,    // reads as zeros, no host cluster
  kZeroAlloc,    // reads as zeros, keeps its host cluster (preallocated)
};
// Offset 0 means unallocated, except in an image with an external data
// file, where it is the data file's first cluster when COPIED is set (a
// data-file cluster always has refcount 1, so qemu always sets it there).
inline ClusterType GetClusterType(uint64_t l2_entry, bool extended_l2, bool data_file) {
  if (l2_entry & kOflagCompressed) return ClusterType::kCompressed;
  if ((l2_entry & kOflagZero) && !extended_l2) {
    return (l2_entry & kL2OffsetMask) ? ClusterType::kZeroAlloc : ClusterType::kZeroPlain;
  }
  if (!(l2_entry & kL2OffsetMask)) {
    return data_file && (l2_entry & kOflagCopied) ? ClusterType::kNormal : ClusterType::kUnallocated;
  }
  return ClusterType::kNormal;
}
// Whether the cluster has a host cluster (its offset means something).
inline bool HasHostCluster(ClusterType type) {
  return type == ClusterType::kNormal || type == ClusterType::kZeroAlloc;
}

// Where a compressed cluster's payload lies, from its L2 entry: the host
// offset, and the bytes of the stored sectors from there (their count less
// the part of the first sector before the payload). Unchecked: the payload
// may reach past the end of the file (the last one may end inside a final,
// partial sector).
struct CompressedPayload {
  uint64_t host = 0;
  uint64_t bytes = 0;
};
inline CompressedPayload DecodeCompressed(uint64_t l2_entry, uint32_t cluster_bits) {
  const uint32_t x = CompressedOffsetBits(cluster_bits);
  const uint64_t host = l2_entry & ((uint64_t{1} << x) - 1);
  const uint64_t sectors = ((l2_entry >> x) & ((uint64_t{1} << (cluster_bits - 8)) - 1)) + 1;
  return {host, sectors * kSectorBytes - (host & (kSectorBytes - 1))};
}

}  // namespace barge::formats::qcow2
