// Writes a new qcow2 image once, front to back (QCOW2.md §3): data clusters
// in increasing guest order (each L2 table written as soon as the stream
// leaves its range), then L1, bitmaps, refcounts, header last.
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

// What the writer stored for one guest cluster, in the order of the calls:
// all a resume journal keeps to rebuild the writer's state over the file it
// wrote (pipeline/backup_resume.h, docs/formats/resume.md).
enum class StoredKind : uint8_t { kData = 1, kCompressed = 2, kZero = 3 };
struct StoredCluster {
  uint64_t cluster_index = 0;
  StoredKind kind = StoredKind::kData;
  uint32_t payload_bytes = 0;  // kCompressed: the payload's length; else 0
  friend bool operator==(const StoredCluster&, const StoredCluster&) = default;
};

// Where Qcow2Writer put a sequence of StoredCluster (PlanStored).
struct StoredLayout {
  std::vector<uint64_t> host_offsets;  // per cluster: its bytes' offset; 0 for kZero
  uint64_t end_bytes = 0;              // first byte after everything placed
};

// One writer per image; single-threaded (put a sequencer in front of it).
//
// The image is always version 3 with a 112-byte header; compression_type is
// 1 (zstd, incompatible bit 3) or 0 (deflate, or no compression). Memory is
// one L2 table, the L1 table, and refcount runs (one run per change of
// refcount, so one per cluster only where compressed payloads share).
//
// Compressed payloads are packed byte by byte and share host clusters up to
// the largest refcount the refcount order can hold. With refcount_order 0
// (1-bit refcounts) they are not packed: each payload starts its own host
// cluster, as qemu does. With order 1 at most three share a cluster.
//
// Errors: kInvalidArgument for bad options or a call out of order (such a
// call changes nothing); sink errors come back with context, and after one
// every later call fails (the file is incomplete and has no header).
class Qcow2Writer {
 public:
  // `sink` must outlive the writer; it must be empty and able to grow.
  // Writes cluster 0 as zeros. Refuses: cluster_bits outside 9..21,
  // refcount_order outside 0..6, an L1 table over 32 MiB, a backing file
  // without a format ("qcow2" or "raw") or over 1023 bytes, a header that does
  // not fit in cluster 0, and bad bitmaps (names unique and 1..1023 bytes,
  // granularity a power of two from 512 to 2^31).
  static Result<std::unique_ptr<Qcow2Writer>> Create(BlockSink& sink, Qcow2WriterOptions options);
  virtual ~Qcow2Writer() = default;

  virtual uint32_t cluster_size() const = 0;
  virtual uint64_t cluster_count() const = 0;

  // Each call names a cluster greater than every earlier one (else
  // kInvalidArgument). Clusters never named stay unallocated (they read from
  // the backing file, or as zeros without one).
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

  // Writes out the appended bytes still buffered and flushes the sink: what
  // the calls so far stored is then durable in the file below the returned
  // offset (the end of what was placed). The L2 table being filled stays
  // in memory: Resume rebuilds it from the calls. Default: kNotSupported.
  virtual Result<uint64_t> Sync() { return Error::NotSupported("qcow2 writer: no sync"); }

  // Resume: where a writer with `options` puts `stored` (in call order)
  // and the end after them, touching no sink. kInvalidArgument for bad
  // options or clusters out of order.
  static Result<StoredLayout> PlanStored(const Qcow2WriterOptions& options, std::span<const StoredCluster> stored);
  // A writer that goes on with the image an earlier writer with the same
  // options left in `sink` after making the calls `stored` and a Sync. It
  // truncates the sink to the end of what they placed (dropping whatever a
  // killed writer appended after), replays their allocation without
  // writing their data (the caller checked it against its digests), and
  // writes the L2 tables of the ranges they left again. The next call must
  // name a cluster after the last of `stored`. `sink` must outlive the
  // writer, and read unwritten bytes beyond its size as zeros.
  static Result<std::unique_ptr<Qcow2Writer>> Resume(BlockSink& sink, Qcow2WriterOptions options,
                                                     std::span<const StoredCluster> stored);
};

struct OverlayOptions {
  uint64_t virtual_size = 0;   // multiple of 512, at most the data file's size
  std::string data_file_path;  // absolute path of the raw disk, stored as is
  uint32_t cluster_bits = 16;
  std::vector<BitmapSpec> bitmaps;  // e.g. one enabled, empty "cbt0"
};

// Writes a metadata-only overlay (data-file, data-file-raw, identity mapping
// `guest_offset | COPIED` of every cluster, refcount order 4, no compression,
// bitmaps as given) into `sink`, which must be empty. Never touches the data
// file. kInvalidArgument for a relative data file path (qemu would resolve it
// against its working directory) or a size that is not a multiple of 512.
Status WriteDataFileOverlay(BlockSink& sink, const OverlayOptions& options);

}  // namespace barge::formats
