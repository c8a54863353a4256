// The one-pass qcow2 writer (QCOW2.md §3): cluster 0 reserved, guest data in
// order with each L2 table written once the stream leaves its range, then
// L1, bitmaps, refcounts, and the header last. Also the data-file overlay.
#include "formats/qcow2_writer.h"

#include <string>
#include <vector>

#include "formats/qcow2_format.h"
#include "formats/qcow2_writer_host.h"
#include "formats/qcow2_writer_meta.h"
#include "formats/sector.h"

namespace barge::formats {
namespace {

using qcow2::HostFile;

// Everything that distinguishes a backup image from a data-file overlay.
struct ImageConfig {
  uint64_t virtual_size = 0;  // multiple of 512
  uint32_t cluster_bits = 16;
  uint32_t refcount_order = 4;
  Compression compression = Compression::kNone;
  std::string backing_file;
  std::string backing_format;
  std::string data_file;  // non-empty: metadata-only overlay, data_file_raw
  std::vector<BitmapSpec> bitmaps;
};

std::string Num(uint64_t v) { return std::to_string(v); }

// Checks what both entry points share; returns the L1 entry count.
Result<uint64_t> ValidateConfig(const ImageConfig& c) {
  if (c.cluster_bits < qcow2::kMinClusterBits || c.cluster_bits > qcow2::kMaxClusterBits) {
    return Error::InvalidArgument("qcow2 writer: cluster_bits " + Num(c.cluster_bits) +
                                  " outside 9..21");
  }
  if (c.refcount_order > qcow2::kMaxRefcountOrder) {
    return Error::InvalidArgument("qcow2 writer: refcount_order " + Num(c.refcount_order) +
                                  " outside 0..6");
  }
  uint64_t l1_entries = qcow2::L1EntriesFor(c.virtual_size, c.cluster_bits, false);
  if (l1_entries * 8 > qcow2::kMaxL1Bytes) {
    return Error::InvalidArgument("qcow2 writer: virtual size " + Num(c.virtual_size) +
                                  " needs an L1 table over 32 MiB; use larger clusters");
  }
  if (!c.backing_file.empty()) {
    if (c.backing_file.size() > qcow2::kMaxBackingFileNameBytes ||
        c.backing_file.find('\0') != std::string::npos) {
      return Error::InvalidArgument("qcow2 writer: backing file name must be 1..1023 bytes");
    }
    if (c.backing_format.empty()) {
      return Error::InvalidArgument("qcow2 writer: a backing file needs a backing format");
    }
    BARGE_RETURN_IF_ERROR(ParseImageFormat(c.backing_format));
  } else if (!c.backing_format.empty()) {
    return Error::InvalidArgument("qcow2 writer: backing format without a backing file");
  }
  if (!c.data_file.empty() && !c.backing_file.empty()) {
    return Error::InvalidArgument("qcow2 writer: a raw data file excludes a backing file");
  }
  BARGE_RETURN_IF_ERROR(qcow2::ValidateBitmaps(c.bitmaps, c.virtual_size, c.cluster_bits));
  return l1_entries;
}

class Qcow2WriterImpl final : public Qcow2Writer {
 public:
  Qcow2WriterImpl(BlockSink& sink, ImageConfig config, uint64_t l1_entries)
      : sink_(sink),
        config_(std::move(config)),
        host_(sink, config_.cluster_bits, config_.refcount_order),
        l2_entries_(qcow2::L2Entries(config_.cluster_bits, false)),
        cluster_count_(qcow2::SizeToClusters(config_.virtual_size, config_.cluster_bits)),
        l1_(l1_entries * 8) {}

  // Reserves cluster 0 with zeros; the header replaces them in Finish.
  Status Start() {
    std::vector<std::byte> zeros(cluster_size());
    BARGE_RETURN_IF_ERROR(host_.AppendClusters(zeros, "cluster 0"));
    return OkStatus();
  }

