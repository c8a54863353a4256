// Writes a new qcow2 image once, front to back (QCOW2.md §3): data clusters
// in increasing guest order, then L2/L1, bitmaps, refcounts, header last.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "blockio/extent.h"
#include "blockio/sink.h"
#include "formats/image.h"

namespace barge::formats {

// A persistent dirty bitmap to store in the image.
struct BitmapSpec {
  std::string name;
  uint32_t granularity_bytes = 65536;  // power of two, >= 512
  bool enabled = true;                 // the "auto" flag
  RangeList dirty;                     // guest byte ranges marked dirty
};

struct Qcow2WriterOptions {
  uint64_t virtual_size = 0;  // rounded up to a multiple of 512
  uint32_t cluster_bits = 16;
  uint32_t refcount_order = 4;
  // Header compression type: what WriteCompressed payloads are. kNone means
  // the image holds no compressed clusters (header says zlib, as qemu does).
  Compression compression = Compression::kZstd;
  std::string backing_file;    // stored as is (a relative name); "" = none
  std::string backing_format;  // "qcow2" or "raw"; required with a backing file
  std::vector<BitmapSpec> bitmaps;
};

struct Qcow2WriterStats {
  uint64_t data_clusters = 0;
  uint64_t compressed_clusters = 0;
  uint64_t zero_clusters = 0;
  uint64_t file_bytes = 0;  // size of the finished file
};

// One writer per image; single-threaded (put a sequencer in front of it).
class Qcow2Writer {
 public:
  // `sink` must outlive the writer; it must be empty and able to grow.
  static Result<std::unique_ptr<Qcow2Writer>> Create(BlockSink& sink, Qcow2WriterOptions options);
  virtual ~Qcow2Writer() = default;

  virtual uint32_t cluster_size() const = 0;
  virtual uint64_t cluster_count() const = 0;

  // Each call names a cluster greater than every earlier one (else
  // kInvalidArgument). Clusters never named stay unallocated.
  // `data` is the cluster's guest bytes: cluster_size() bytes, or fewer for
  // the last cluster of a disk whose size is not a multiple (zero padded).
  virtual Status WriteData(uint64_t cluster_index, std::span<const std::byte> data) = 0;
  // `payload` is a compressed cluster from ClusterCompressor, of the type in
  // the options, at most cluster_size() - 512 bytes.
  virtual Status WriteCompressed(uint64_t cluster_index, std::span<const std::byte> payload) = 0;
  // A zero cluster: reads as zeros, never falls through to the backing file.
  virtual Status WriteZero(uint64_t cluster_index) = 0;

  // Writes the metadata and header, then flushes. After it, nothing else.
  virtual Status Finish() = 0;
  virtual Qcow2WriterStats stats() const = 0;
};

struct OverlayOptions {
  uint64_t virtual_size = 0;   // multiple of 512, at most the data file's size
  std::string data_file_path;  // absolute path of the raw disk, stored as is
  uint32_t cluster_bits = 16;
  std::vector<BitmapSpec> bitmaps;  // e.g. one enabled, empty "cbt0"
};

// Writes a metadata-only overlay (data-file, data-file-raw, identity mapping
// of every cluster) into `sink`. Never touches the data file.
Status WriteDataFileOverlay(BlockSink& sink, const OverlayOptions& options);

}  // namespace barge::formats
