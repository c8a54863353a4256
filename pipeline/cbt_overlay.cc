// The CBT overlay creator (pipeline/cbt_overlay.h).
#include "pipeline/cbt_overlay.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "formats/image.h"
#include "formats/qcow2_format.h"
#include "formats/units.h"
#include "pipeline/staged_file.h"

namespace barge::pipeline {
namespace {

// What QEMU sees of a data file of `size` bytes: floor(size/512)*512, never
// more than the file has; a warning when the tail is cut.
Result<uint64_t> VirtualSize(const std::string& data_file, uint64_t size, std::string* warning) {
  const uint64_t virtual_size = size & ~uint64_t{511};
  if (virtual_size == 0) {
    return Error::InvalidArgument("data file is smaller than one 512-byte sector (" + formats::HumanBytesExact(size) +
                                  ")")
        .set_path(data_file);
  }
  if (virtual_size != size) {
    *warning = "size " + formats::HumanBytesExact(size) + " is not a multiple of 512: the guest sees " +
               formats::HumanBytesExact(virtual_size) + " (the last " + std::to_string(size - virtual_size) +
               " bytes are not part of the disk)";
  }
  return virtual_size;
}

// The overlay's bytes handed on in pieces as the qcow2 writer makes them.
// The writer appends front to back, and writes the header into cluster 0
// at the end: cluster 0 (or the head, when larger) is held here until
// Finish; every other write must start at or after the end of the last
// (zeros fill a gap), and goes into the one piece being filled, passed on
// when it reaches kCbtOverlayPieceBytes. One thread at a time.
class PieceSink final : public BlockSink {
 public:
  // `piece` must outlive the sink.
  PieceSink(uint32_t cluster_bits, const CbtOverlayPiece& piece)
      : held_(HeldBytes(cluster_bits)), piece_(piece), filling_offset_(held_.size()) {
    static_assert((size_t{1} << formats::qcow2::kMaxClusterBits) <= kCbtOverlayPieceBytes);
    filling_.reserve(kCbtOverlayPieceBytes);
  }

  const std::string& name() const override { return name_; }
  uint64_t size_bytes() const override { return end_; }
  // Not zero-initialized: the writer writes its zeros too (a piece is the
  // file's bytes, gaps or not).
  SinkCapabilities capabilities() const override { return {}; }
  Status Flush() override { return OkStatus(); }

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    if (piece_error_) return *piece_error_;
    end_ = std::max(end_, offset + data.size());
    if (offset < held_.size()) {
      const size_t n = std::min<size_t>(data.size(), held_.size() - offset);
      std::memcpy(held_.data() + offset, data.data(), n);
      offset += n;
      data = data.subspan(n);
    }
    if (data.empty()) return OkStatus();
    const uint64_t filled_end = filling_offset_ + filling_.size();
    if (offset < filled_end) {
      return Error::InvalidArgument("CBT overlay: write at offset " + std::to_string(offset) +
                                    " behind the bytes already passed on (" + std::to_string(filled_end) + ")");
    }
    for (uint64_t gap = offset - filled_end; gap > 0;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(gap, kCbtOverlayPieceBytes - filling_.size()));
      filling_.resize(filling_.size() + n, std::byte{0});
      gap -= n;
      BARGE_RETURN_IF_ERROR(PassOnWhenFull());
    }
    while (!data.empty()) {
      const size_t n = std::min(data.size(), kCbtOverlayPieceBytes - filling_.size());
      filling_.insert(filling_.end(), data.begin(), data.begin() + static_cast<ptrdiff_t>(n));
      data = data.subspan(n);
      BARGE_RETURN_IF_ERROR(PassOnWhenFull());
    }
    return OkStatus();
  }

  // After the writer's last write: the piece being filled, then cluster 0
  // past the head, then the head.
  Status Finish() {
    if (piece_error_) return *piece_error_;
    if (!filling_.empty()) BARGE_RETURN_IF_ERROR(PassOn(filling_offset_, filling_));
    const size_t held_end = static_cast<size_t>(std::min<uint64_t>(end_, held_.size()));
    const size_t head = std::min<size_t>(kCbtOverlayHeadBytes, held_end);
    const std::span<const std::byte> held(held_);
    if (held_end > head) BARGE_RETURN_IF_ERROR(PassOn(head, held.subspan(head, held_end - head)));
    return PassOn(0, held.first(head));
  }