  // Resume: places cluster 0 and then each stored cluster as the calls
  // that stored them did, writing only the L2 tables the stream leaves.
  // Returns each one's host offset (0 for a zero cluster).
  Result<std::vector<uint64_t>> Replay(std::span<const StoredCluster> stored) {
    replaying_ = true;
    std::vector<uint64_t> offsets;
    offsets.reserve(stored.size());
    BARGE_RETURN_IF_ERROR(host_.SkipClusters(cluster_size()));
    for (const StoredCluster& c : stored) {
      BARGE_RETURN_IF_ERROR(CheckNext(c.cluster_index));
      uint64_t offset = 0;
      switch (c.kind) {
        case StoredKind::kData: {
          BARGE_ASSIGN_OR_RETURN(offset, host_.SkipClusters(cluster_size()));
          ++stats_.data_clusters;
          BARGE_RETURN_IF_ERROR(SetEntry(c.cluster_index, offset | qcow2::kOflagCopied));
          break;
        }
        case StoredKind::kCompressed: {
          if (config_.compression == Compression::kNone) {
            return Error::InvalidArgument("qcow2 writer: compressed cluster in an image without compression");
          }
          BARGE_ASSIGN_OR_RETURN(offset, host_.SkipPacked(c.payload_bytes));
          BARGE_RETURN_IF_ERROR(SetEntry(c.cluster_index, CompressedEntry(offset, c.payload_bytes)));
          ++stats_.compressed_clusters;
          break;
        }
        case StoredKind::kZero:
          BARGE_RETURN_IF_ERROR(SetEntry(c.cluster_index, qcow2::kOflagZero));
          ++stats_.zero_clusters;
          break;
        default:
          return Error::InvalidArgument("qcow2 writer: unknown stored cluster kind");
      }
      offsets.push_back(offset);
    }
    replaying_ = false;
    return offsets;
  }

  uint64_t end_bytes() const { return host_.end_bytes(); }

  Result<uint64_t> Sync() override {
    if (finished_) return Error::InvalidArgument("qcow2 writer: sync after Finish");
    if (failed_) return failed_error();
    BARGE_RETURN_IF_ERROR(Track(host_.FlushAppends()));
    Status st = sink_.Flush();
    if (!st.ok()) {
      failed_ = true;
      return std::move(st).error().Wrap("qcow2 writer: flushing " + sink_.name());
    }
    return host_.end_bytes();
  }

  uint32_t cluster_size() const override { return 1u << config_.cluster_bits; }
  uint64_t cluster_count() const override { return cluster_count_; }
  Qcow2WriterStats stats() const override { return stats_; }

  Status WriteData(uint64_t cluster_index, std::span<const std::byte> data) override {
    BARGE_RETURN_IF_ERROR(CheckNext(cluster_index));
    bool last = cluster_index + 1 == cluster_count_;
    if (data.size() != cluster_size() && !(last && !data.empty() && data.size() < cluster_size())) {
      return Error::InvalidArgument("qcow2 writer: cluster " + Num(cluster_index) + " has " +
                                    Num(data.size()) + " bytes, expected " + Num(cluster_size()));
    }
    return Track(DoWriteData(cluster_index, data));
  }

  Status WriteCompressed(uint64_t cluster_index, std::span<const std::byte> payload) override {
    BARGE_RETURN_IF_ERROR(CheckNext(cluster_index));
    if (config_.compression == Compression::kNone) {
      return Error::InvalidArgument("qcow2 writer: compressed cluster in an image without compression");
    }
    if (payload.empty() || payload.size() > cluster_size() - kSectorBytes) {
      return Error::InvalidArgument("qcow2 writer: compressed payload of " + Num(payload.size()) +
                                    " bytes for cluster " + Num(cluster_index) + " (must be 1.." +
                                    Num(cluster_size() - kSectorBytes) + ")");
    }
    return Track(DoWriteCompressed(cluster_index, payload));
  }

  Status WriteZero(uint64_t cluster_index) override {
    BARGE_RETURN_IF_ERROR(CheckNext(cluster_index));
    // ZERO_PLAIN: reads as zeros without consulting the backing file.
    BARGE_RETURN_IF_ERROR(Track(SetEntry(cluster_index, qcow2::kOflagZero)));
    ++stats_.zero_clusters;
    return OkStatus();
  }

  Status Finish() override {
    if (finished_) return Error::InvalidArgument("qcow2 writer: Finish called twice");
    if (failed_) return failed_error();
    finished_ = true;
    return Track(DoFinish());
  }

