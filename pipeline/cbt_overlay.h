// The CBT overlay: a metadata-only qcow2 over a raw disk (data-file,
// data-file-raw) that carries persistent dirty bitmaps. One creator for
// `barge overlay create` and `barge cbt enable` (orchestrate/vm/cbt.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/qcow2_writer.h"

namespace barge::pipeline {

struct CbtOverlayRequest {
  std::string data_file;  // the raw disk; the overlay names its real path
  std::string overlay;    // the qcow2 file to create (staged, renamed into place)
  uint32_t cluster_bits = 16;
  std::vector<formats::BitmapSpec> bitmaps;  // e.g. one enabled, empty "cbt0"
  // Refuse a data file whose first bytes are an image (qcow2...): a user's
  // mix-up (`overlay create`), as the guest would see the header as its
  // own bytes. CBT enable turns it off: there libvirt's format='raw' says
  // the bytes are the guest's, whatever they look like.
  bool refuse_image_data = true;
};

struct CbtOverlay {
  std::string data_file;      // its real path, as stored in the overlay
  FileStat data_stat;         // the data file's, before the overlay was made
  uint64_t virtual_size = 0;  // the data file's size rounded down to 512 (what QEMU sees)
  // Set when the data file's size is not a multiple of 512 (the tail is not
  // part of the disk); the caller reports it.
  std::string warning;
};

// Checks the data file (a regular file of at least 512 bytes; with
// refuse_image_data, not an image), then writes the overlay
// (formats::WriteDataFileOverlay) through a staged file committed by
// rename; the data file is never written.
// Returns the overlay's facts; kInvalidArgument (with the data file's path)
// for a data file that is not a regular file, is an image, or is smaller
// than a sector; the errno Error of a failed resolve, stat or write.
Result<CbtOverlay> CreateCbtOverlay(Env& env, const CbtOverlayRequest& req);

// The overlay of a data file on another host (that this process cannot
// open), in memory for the caller to put there: `data_file` is its absolute
// path as that host names it (stored as is), `data_size` its size in bytes
// as that host reports it; nothing is checked of the file itself. The
// bytes are the overlay's metadata: about 1/8192 of the disk with 64 KiB
// clusters (its L2 tables). Same result and errors as CreateCbtOverlay
// for the size; kInvalidArgument for a relative path.
struct CbtOverlayImage {
  std::vector<std::byte> bytes;
  uint64_t virtual_size = 0;
  std::string warning;
};
Result<CbtOverlayImage> BuildCbtOverlay(const std::string& data_file, uint64_t data_size, uint32_t cluster_bits,
                                        const std::vector<formats::BitmapSpec>& bitmaps);

}  // namespace barge::pipeline