  // Cluster 0, and at least the head (small clusters). A cluster size the
  // writer refuses holds just the head (nothing is written then).
  static size_t HeldBytes(uint32_t cluster_bits) {
    if (cluster_bits < formats::qcow2::kMinClusterBits || cluster_bits > formats::qcow2::kMaxClusterBits) {
      return kCbtOverlayHeadBytes;
    }
    return std::max<size_t>(size_t{1} << cluster_bits, kCbtOverlayHeadBytes);
  }

  // The error `piece` returned, if it did.
  const std::optional<Error>& piece_error() const { return piece_error_; }

 private:
  Status PassOnWhenFull() {
    if (filling_.size() < kCbtOverlayPieceBytes) return OkStatus();
    BARGE_RETURN_IF_ERROR(PassOn(filling_offset_, filling_));
    filling_offset_ += filling_.size();
    filling_.clear();
    return OkStatus();
  }

  Status PassOn(uint64_t offset, std::span<const std::byte> bytes) {
    Status st = piece_(offset, bytes);
    if (!st.ok()) piece_error_ = st.error();
    return st;
  }

  std::string name_ = "(CBT overlay)";
  std::vector<std::byte> held_;     // cluster 0, the header's
  const CbtOverlayPiece& piece_;    // borrowed; must outlive the sink
  std::vector<std::byte> filling_;  // the bytes at filling_offset_ not yet passed on
  uint64_t filling_offset_;
  uint64_t end_ = 0;  // the end of the furthest write
  std::optional<Error> piece_error_;
};

}  // namespace

Result<CbtOverlay> CreateCbtOverlay(Env& env, const CbtOverlayRequest& req) {
  CbtOverlay made;
  BARGE_ASSIGN_OR_RETURN(made.data_file, env.RealPath(req.data_file));
  BARGE_ASSIGN_OR_RETURN(made.data_stat, env.Stat(made.data_file));
  const FileStat& st = made.data_stat;
  if (!st.is_regular()) {
    return Error::InvalidArgument("data file must be a regular raw file").set_path(req.data_file);
  }
  // The data file holds the guest's raw bytes: an image there (a qcow2
  // above all) would be shown to the guest as its own bytes, header and
  // all, and written through as raw.
  if (req.refuse_image_data) {
    BARGE_ASSIGN_OR_RETURN(auto file, env.OpenSource(made.data_file));
    auto probed = formats::ProbeFormatName(*file);
    if (!probed.ok()) return Error(probed.error()).set_path(req.data_file);
    if (*probed != "raw") {
      return Error::InvalidArgument("is a " + *probed +
                                    " image, not a raw disk: an overlay's data file holds the guest's raw "
                                    "bytes (convert it first: barge convert " + req.data_file + " DISK.raw)")
          .set_path(req.data_file);
    }
  }
  BARGE_ASSIGN_OR_RETURN(made.virtual_size, VirtualSize(req.data_file, st.size_bytes, &made.warning));
  formats::OverlayOptions o;
  o.virtual_size = made.virtual_size;
  o.data_file_path = made.data_file;
  o.cluster_bits = req.cluster_bits;
  o.bitmaps = req.bitmaps;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<StagedFile> staged, StagedFile::Create(env, req.overlay));
  BARGE_RETURN_IF_ERROR(formats::WriteDataFileOverlay(staged->sink(), o));
  BARGE_RETURN_IF_ERROR(staged->Commit());
  return made;
}

Result<CbtOverlayImage> StreamCbtOverlay(const std::string& data_file, uint64_t data_size, uint32_t cluster_bits,
                                         const std::vector<formats::BitmapSpec>& bitmaps,
                                         const CbtOverlayPiece& piece) {
  CbtOverlayImage made;
  BARGE_ASSIGN_OR_RETURN(made.virtual_size, VirtualSize(data_file, data_size, &made.warning));
  formats::OverlayOptions o;
  o.virtual_size = made.virtual_size;
  o.data_file_path = data_file;
  o.cluster_bits = cluster_bits;
  o.bitmaps = bitmaps;
  PieceSink sink(cluster_bits, piece);
  Status st = formats::WriteDataFileOverlay(sink, o);
  if (st.ok()) st = sink.Finish();
  // The caller's own error, not the writer's wrapping of it.
  if (sink.piece_error()) return *sink.piece_error();
  BARGE_RETURN_IF_ERROR(st);
  made.size_bytes = sink.size_bytes();
  return made;
}

}  // namespace barge::pipeline
