// Per-cluster compression and decompression in qcow2's formats: zstd frames
// and raw deflate (windowBits -12 when writing), QCOW2.md §4.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "blockio/error.h"
#include "formats/image.h"

namespace barge::formats {

// Holds the compression context; one per thread.
class ClusterCompressor {
 public:
  // level: zstd 1..19, deflate 1..9; out of range: kDefaultZstdLevel /
  // kDefaultDeflateLevel (image.h).
  ClusterCompressor(Compression type, int level);
  ~ClusterCompressor();
  ClusterCompressor(const ClusterCompressor&) = delete;
  ClusterCompressor& operator=(const ClusterCompressor&) = delete;

  // Compresses one whole cluster (zero padded by the caller if short).
  // Returns the payload (valid until the next call), or nullopt when it does
  // not save at least one 512-byte sector: store the cluster raw then.
  Result<std::optional<std::span<const std::byte>>> Compress(std::span<const std::byte> cluster);

  // The same, written straight into `out` (the pipeline's payload slot: no
  // copy). Returns the payload's size, or 0 when it does not save a sector
  // or does not fit in `out`; `out` holds garbage then. An `out` of at least
  // cluster.size() - 512 bytes never refuses a payload that saves a sector.
  Result<size_t> CompressInto(std::span<const std::byte> cluster, std::span<std::byte> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Decompresses a payload into exactly out.size() bytes (one cluster). The
// payload may carry trailing bytes of the next one. kCorruption if the
// stream is bad or yields the wrong size.
Status DecompressCluster(Compression type, std::span<const std::byte> payload,
                         std::span<std::byte> out);

}  // namespace barge::formats
