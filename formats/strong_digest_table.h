// The strong (SHA-256) digest table of a point in time (".sha256"), which
// incrementals by digest compare a source against. Byte layout and meaning:
// docs/formats/backup.md ("Strong digest table"); why SHA-256 and not the
// xxh3-128 of the ".digests" table: docs/security.md.
//
// Unlike the per-layer ".digests" table, it lists every cluster the point
// reads as non-zero data (the whole disk as that point sees it, through its
// chain), so one table answers for a point without its layers below.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "formats/digest.h"

namespace barge::formats {

// SHA-256 of one cluster's bytes, zero-padded to the cluster size.
using StrongDigest = std::array<uint8_t, 32>;

std::string StrongDigestHex(const StrongDigest& digest);

struct StrongDigestEntry {
  uint64_t cluster_index = 0;
  StrongDigest digest{};
  friend bool operator==(const StrongDigestEntry&, const StrongDigestEntry&) = default;
};

struct StrongDigestTable {
  uint32_t cluster_bytes = 0;
  uint64_t virtual_size = 0;
  // The image digest (xxh3 fold) of the point the table describes: a table
  // is taken only for the point whose manifest records this digest.
  Digest128 image_digest;
  // Clusters that read as non-zero data; strictly increasing cluster_index.
  std::vector<StrongDigestEntry> entries;

  uint64_t cluster_count() const {
    return cluster_bytes ? (virtual_size + cluster_bytes - 1) / cluster_bytes : 0;
  }
  // The entry's digest, or nullopt when the cluster reads as zero.
  std::optional<StrongDigest> Find(uint64_t cluster_index) const;
};

inline constexpr uint32_t kStrongTableHeaderBytes = 56;
inline constexpr uint32_t kStrongTableEntryBytes = 40;
inline constexpr uint32_t kStrongTableTrailerBytes = 16;

// Serializes the table (header, entries, xxh3-128 trailer).
std::vector<std::byte> EncodeStrongDigestTable(const StrongDigestTable& table);

// Parses and validates bytes from disk: magic, version, algorithm, sizes,
// order and range of indexes, trailer. kCorruption names the offset of the
// first bad field; kNotSupported an unknown version or algorithm.
Result<StrongDigestTable> DecodeStrongDigestTable(std::span<const std::byte> bytes);

// The table after a layer replaced some clusters: `base` with every cluster
// of `replaced` (sorted, disjoint cluster index ranges [first, end)) taken
// from `layer` (data clusters, sorted; a replaced cluster without an entry
// there reads as zero). kInvalidArgument when `layer` lists a cluster
// outside `replaced`.
struct ClusterSpan {
  uint64_t first = 0;
  uint64_t end = 0;
};
Result<std::vector<StrongDigestEntry>> ReplaceStrongEntries(const std::vector<StrongDigestEntry>& base,
                                                            std::span<const ClusterSpan> replaced,
                                                            const std::vector<StrongDigestEntry>& layer);

}  // namespace barge::formats
