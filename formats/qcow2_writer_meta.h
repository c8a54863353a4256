// Metadata encoders for the one-pass qcow2 writer: the version 3 header with
// its extensions (QCOW2.md §1, §7) and persistent dirty bitmaps (§6).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "formats/qcow2_writer.h"
#include "formats/qcow2_writer_host.h"

namespace barge::formats::qcow2 {

// Everything the header of a new image records.
struct HeaderFields {
  uint32_t cluster_bits = 16;
  uint64_t virtual_size = 0;
  uint32_t l1_size = 0;
  uint64_t l1_table_offset = 0;
  uint64_t refcount_table_offset = 0;
  uint32_t refcount_table_clusters = 0;
  uint64_t incompatible_features = 0;
  uint64_t autoclear_features = 0;
  uint32_t refcount_order = 4;
  uint8_t compression_type = 0;     // byte 104; non-zero needs incompatible bit 3
  std::string_view backing_file;    // stored after the end marker
  std::string_view backing_format;  // extension 0xE2792ACA; required with a backing file
  std::string_view data_file;       // extension "DATA"
  uint32_t bitmap_count = 0;        // bitmaps extension when non-zero
  uint64_t bitmap_directory_size = 0;
  uint64_t bitmap_directory_offset = 0;
};

// The bytes of cluster 0 up to the end of the backing file name: the 112-byte
// header, the extensions (backing format or data file, bitmaps), the end
// marker, then the name. kInvalidArgument if it does not fit in one cluster.
Result<std::vector<std::byte>> EncodeHeader(const HeaderFields& fields);

// Entries in a bitmap's table: ceil(ceil(ceil(size/gran)/8)/cs).
uint64_t BitmapTableEntries(uint64_t virtual_size, uint64_t granularity_bytes,
                            uint32_t cluster_bits);

// Checks names (unique, 1..1023 bytes), granularities (powers of two from
// 512 to 2^31), count and sizes against qemu's limits.
Status ValidateBitmaps(const std::vector<BitmapSpec>& bitmaps, uint64_t virtual_size,
                       uint32_t cluster_bits);

struct BitmapDirectory {
  uint32_t count = 0;
  uint64_t offset = 0;
  uint64_t size_bytes = 0;
};

// Appends each bitmap's data clusters (only chunks with a dirty bit) and its
// table, then the directory, through `host`. Dirty ranges are clipped to
// the disk. Returns where the directory went (count 0: nothing written).
Result<BitmapDirectory> WriteBitmaps(HostFile& host, const std::vector<BitmapSpec>& bitmaps,
                                     uint64_t virtual_size);

}  // namespace barge::formats::qcow2