  // The header for the given metadata offsets (zeros for the early fit
  // check in StartImage).
  qcow2::HeaderFields HeaderFor(uint64_t l1_offset, const qcow2::BitmapDirectory& bitmaps,
                                const qcow2::RefcountLayout& refcounts) const {
    qcow2::HeaderFields f;
    f.cluster_bits = config_.cluster_bits;
    f.virtual_size = config_.virtual_size;
    f.l1_size = static_cast<uint32_t>(l1_.size() / 8);
    f.l1_table_offset = l1_offset;
    f.refcount_table_offset = refcounts.table_offset;
    f.refcount_table_clusters = static_cast<uint32_t>(refcounts.table_clusters);
    f.refcount_order = config_.refcount_order;
    if (config_.compression == Compression::kZstd) {
      f.compression_type = qcow2::kCompressionZstd;
      f.incompatible_features |= qcow2::kIncompatCompression;
    }
    if (!config_.data_file.empty()) {
      f.incompatible_features |= qcow2::kIncompatDataFile;
      f.autoclear_features |= qcow2::kAutoclearDataFileRaw;
      f.data_file = config_.data_file;
    }
    f.backing_file = config_.backing_file;
    f.backing_format = config_.backing_format;
    f.bitmap_count = static_cast<uint32_t>(config_.bitmaps.size());
    if (f.bitmap_count > 0) {
      f.autoclear_features |= qcow2::kAutoclearBitmaps;
      f.bitmap_directory_size = bitmaps.size_bytes;
      f.bitmap_directory_offset = bitmaps.offset;
    }
    return f;
  }

  // Overlay only: maps every guest cluster to the same offset in the data file.
  Status MapIdentity() {
    for (uint64_t c = 0; c < cluster_count_; ++c) {
      BARGE_RETURN_IF_ERROR(Track(SetEntry(c, (c << config_.cluster_bits) | qcow2::kOflagCopied)));
    }
    return OkStatus();
  }

 private:
  Error failed_error() const { return Error::InvalidArgument("qcow2 writer: an earlier write failed"); }

  // Remembers the first failure after validation: the file is then
  // inconsistent and every later call is refused.
  Status Track(Status st) {
    if (!st.ok()) failed_ = true;
    return st;
  }

  Status CheckNext(uint64_t cluster_index) {
    if (finished_) return Error::InvalidArgument("qcow2 writer: write after Finish");
    if (failed_) return failed_error();
    if (cluster_index >= cluster_count_) {
      return Error::InvalidArgument("qcow2 writer: cluster " + Num(cluster_index) +
                                    " beyond the disk's " + Num(cluster_count_) + " clusters");
    }
    if (cluster_index < next_) {
      return Error::InvalidArgument("qcow2 writer: cluster " + Num(cluster_index) +
                                    " out of order (next must be at least " + Num(next_) + ")");
    }
    return OkStatus();
  }

  Status DoWriteData(uint64_t cluster_index, std::span<const std::byte> data) {
    BARGE_ASSIGN_OR_RETURN(uint64_t offset, host_.AppendClusters(data, "a data cluster"));
    ++stats_.data_clusters;
    return SetEntry(cluster_index, offset | qcow2::kOflagCopied);
  }

  Status DoWriteCompressed(uint64_t cluster_index, std::span<const std::byte> payload) {
    BARGE_ASSIGN_OR_RETURN(uint64_t offset, host_.AppendPacked(payload));
    ++stats_.compressed_clusters;
    return SetEntry(cluster_index, CompressedEntry(offset, payload.size()));
  }

  uint64_t CompressedEntry(uint64_t offset, uint64_t payload_bytes) const {
    uint64_t extra_sectors = ((offset + payload_bytes - 1) >> 9) - (offset >> 9);
    return qcow2::kOflagCompressed | (extra_sectors << qcow2::CompressedOffsetBits(config_.cluster_bits)) | offset;
  }

