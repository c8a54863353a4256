// Persistent dirty bitmaps stored in qcow2 images: the bitmap directory and
// the dirty guest ranges of one bitmap. Layout: docs/formats/qcow2.md.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "blockio/extent.h"
#include "blockio/source.h"
#include "formats/image.h"
#include "formats/qcow2_header.h"

namespace barge::formats::qcow2 {

// One validated directory entry.
struct BitmapEntry {
  BitmapInfo info;
  uint32_t granularity_bits = 0;
  uint64_t entry_offset = 0;  // host offset of the directory entry
};

// Reads and validates the bitmap directory named by the header's bitmaps
// extension (returns an empty list when the extension is absent or not
// marked valid by autoclear bit 0). Checks qemu's limits: entry count equals
// nb_bitmaps, directory inside the file and exactly directory_size bytes,
// type 1, granularity 9..31, no extra data, name 1..1023 bytes and unique,
// no reserved flags, table offset aligned and inside the file, table size
// exactly what the virtual size and granularity need.
// Returns kCorruption naming the entry and offset otherwise. May block.
Result<std::vector<BitmapEntry>> ReadBitmapDirectory(BlockSource& file, const Header& header);

}  // namespace barge::formats::qcow2

namespace barge::formats {

// The dirty guest byte ranges of the persistent bitmap `bitmap_name` in the
// top layer of `image` (as returned by OpenImage), normalized and clipped to
// the virtual size. Each set bit covers one granule.
// Returns:
//   kNotSupported  `image` is not qcow2 (e.g. raw);
//   kNotFound      no bitmap of that name;
//   kCorruption    the bitmap is in use (stale after a crash: take a full
//                  backup), or its table or data are malformed (a data
//                  cluster named by two table entries included);
//   kNotSupported  more than 16M separate dirty ranges (take a full backup).
// Thread-safe; may block.
Result<RangeList> ReadBitmapDirtyRanges(const Image& image, std::string_view bitmap_name);

}  // namespace barge::formats
