// The CBT overlay creator (pipeline/cbt_overlay.h).
#include "pipeline/cbt_overlay.h"

#include <memory>

#include "formats/image.h"
#include "formats/units.h"
#include "pipeline/staged_file.h"

namespace barge::pipeline {

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
  // QEMU sees floor(size/512)*512 bytes; never claim more than the file has.
  made.virtual_size = st.size_bytes & ~uint64_t{511};
  if (made.virtual_size == 0) {
    return Error::InvalidArgument("data file is smaller than one 512-byte sector (" +
                                  formats::HumanBytesExact(st.size_bytes) + ")")
        .set_path(req.data_file);
  }
  if (made.virtual_size != st.size_bytes) {
    made.warning = "size " + formats::HumanBytesExact(st.size_bytes) + " is not a multiple of 512: the guest sees " +
                   formats::HumanBytesExact(made.virtual_size) + " (the last " +
                   std::to_string(st.size_bytes - made.virtual_size) + " bytes are not part of the disk)";
  }
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

}  // namespace barge::pipeline