  // Records an L2 entry, writing the previous table once the stream has
  // left its range, so only one L2 table is ever held.
  Status SetEntry(uint64_t cluster_index, uint64_t entry) {
    uint64_t l1_index = cluster_index / l2_entries_;
    if (!table_.empty() && l1_index != table_l1_index_) BARGE_RETURN_IF_ERROR(FlushTable());
    if (table_.empty()) {
      table_.assign(cluster_size(), std::byte{0});
      table_l1_index_ = l1_index;
    }
    qcow2::StoreBe64(table_.data() + (cluster_index % l2_entries_) * 8, entry);
    next_ = cluster_index + 1;
    return OkStatus();
  }

  Status FlushTable() {
    if (table_.empty()) return OkStatus();
    uint64_t offset = 0;
    if (replaying_) {
      // The table the earlier writer wrote here is written again from the
      // entries replayed, not trusted (only the data was checked).
      BARGE_ASSIGN_OR_RETURN(offset, host_.SkipClusters(table_.size()));
      Status st = sink_.WriteAt(offset, table_);
      if (!st.ok()) {
        return std::move(st).error().Wrap("qcow2 writer: writing an L2 table at offset " + Num(offset));
      }
    } else {
      BARGE_ASSIGN_OR_RETURN(offset, host_.AppendClusters(table_, "an L2 table"));
    }
    // Every table is referenced once, so COPIED is set on its L1 entry.
    qcow2::StoreBe64(l1_.data() + table_l1_index_ * 8, offset | qcow2::kOflagCopied);
    table_.clear();
    table_.shrink_to_fit();
    return OkStatus();
  }

  Status DoFinish() {
    BARGE_RETURN_IF_ERROR(FlushTable());
    BARGE_ASSIGN_OR_RETURN(uint64_t l1_offset, host_.AppendClusters(l1_, "the L1 table"));
    BARGE_ASSIGN_OR_RETURN(qcow2::BitmapDirectory bitmaps,
                           qcow2::WriteBitmaps(host_, config_.bitmaps, config_.virtual_size));
    BARGE_ASSIGN_OR_RETURN(qcow2::RefcountLayout refcounts, host_.WriteRefcountArea());
    BARGE_ASSIGN_OR_RETURN(std::vector<std::byte> header,
                           EncodeHeader(HeaderFor(l1_offset, bitmaps, refcounts)));
    BARGE_RETURN_IF_ERROR(host_.WriteAt(0, header, "the header"));
    Status st = sink_.Flush();
    if (!st.ok()) return std::move(st).error().Wrap("qcow2 writer: flushing " + sink_.name());
    stats_.file_bytes = refcounts.end_offset;
    return OkStatus();
  }

  BlockSink& sink_;  // borrowed; must outlive the writer
  ImageConfig config_;
  HostFile host_;
  uint64_t l2_entries_;
  uint64_t cluster_count_;
  std::vector<std::byte> l1_;     // the whole L1 table, big-endian
  std::vector<std::byte> table_;  // the L2 table being filled; empty if none
  uint64_t table_l1_index_ = 0;
  uint64_t next_ = 0;  // lowest cluster index the next call may name
  bool finished_ = false;
  bool failed_ = false;
  bool replaying_ = false;  // inside Replay
  Qcow2WriterStats stats_;
};

// Validates `config`, checks that the header fits, and reserves cluster 0.
Result<std::unique_ptr<Qcow2WriterImpl>> StartImage(BlockSink& sink, ImageConfig config) {
  BARGE_ASSIGN_OR_RETURN(uint64_t l1_entries, ValidateConfig(config));
  if (sink.size_bytes() != 0) {
    return Error::InvalidArgument("qcow2 writer: sink " + sink.name() + " is not empty");
  }
  auto writer = std::make_unique<Qcow2WriterImpl>(sink, std::move(config), l1_entries);
  BARGE_RETURN_IF_ERROR(EncodeHeader(writer->HeaderFor(0, {}, {})));
  BARGE_RETURN_IF_ERROR(writer->Start());
  return writer;
}

Result<ImageConfig> ConfigFor(Qcow2WriterOptions options) {
  ImageConfig config;
  if (options.virtual_size > UINT64_MAX - (kSectorBytes - 1)) {
    return Error::InvalidArgument("qcow2 writer: virtual size too large");
  }
  config.virtual_size = RoundUpToSector(options.virtual_size);
  config.cluster_bits = options.cluster_bits;
  config.refcount_order = options.refcount_order;
  config.compression = options.compression;
  config.backing_file = std::move(options.backing_file);
  config.backing_format = std::move(options.backing_format);
  config.bitmaps = std::move(options.bitmaps);
  return config;
}

// A sink that keeps nothing: PlanStored replays into it.
class NullSink final : public BlockSink {
 public:
  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return 0; }
  Status WriteAt(uint64_t, std::span<const std::byte>) override { return OkStatus(); }
  Status Flush() override { return OkStatus(); }

