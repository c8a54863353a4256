// The qcow2 internal snapshot table: parsing (for info, the checker, the
// editor and snapshot views), encoding as qemu writes it, and lookup by id
// or name. The byte layout is in docs/formats/qcow2.md §5.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "blockio/source.h"
#include "formats/image.h"
#include "formats/qcow2_header.h"

namespace barge::formats::qcow2 {

// qemu's limits (QCOW_MAX_SNAPSHOTS, QCOW_MAX_SNAPSHOTS_SIZE,
// QCOW_MAX_SNAPSHOT_EXTRA_DATA) and the extra data barge (and qemu) write:
// vm_state_size_large, disk_size, icount.
inline constexpr uint32_t kMaxSnapshots = 65536;
inline constexpr uint64_t kMaxSnapshotTableBytes = 64ull << 20;
inline constexpr uint32_t kMaxSnapshotExtraBytes = 1024;
inline constexpr uint32_t kSnapshotKnownExtraBytes = 24;
// qemu keeps names and ids in fixed buffers (char name[256], id_str[128])
// and truncates longer ones silently; barge refuses them.
inline constexpr size_t kMaxSnapshotNameBytes = 255;
inline constexpr size_t kMaxSnapshotIdBytes = 127;

struct SnapshotTable {
  std::vector<SnapshotInfo> snapshots;
  // Per entry, the extra data past the 24 bytes barge knows, kept byte for
  // byte when the table is rewritten (qemu does the same).
  std::vector<std::vector<std::byte>> unknown_extra;
  // Per entry, the extra data's size as stored (qemu-img check wants at
  // least 16 bytes in a version 3 image).
  std::vector<uint32_t> extra_bytes;
  uint64_t table_bytes = 0;  // bytes of the table at header.snapshots_offset
};

// Reads and validates the table (nb_snapshots entries at snapshots_offset):
// at most 65536 entries, the table lies inside the file and below 64 MiB,
// each entry's extra data is at most 1 KiB, each snapshot L1 table is
// aligned, at most 32 MiB and inside the file. Returns kCorruption naming
// the entry otherwise. May block.
Result<SnapshotTable> ReadSnapshotTable(BlockSource& file, const Header& header);

// The table as qemu writes it: each entry 8-byte aligned, with at least 24
// bytes of extra data (vm_state_size_large, disk_size, icount) followed by
// the entry's unknown extra data, the id and the name; the 32-bit VM state
// size is 0 when the size does not fit. `unknown_extra` is empty or has one
// element per snapshot. The last entry is not padded.
std::vector<std::byte> EncodeSnapshotTable(const std::vector<SnapshotInfo>& snapshots,
                                           const std::vector<std::vector<std::byte>>& unknown_extra);

// The index of the snapshot that `id_or_name` names, as qemu looks it up
// (an id first, then a name), except that a name shared by several
// snapshots is refused instead of taking the first.
// Returns kNotFound, or kInvalidArgument for an ambiguous name (the message
// lists the ids to use instead).
Result<size_t> FindSnapshot(const std::vector<SnapshotInfo>& snapshots, std::string_view id_or_name);

// The id qemu gives a new snapshot: one more than the largest id read as a
// decimal number (strtoul: leading digits, 0 when there are none).
std::string NextSnapshotId(const std::vector<SnapshotInfo>& snapshots);

// kInvalidArgument unless `name` fits qemu's buffer (at most 255 bytes) and
// holds no NUL byte. qemu accepts an empty name; so does this.
Status ValidateSnapshotName(std::string_view name);

}  // namespace barge::formats::qcow2
