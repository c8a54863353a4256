// Digest table encoding, validation and chain merging.
#include "formats/digest_table.h"

#include <xxhash.h>

#include <cstring>

#include "formats/little_endian.h"

namespace barge::formats {

namespace {

constexpr char kMagic[8] = {'B', 'R', 'G', 'D', 'I', 'G', 'T', '1'};
constexpr uint32_t kVersion = 1;

Error Bad(std::string what, uint64_t offset) {
  return Error::Corruption("digest table: " + std::move(what)).set_offset(offset);
}

}  // namespace

std::vector<std::byte> EncodeDigestTable(const DigestTable& table) {
  size_t n = table.entries.size();
  std::vector<std::byte> out(kDigestTableHeaderBytes + n * kDigestTableEntryBytes +
                             kDigestTableTrailerBytes);
  std::memcpy(out.data(), kMagic, 8);
  PutLe(&out[8], kVersion, 4);
  PutLe(&out[12], table.cluster_bytes, 4);
  PutLe(&out[16], table.virtual_size, 8);
  PutLe(&out[24], n, 8);
  std::byte* p = out.data() + kDigestTableHeaderBytes;
  for (const DigestEntry& e : table.entries) {
    PutLe(p, e.cluster_index, 8);
    PutLe(p + 8, e.digest.low, 8);
    PutLe(p + 16, e.digest.high, 8);
    p += kDigestTableEntryBytes;
  }
  XXH128_hash_t h = XXH3_128bits(out.data(), out.size() - kDigestTableTrailerBytes);
  PutLe(p, h.low64, 8);
  PutLe(p + 8, h.high64, 8);
  return out;
}

Result<DigestTable> DecodeDigestTable(std::span<const std::byte> bytes) {
  if (bytes.size() < kDigestTableHeaderBytes + kDigestTableTrailerBytes) {
    return Bad("file too short (" + std::to_string(bytes.size()) + " bytes)", 0);
  }
  if (std::memcmp(bytes.data(), kMagic, 8) != 0) return Bad("bad magic", 0);
  if (GetLe(&bytes[8], 4) != kVersion) {
    return Error::NotSupported("digest table: unsupported version " +
                               std::to_string(GetLe(&bytes[8], 4)));
  }
  DigestTable table;
  table.cluster_bytes = static_cast<uint32_t>(GetLe(&bytes[12], 4));
  table.virtual_size = GetLe(&bytes[16], 8);
  uint64_t n = GetLe(&bytes[24], 8);
  if (table.cluster_bytes < 512 || table.cluster_bytes > (2u << 20) ||
      (table.cluster_bytes & (table.cluster_bytes - 1)) != 0) {
    return Bad("bad cluster size " + std::to_string(table.cluster_bytes), 12);
  }
  uint64_t body = bytes.size() - kDigestTableHeaderBytes - kDigestTableTrailerBytes;
  if (body % kDigestTableEntryBytes != 0 || n != body / kDigestTableEntryBytes) {
    return Bad("entry count " + std::to_string(n) + " does not match the file size", 24);
  }
  size_t trailer_at = bytes.size() - kDigestTableTrailerBytes;
  XXH128_hash_t h = XXH3_128bits(bytes.data(), trailer_at);
  if (GetLe(&bytes[trailer_at], 8) != h.low64 || GetLe(&bytes[trailer_at + 8], 8) != h.high64) {
    return Bad("checksum mismatch", trailer_at);
  }
  uint64_t clusters = table.cluster_count();
  table.entries.reserve(n);
  const std::byte* p = bytes.data() + kDigestTableHeaderBytes;
  for (uint64_t i = 0; i < n; ++i, p += kDigestTableEntryBytes) {
    DigestEntry e{GetLe(p, 8), {GetLe(p + 8, 8), GetLe(p + 16, 8)}};
    uint64_t at = kDigestTableHeaderBytes + i * kDigestTableEntryBytes;
    if (e.cluster_index >= clusters) return Bad("cluster index beyond the disk", at);
    if (!table.entries.empty() && e.cluster_index <= table.entries.back().cluster_index) {
      return Bad("cluster indexes not strictly increasing", at);
    }
    table.entries.push_back(e);
  }
  return table;
}

Result<DigestTable> MergeDigestTables(std::span<const DigestTable* const> layers) {
  DigestTable merged;
  if (layers.empty()) return merged;
  merged.cluster_bytes = layers.back()->cluster_bytes;
  merged.virtual_size = layers.back()->virtual_size;
  for (const DigestTable* t : layers) {
    if (t->cluster_bytes != merged.cluster_bytes) {
      return Error::InvalidArgument("digest tables of one chain have different cluster sizes");
    }
    // Two-way merge of sorted lists; the newer table (t) wins on equal index.
    std::vector<DigestEntry> out;
    out.reserve(merged.entries.size() + t->entries.size());
    size_t i = 0, j = 0;
    while (i < merged.entries.size() || j < t->entries.size()) {
      if (j == t->entries.size() ||
          (i < merged.entries.size() &&
           merged.entries[i].cluster_index < t->entries[j].cluster_index)) {
        out.push_back(merged.entries[i++]);
      } else {
        if (i < merged.entries.size() &&
            merged.entries[i].cluster_index == t->entries[j].cluster_index) {
          ++i;
        }
        out.push_back(t->entries[j++]);
      }
    }
    merged.entries = std::move(out);
  }
  // Clusters beyond the newest size no longer exist.
  uint64_t clusters = merged.cluster_count();
  while (!merged.entries.empty() && merged.entries.back().cluster_index >= clusters) {
    merged.entries.pop_back();
  }
  return merged;
}

Digest128 ImageDigestOf(const DigestTable& merged, ImageDigestAlgorithm algorithm) {
  ImageDigestBuilder builder(algorithm, merged.cluster_bytes);
  Digest128 zero = ZeroClusterDigest(merged.cluster_bytes);
  uint64_t next = 0;
  for (const DigestEntry& e : merged.entries) {
    builder.AddRepeated(zero, e.cluster_index - next);
    builder.Add(e.digest);
    next = e.cluster_index + 1;
  }
  builder.AddRepeated(zero, merged.cluster_count() - next);
  return builder.Finish();
}

}  // namespace barge::formats