 private:
  std::string name_ = "(plan)";
};

// A writer over `sink` with `stored` replayed; `offsets` (may be null)
// gets their host offsets.
Result<std::unique_ptr<Qcow2WriterImpl>> Replayed(BlockSink& sink, Qcow2WriterOptions options,
                                                  std::span<const StoredCluster> stored,
                                                  std::vector<uint64_t>* offsets) {
  BARGE_ASSIGN_OR_RETURN(ImageConfig config, ConfigFor(std::move(options)));
  BARGE_ASSIGN_OR_RETURN(uint64_t l1_entries, ValidateConfig(config));
  auto writer = std::make_unique<Qcow2WriterImpl>(sink, std::move(config), l1_entries);
  BARGE_RETURN_IF_ERROR(EncodeHeader(writer->HeaderFor(0, {}, {})));
  BARGE_ASSIGN_OR_RETURN(std::vector<uint64_t> placed, writer->Replay(stored));
  if (offsets != nullptr) *offsets = std::move(placed);
  return writer;
}

}  // namespace

Result<std::unique_ptr<Qcow2Writer>> Qcow2Writer::Create(BlockSink& sink, Qcow2WriterOptions options) {
  BARGE_ASSIGN_OR_RETURN(ImageConfig config, ConfigFor(std::move(options)));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Qcow2WriterImpl> writer, StartImage(sink, std::move(config)));
  return std::unique_ptr<Qcow2Writer>(std::move(writer));
}

Result<StoredLayout> Qcow2Writer::PlanStored(const Qcow2WriterOptions& options,
                                             std::span<const StoredCluster> stored) {
  NullSink sink;
  StoredLayout layout;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Qcow2WriterImpl> writer,
                         Replayed(sink, options, stored, &layout.host_offsets));
  layout.end_bytes = writer->end_bytes();
  return layout;
}

Result<std::unique_ptr<Qcow2Writer>> Qcow2Writer::Resume(BlockSink& sink, Qcow2WriterOptions options,
                                                         std::span<const StoredCluster> stored) {
  BARGE_ASSIGN_OR_RETURN(StoredLayout layout, PlanStored(options, stored));
  // What a killed writer appended after its last Sync goes first; the L2
  // tables the replay writes all lie below the end.
  Status cut = sink.Truncate(layout.end_bytes);
  if (!cut.ok()) return std::move(cut).error().Wrap("qcow2 writer: resuming " + sink.name());
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Qcow2WriterImpl> writer, Replayed(sink, std::move(options), stored, nullptr));
  return std::unique_ptr<Qcow2Writer>(std::move(writer));
}


Status WriteDataFileOverlay(BlockSink& sink, const OverlayOptions& options) {
  if (options.data_file_path.empty() || options.data_file_path.front() != '/') {
    return Error::InvalidArgument("qcow2 overlay: data file path '" + options.data_file_path +
                                  "' must be absolute (qemu resolves it against its working directory)");
  }
  if (options.virtual_size % kSectorBytes != 0) {
    return Error::InvalidArgument("qcow2 overlay: virtual size " + Num(options.virtual_size) +
                                  " is not a multiple of 512");
  }
  ImageConfig config;
  config.virtual_size = options.virtual_size;
  config.cluster_bits = options.cluster_bits;
  config.refcount_order = 4;
  config.data_file = options.data_file_path;
  config.bitmaps = options.bitmaps;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Qcow2WriterImpl> writer, StartImage(sink, std::move(config)));
  BARGE_RETURN_IF_ERROR(writer->MapIdentity());
  return writer->Finish();
}

}  // namespace barge::formats
