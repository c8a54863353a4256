// Per-cluster digests (xxh3-128) and the image digest folded from them. The
// definitions are part of the manifest format: docs/formats/manifest.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "blockio/error.h"

namespace barge::formats {

struct Digest128 {
  uint64_t low = 0;
  uint64_t high = 0;
  friend bool operator==(const Digest128&, const Digest128&) = default;
  // 32 lowercase hex digits, high word first (as xxhsum prints XXH128).
  std::string ToHex() const;
  static Result<Digest128> FromHex(std::string_view hex);
};

// Digest of one cluster's logical bytes: `data` zero-padded to
// `cluster_bytes` (the last cluster of a disk may be short).
Digest128 HashCluster(std::span<const std::byte> data, uint32_t cluster_bytes);

// HashCluster of an all-zero cluster (cached per size).
Digest128 ZeroClusterDigest(uint32_t cluster_bytes);

// Folds per-cluster digests, in cluster order over the whole disk, into the
// image digest: xxh3-128 over the sequence of 16-byte little-endian (low,
// high) pairs. Clusters that read as zero contribute ZeroClusterDigest.
// Not thread-safe; one per image.
class ImageDigestBuilder {
 public:
  ImageDigestBuilder();
  ~ImageDigestBuilder();
  ImageDigestBuilder(const ImageDigestBuilder&) = delete;
  ImageDigestBuilder& operator=(const ImageDigestBuilder&) = delete;

  void Add(const Digest128& cluster_digest);
  // Adds `count` copies of the same digest (runs of zero clusters).
  void AddRepeated(const Digest128& cluster_digest, uint64_t count);
  Digest128 Finish();

 private:
  void* state_;  // XXH3_state_t, owned
};

}  // namespace barge::formats
