// Per-cluster digests (xxh3-128) and the image digest folded from them. The
// definitions are part of the manifest format: docs/formats/manifest.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

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

// How per-cluster digests fold into the image digest (docs/formats/backup.md,
// "Cluster digests and the image digest"); a manifest names its algorithm.
enum class ImageDigestAlgorithm : uint8_t {
  // Version 1, "xxh3-128-cluster-fold": xxh3-128 over every cluster's digest
  // as 16 bytes. Its cost grows with the disk's size; still read.
  kClusterFold,
  // Version 2, "xxh3-128-zero-run-fold": xxh3-128 over records, in cluster
  // order: a maximal run of clusters whose digest is the zero cluster's is
  // the byte 0x00 and the run's length (u64 LE); any other cluster is the
  // byte 0x01 and its digest's 16 bytes. A run costs one record, whatever
  // its length. Written by every new point.
  kZeroRunFold,
};
inline constexpr ImageDigestAlgorithm kCurrentImageDigestAlgorithm = ImageDigestAlgorithm::kZeroRunFold;
// The manifest's name of an algorithm, and back (nullopt: unknown).
std::string_view ImageDigestAlgorithmName(ImageDigestAlgorithm algorithm);
std::optional<ImageDigestAlgorithm> ImageDigestAlgorithmFromName(std::string_view name);

// Folds per-cluster digests, in cluster order over the whole disk, into the
// image digest by one of the algorithms above. Clusters that read as zero
// contribute ZeroClusterDigest. Not thread-safe; one per image.
class ImageDigestBuilder {
 public:
  // The version 1 fold (kClusterFold).
  ImageDigestBuilder();
  ImageDigestBuilder(ImageDigestAlgorithm algorithm, uint32_t cluster_bytes);
  ~ImageDigestBuilder();
  ImageDigestBuilder(const ImageDigestBuilder&) = delete;
  ImageDigestBuilder& operator=(const ImageDigestBuilder&) = delete;

  void Add(const Digest128& cluster_digest);
  // Adds `count` copies of the same digest (runs of zero clusters). With
  // kZeroRunFold and the zero digest: constant time, whatever `count`.
  void AddRepeated(const Digest128& cluster_digest, uint64_t count);
  Digest128 Finish();

 private:
  void FlushZeroRun();

  void* state_;  // XXH3_state_t, owned
  ImageDigestAlgorithm algorithm_ = ImageDigestAlgorithm::kClusterFold;
  Digest128 zero_;          // kZeroRunFold: the zero cluster's digest
  uint64_t zero_run_ = 0;   // kZeroRunFold: zero clusters not yet folded
};

}  // namespace barge::formats
