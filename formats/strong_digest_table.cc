// Strong digest table encoding and validation.
#include "formats/strong_digest_table.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "formats/little_endian.h"

namespace barge::formats {

namespace {

constexpr char kMagic[8] = {'B', 'R', 'G', 'S', 'H', 'A', '2', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kAlgorithmSha256 = 1;  // SHA-256 of each zero-padded cluster

Error Bad(std::string what, uint64_t offset) {
  return Error::Corruption("strong digest table: " + std::move(what)).set_offset(offset);
}

}  // namespace

std::string StrongDigestHex(const StrongDigest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::optional<StrongDigest> StrongDigestTable::Find(uint64_t cluster_index) const {
  auto it = std::lower_bound(entries.begin(), entries.end(), cluster_index,
                             [](const StrongDigestEntry& e, uint64_t c) { return e.cluster_index < c; });
  if (it == entries.end() || it->cluster_index != cluster_index) return std::nullopt;
  return it->digest;
}

std::vector<std::byte> EncodeStrongDigestTable(const StrongDigestTable& table) {
  size_t n = table.entries.size();
  std::vector<std::byte> out(kStrongTableHeaderBytes + n * kStrongTableEntryBytes + kStrongTableTrailerBytes);
  std::memcpy(out.data(), kMagic, 8);
  PutLe(&out[8], kVersion, 4);
  PutLe(&out[12], kAlgorithmSha256, 4);
  PutLe(&out[16], table.cluster_bytes, 4);
  PutLe(&out[20], 0, 4);
  PutLe(&out[24], table.virtual_size, 8);
  PutLe(&out[32], table.image_digest.low, 8);
  PutLe(&out[40], table.image_digest.high, 8);
  PutLe(&out[48], n, 8);
  std::byte* p = out.data() + kStrongTableHeaderBytes;
  for (const StrongDigestEntry& e : table.entries) {
    PutLe(p, e.cluster_index, 8);
    std::memcpy(p + 8, e.digest.data(), e.digest.size());
    p += kStrongTableEntryBytes;
  }
  XXH128_hash_t h = XXH3_128bits(out.data(), out.size() - kStrongTableTrailerBytes);
  PutLe(p, h.low64, 8);
  PutLe(p + 8, h.high64, 8);
  return out;
}

Result<StrongDigestTable> DecodeStrongDigestTable(std::span<const std::byte> bytes) {
  if (bytes.size() < kStrongTableHeaderBytes + kStrongTableTrailerBytes) {
    return Bad("file too short (" + std::to_string(bytes.size()) + " bytes)", 0);
  }
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) return Bad("bad magic", 0);
  if (GetLe(&bytes[8], 4) != kVersion) {
    return Error::NotSupported("strong digest table: unsupported version " + std::to_string(GetLe(&bytes[8], 4)));
  }
  if (GetLe(&bytes[12], 4) != kAlgorithmSha256) {
    return Error::NotSupported("strong digest table: unsupported algorithm " +
                               std::to_string(GetLe(&bytes[12], 4)));
  }
  StrongDigestTable table;
  table.cluster_bytes = static_cast<uint32_t>(GetLe(&bytes[16], 4));
  if (table.cluster_bytes < 512 || table.cluster_bytes > (2u << 20) ||
      (table.cluster_bytes & (table.cluster_bytes - 1)) != 0) {
    return Bad("bad cluster size " + std::to_string(table.cluster_bytes), 16);
  }
  if (GetLe(&bytes[20], 4) != 0) return Bad("reserved field is not zero", 20);
  table.virtual_size = GetLe(&bytes[24], 8);
  table.image_digest = {GetLe(&bytes[32], 8), GetLe(&bytes[40], 8)};
  uint64_t n = GetLe(&bytes[48], 8);
  uint64_t body = bytes.size() - kStrongTableHeaderBytes - kStrongTableTrailerBytes;
  if (body % kStrongTableEntryBytes != 0 || n != body / kStrongTableEntryBytes) {
    return Bad("entry count " + std::to_string(n) + " does not match the file size", 48);
  }
  size_t trailer_at = bytes.size() - kStrongTableTrailerBytes;
  XXH128_hash_t h = XXH3_128bits(bytes.data(), trailer_at);
  if (GetLe(&bytes[trailer_at], 8) != h.low64 || GetLe(&bytes[trailer_at + 8], 8) != h.high64) {
    return Bad("checksum mismatch", trailer_at);
  }
  uint64_t clusters = table.cluster_count();
  table.entries.reserve(n);
  const std::byte* p = bytes.data() + kStrongTableHeaderBytes;
  for (uint64_t i = 0; i < n; ++i, p += kStrongTableEntryBytes) {
    StrongDigestEntry e;
    e.cluster_index = GetLe(p, 8);
    std::memcpy(e.digest.data(), p + 8, e.digest.size());
    uint64_t at = kStrongTableHeaderBytes + i * kStrongTableEntryBytes;
    if (e.cluster_index >= clusters) return Bad("cluster index beyond the disk", at);
    if (!table.entries.empty() && e.cluster_index <= table.entries.back().cluster_index) {
      return Bad("cluster indexes not strictly increasing", at);
    }
    table.entries.push_back(e);
  }
  return table;
}

Result<std::vector<StrongDigestEntry>> ReplaceStrongEntries(const std::vector<StrongDigestEntry>& base,
                                                            std::span<const ClusterSpan> replaced,
                                                            const std::vector<StrongDigestEntry>& layer) {
  std::vector<StrongDigestEntry> out;
  out.reserve(base.size() + layer.size());
  size_t b = 0, l = 0;
  for (const ClusterSpan& span : replaced) {
    while (b < base.size() && base[b].cluster_index < span.first) out.push_back(base[b++]);
    while (b < base.size() && base[b].cluster_index < span.end) ++b;  // replaced
    if (l < layer.size() && layer[l].cluster_index < span.first) {
      return Error::InvalidArgument("a new cluster digest lies outside the replaced clusters");
    }
    while (l < layer.size() && layer[l].cluster_index < span.end) out.push_back(layer[l++]);
  }
  if (l != layer.size()) return Error::InvalidArgument("a new cluster digest lies outside the replaced clusters");
  while (b < base.size()) out.push_back(base[b++]);
  return out;
}

}  // namespace barge::formats
