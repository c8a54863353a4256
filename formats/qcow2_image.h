// Internal: the qcow2 Image implementation, shared by the reader
// (qcow2_reader.cc), the bitmap reader and tests. Not for other layers.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/image.h"
#include "formats/qcow2_header.h"

namespace barge::formats::qcow2 {

// A bounded cache of L2 tables keyed by host offset. Thread-safe; loads happen
// outside the lock (two threads may load the same table; both get it).
class L2Cache {
 public:
  L2Cache(BlockSource& file, uint32_t cluster_bits, size_t capacity_tables);
  // The table at `l2_offset` (one cluster). `l2_offset` must be checked by the
  // caller (aligned, inside the file).
  Result<std::shared_ptr<const std::vector<std::byte>>> Get(uint64_t l2_offset);

 private:
  using Table = std::shared_ptr<const std::vector<std::byte>>;
  BlockSource& file_;  // must outlive the cache
  uint32_t cluster_bits_;
  size_t capacity_;
  std::mutex mu_;
  std::list<uint64_t> lru_;  // guarded by mu_; front = most recent
  std::unordered_map<uint64_t, std::pair<Table, std::list<uint64_t>::iterator>> tables_;  // mu_
};

// How one run of guest bytes in a single layer is stored.
enum class RunKind : uint8_t {
  kData,         // uncompressed, at host_offset in the file or the data file
  kCompressed,   // l2_entry is the compressed descriptor
  kZero,         // reads as zeros here (ZERO_PLAIN, ZERO_ALLOC, subcluster zero)
  kUnallocated,  // falls through to the backing file (or zeros)
};

struct Run {
  uint64_t guest_offset = 0;
  uint64_t length = 0;
  RunKind kind = RunKind::kUnallocated;
  uint64_t host_offset = 0;  // kData, or `allocated`: host byte of guest_offset
  uint64_t l2_entry = 0;     // kCompressed: the descriptor word
  // kZero / kUnallocated inside a cluster that keeps its host cluster
  // (ZERO_ALLOC; zero or unallocated subclusters of an allocated extended-L2
  // cluster): host_offset is valid, as qemu-img map reports it.
  bool allocated = false;
};

class Qcow2Image final : public Image {
 public:
  Qcow2Image(std::unique_ptr<BlockSource> file, Header header, std::vector<uint64_t> l1,
             ImageInfo info);

  // Set while opening.
  void set_backing(std::unique_ptr<Image> backing) { backing_ = std::move(backing); }
  void set_data_file(std::unique_ptr<BlockSource> data) { data_file_ = std::move(data); }

  const std::string& name() const override { return file_->name(); }
  uint64_t size_bytes() const override { return header_.size; }
  SourceCapabilities capabilities() const override;
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  // Every request in one pass per layer (ReadPieces): the stored runs of
  // all of them sorted by file offset, neighbours fetched with one read of
  // the file. A failure is every request's status (the batch shares reads).
  Status ReadMany(std::span<ReadRequest> requests) override;
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override;
  const ImageInfo& info() const override { return info_; }
  const Image* backing() const override { return backing_.get(); }
  Result<std::vector<MappedExtent>> Map(uint64_t offset, uint64_t length) override;

  // The image's own file and parsed header (for bitmaps and tests).
  BlockSource& file() const { return *file_; }
  const Header& header() const { return header_; }

  // Runs of this layer only, covering [offset, offset+length) (inside the
  // disk), merged where kind and host contiguity allow. kCorruption for bad
  // L1/L2 entries.
  Status MapLayer(uint64_t offset, uint64_t length, std::vector<Run>& out);

 private:
  // Guest bytes of this layer to fill: the ranges a read covers, then the
  // ranges that fall through from the layer above.
  struct Piece {
    uint64_t offset = 0;
    std::span<std::byte> out;
  };
  struct Fetch;
  // Fills the pieces from this layer, then every range that falls through
  // from the backing file in one call, so reads batch on every layer.
  Status ReadPieces(std::span<const Piece> pieces);
  // Reads the stored runs of this layer, nearby ones with one read, and
  // decodes the compressed ones.
  Status FetchRuns(std::vector<Fetch>& fetches);
  Status ReadDataFile(const Run& run, std::span<std::byte> out);
  Error Bad(std::string what, uint64_t offset) const;

  std::unique_ptr<BlockSource> file_;
  Header header_;
  std::vector<uint64_t> l1_;
  ImageInfo info_;
  L2Cache l2_cache_;
  std::unique_ptr<Image> backing_;
  std::unique_ptr<BlockSource> data_file_;
  // Read-ahead of file_ for passes in guest order (see FetchRuns).
  ReadAheadMark read_ahead_;
  // FetchRuns' coalescing: runs at most max_gap_ apart are fetched with one
  // read of at most max_batch_ bytes. A file read over the network (each
  // read a round trip: an object in a bucket) reads through larger gaps
  // than a local one (set in the constructor).
  uint64_t max_gap_ = 16 << 10;
  static constexpr uint64_t max_batch_ = 4 << 20;
};

// The qcow2 layer behind `image`, or nullptr when it is not a qcow2 image.
const Qcow2Image* AsQcow2(const Image& image);

}  // namespace barge::formats::qcow2
