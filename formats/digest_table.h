// The per-cluster digest table stored beside each backup image (".digests").
// Byte layout: docs/formats/manifest.md. Entries are the clusters the layer
// defines (data or zero clusters), sorted by cluster index.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "formats/digest.h"

namespace barge::formats {

struct DigestEntry {
  uint64_t cluster_index = 0;
  Digest128 digest;
  friend bool operator==(const DigestEntry&, const DigestEntry&) = default;
};

struct DigestTable {
  uint32_t cluster_bytes = 0;
  uint64_t virtual_size = 0;
  std::vector<DigestEntry> entries;  // strictly increasing cluster_index

  uint64_t cluster_count() const {
    return cluster_bytes ? (virtual_size + cluster_bytes - 1) / cluster_bytes : 0;
  }
};

inline constexpr uint32_t kDigestTableHeaderBytes = 32;
inline constexpr uint32_t kDigestTableEntryBytes = 24;
inline constexpr uint32_t kDigestTableTrailerBytes = 16;

// Serializes the table (header, entries, xxh3-128 trailer).
std::vector<std::byte> EncodeDigestTable(const DigestTable& table);

// Parses and validates bytes from disk: magic, version, sizes, order, index
// range and trailer. kCorruption names the offset of the first bad field.
Result<DigestTable> DecodeDigestTable(std::span<const std::byte> bytes);

// The effective digest of every cluster for a chain of tables, oldest first
// (layers[0] is the full backup): the newest layer defining a cluster wins.
// Returns the merged table (entries for every cluster some layer defines).
// kInvalidArgument if the layers disagree on cluster size.
Result<DigestTable> MergeDigestTables(std::span<const DigestTable* const> layers_oldest_first);

// The image digest of a merged table: clusters without an entry are zero.
// With kZeroRunFold it costs the entries, not the disk's clusters. No
// default: a point's digest is by its manifest's algorithm, and a caller
// that forgot it would get the other version's value.
Digest128 ImageDigestOf(const DigestTable& merged, ImageDigestAlgorithm algorithm);

}  // namespace barge::formats
