// The CBT overlay: a metadata-only qcow2 over a raw disk (data-file,
// data-file-raw) that carries persistent dirty bitmaps. One creator for
// `barge overlay create` and `barge cbt enable` (orchestrate/vm/cbt.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
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
// open), made here in pieces for the caller to put there: `data_file` is
// its absolute path as that host names it (stored as is), `data_size` its
// size in bytes as that host reports it; nothing is checked of the file
// itself. The overlay is metadata only, about 1/8192 of the disk with
// 64 KiB clusters (its L2 tables: 128 MiB per TiB), and is never held
// whole: `piece(offset, bytes)` is called with consecutive pieces of at
// most kCbtOverlayPieceBytes in offset order from kCbtOverlayHeadBytes to
// the end, then once, last, with the head [0, kCbtOverlayHeadBytes) that
// holds the qcow2 header's magic (a caller that writes the pieces in
// order leaves no qcow2 image when cut short). The pieces cover the file
// once; `bytes` is valid only during the call. Memory stays at a few MiB
// whatever the disk's size (the piece being filled and the qcow2 writer's
// own 4 MiB append buffer).
// Returns the overlay's size and facts; the first error `piece` returns
// (no piece follows it); the same errors as CreateCbtOverlay for the size;
// kInvalidArgument for a relative path.
inline constexpr uint64_t kCbtOverlayHeadBytes = 4096;
inline constexpr size_t kCbtOverlayPieceBytes = 4 << 20;
struct CbtOverlayImage {
  uint64_t size_bytes = 0;  // the overlay file's length
  uint64_t virtual_size = 0;
  std::string warning;
};
using CbtOverlayPiece = std::function<Status(uint64_t offset, std::span<const std::byte> bytes)>;
Result<CbtOverlayImage> StreamCbtOverlay(const std::string& data_file, uint64_t data_size, uint32_t cluster_bits,
                                         const std::vector<formats::BitmapSpec>& bitmaps,
                                         const CbtOverlayPiece& piece);

}  // namespace barge::pipeline
