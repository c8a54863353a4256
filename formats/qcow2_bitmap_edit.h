// In-place edits of the persistent bitmaps of an existing qcow2 image (no
// qemu process): remove bitmaps, add empty ones, clear, enable or disable
// them, rotate a CBT bitmap (qemu-img bitmap's operations but --merge). The
// write order and the crash states are in docs/formats/qcow2.md §4.1.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/sink.h"
#include "blockio/source.h"
#include "formats/image.h"
#include "formats/qcow2_writer.h"

namespace barge::formats {

struct BitmapEdit {
  // Bitmaps to remove (their table and data clusters freed). Each must exist
  // and be named once.
  std::vector<std::string> remove;
  // Bitmaps to add, empty (all clean), with this name, granularity and
  // enabled ("auto") flag. `dirty` must be empty. A name that exists and is
  // not also in `remove` is an error.
  std::vector<BitmapSpec> add;
  // Bitmaps to clear (all clean): each keeps its name, granularity, flags
  // and place in the directory and gets a new table of zero entries; its old
  // table and data clusters are freed. Each must exist, be named once and
  // not be in `remove`.
  std::vector<std::string> clear;
  // Bitmaps whose "auto" flag is set (enable: the bitmap tracks writes) or
  // cleared (disable: frozen). Each must exist, be named once in the two
  // lists together and not be in `remove`; it may also be in `clear`.
  // Enabling an enabled bitmap (disabling a disabled one) is no change.
  std::vector<std::string> enable;
  std::vector<std::string> disable;

  bool empty() const {
    return remove.empty() && add.empty() && clear.empty() && enable.empty() && disable.empty();
  }
};

// Applies `edit` to the qcow2 image whose bytes `file` reads and `sink`
// writes (the same file; `file` must show its contents before the call, and
// everything is read from it before the first write). Kept bitmaps keep
// their directory entry, table, data and flags byte for byte, but for the
// table offset of a cleared one and the auto flag of an enabled or disabled
// one. New clusters (bitmap tables, the directory, refcount blocks where the
// existing ones do not reach) go after the end of the file; freed clusters
// get refcount 0 and the file is not truncated. An edit that changes
// nothing (empty, or only enabling enabled bitmaps and disabling disabled
// ones) writes nothing.
//
// Crash safety: every prefix of the writes leaves an image that qemu-img
// check accepts, with at most leaked clusters, and bitmaps that are the old
// set, the old set with (some of) the removed bitmaps marked in_use, or the
// new set. (Cleared bitmaps are not marked: until the switch to the new
// directory their old table and data stay referenced and intact.)
//
// The caller must make sure no qemu process has the image open (qemu sets
// in_use on every bitmap while it runs, so that case is refused too).
//
// Returns:
//   ok
//   kNotSupported     not a qcow2 file; version 2; dirty (lazy refcounts)
//                     image; new clusters would need a larger refcount
//                     table; the header extensions would not fit in
//                     cluster 0; `add` with dirty ranges; new clusters on a
//                     sink that cannot grow (a block device);
//   kNotFound         a bitmap in `remove`, `clear`, `enable` or `disable`
//                     does not exist;
//   kInvalidArgument  duplicate names, a new name that exists, a bad name or
//                     granularity, a bitmap both removed and otherwise
//                     changed or both enabled and disabled, or a kept
//                     bitmap with the in_use flag (the image is open in qemu
//                     or was not closed cleanly: such a bitmap may only be
//                     removed);
//   kCorruption       malformed header, bitmap directory, bitmap table or
//                     refcount structures (nothing was written), or an image
//                     marked corrupt;
//   kIoError/kNoSpace from the file (the image is then in one of the crash
//                     states above).
// May block. Single caller at a time per image.
Status EditBitmaps(BlockSource& file, BlockSink& sink, const BitmapEdit& edit);

// Removes `old_name` and adds `new_name`, enabled, with the granularity of
// `old_name` (the CBT rotation after a backup). Errors as EditBitmaps.
Status RotateBitmap(BlockSource& file, BlockSink& sink, const std::string& old_name,
                    const std::string& new_name);

// Opens a file for writing in place (e.g. blockio's
// OpenFileSink(path, SinkMode::kExisting)); formats/ cannot open files.
using SinkOpener = std::function<Result<std::unique_ptr<BlockSink>>(const std::string& path)>;

// The same on the file at `path`, opened through `open_source` (read) and
// `open_sink` (write in place).
Status EditBitmaps(const std::string& path, const SourceOpener& open_source,
                   const SinkOpener& open_sink, const BitmapEdit& edit);
Status RotateBitmap(const std::string& path, const SourceOpener& open_source,
                    const SinkOpener& open_sink, const std::string& old_name,
                    const std::string& new_name);

}  // namespace barge::formats
