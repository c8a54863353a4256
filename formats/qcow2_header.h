// Parsing and validation of the qcow2 header, its extensions and the backing
// file name (cluster 0). The byte layout is in docs/formats/qcow2.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "blockio/error.h"
#include "blockio/source.h"
#include "formats/qcow2_format.h"

namespace barge::formats::qcow2 {

// The decoded header. Every field has passed the checks listed in
// ParseHeader; derived sizes are safe to compute without overflow.
struct Header {
  uint32_t version = 0;
  uint64_t backing_file_offset = 0;
  uint32_t backing_file_size = 0;
  uint32_t cluster_bits = 0;
  uint64_t size = 0;  // virtual size, rounded down to 512 as qemu does
  uint32_t crypt_method = 0;
  uint32_t l1_size = 0;
  uint64_t l1_table_offset = 0;
  uint64_t refcount_table_offset = 0;
  uint32_t refcount_table_clusters = 0;
  uint32_t nb_snapshots = 0;
  uint64_t snapshots_offset = 0;
  uint64_t incompatible_features = 0;
  uint64_t compatible_features = 0;
  uint64_t autoclear_features = 0;
  uint32_t refcount_order = 4;
  uint32_t header_length = 0;
  uint8_t compression_type = kCompressionDeflate;

  // From the extensions.
  std::string backing_file;    // "" when there is none
  std::string backing_format;  // "" when the extension is absent
  std::string data_file;       // "" when the extension is absent
  bool has_bitmaps_extension = false;  // present (whatever the autoclear bit)
  uint32_t nb_bitmaps = 0;
  uint64_t bitmap_directory_size = 0;
  uint64_t bitmap_directory_offset = 0;
  uint64_t extensions_end = 0;  // first byte after the end marker (or area)

  uint64_t cluster_size() const { return ClusterSize(cluster_bits); }
  bool extended_l2() const { return incompatible_features & kIncompatExtendedL2; }
  bool has_data_file() const { return incompatible_features & kIncompatDataFile; }
  bool data_file_raw() const { return autoclear_features & kAutoclearDataFileRaw; }
  // The bitmaps extension is present and its autoclear bit says it is valid.
  // Without the bit qemu ignores the bitmaps (their clusters count as leaks).
  bool bitmaps_valid() const {
    return has_bitmaps_extension && (autoclear_features & kAutoclearBitmaps);
  }
  uint64_t l2_entries() const { return L2Entries(cluster_bits, extended_l2()); }
  uint32_t l2_entry_bytes() const { return extended_l2() ? 16 : 8; }
  uint64_t refcount_table_bytes() const {
    return uint64_t{refcount_table_clusters} << cluster_bits;
  }
};

// Parses `cluster0`, the first min(cluster size, file size) bytes of the file
// (more bytes are ignored). Checks, per docs/formats/qcow2.md: magic,
// version 2 or 3, cluster_bits 9..21, header_length rules, crypt_method,
// feature bits, refcount_order 0..6, L1 size and offset (inside the file,
// at most 32 MiB, large enough for the virtual size), refcount table
// (aligned, at most 8 MiB), snapshot table offset, extension records (inside
// the extension area, no duplicates), backing name (<= 1023 bytes, after the
// extensions, inside cluster 0) and data-file flags.
// Returns:
//   kCorruption   a field breaks the format (message names field and offset);
//   kNotSupported version other than 2/3, encryption, unknown incompatible
//                 bits, unknown compression type.
Result<Header> ParseHeader(std::span<const std::byte> cluster0, uint64_t file_size);

// Reads cluster 0 from `file` and parses it. May block.
Result<Header> ReadHeader(BlockSource& file);

}  // namespace barge::formats::qcow2
