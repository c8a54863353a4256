// The CBT overlay creator (pipeline/cbt_overlay.h).
#include "pipeline/cbt_overlay.h"

#include <memory>

#include "blockio/memory.h"
#include "formats/image.h"
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

Result<CbtOverlayImage> BuildCbtOverlay(const std::string& data_file, uint64_t data_size, uint32_t cluster_bits,
                                        const std::vector<formats::BitmapSpec>& bitmaps) {
  CbtOverlayImage made;
  BARGE_ASSIGN_OR_RETURN(made.virtual_size, VirtualSize(data_file, data_size, &made.warning));
  formats::OverlayOptions o;
  o.virtual_size = made.virtual_size;
  o.data_file_path = data_file;
  o.cluster_bits = cluster_bits;
  o.bitmaps = bitmaps;
  MemorySink sink;
  BARGE_RETURN_IF_ERROR(formats::WriteDataFileOverlay(sink, o));
  std::vector<std::byte> bytes = sink.contents();
  made.bytes = std::move(bytes);
  return made;
}

}  // namespace barge::pipeline
