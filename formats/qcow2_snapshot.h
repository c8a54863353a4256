// The qcow2 internal snapshot table: listed for `info` and counted by the
// checker; barge never reverts to or writes internal snapshots.
#pragma once

#include <cstdint>
#include <vector>

#include "blockio/source.h"
#include "formats/image.h"
#include "formats/qcow2_header.h"

namespace barge::formats::qcow2 {

struct SnapshotTable {
  std::vector<SnapshotInfo> snapshots;
  uint64_t table_bytes = 0;  // bytes of the table at header.snapshots_offset
};

// Reads and validates the table (nb_snapshots entries at snapshots_offset):
// the table lies inside the file and below 64 MiB, each entry's extra data
// is at most 1 KiB, each snapshot L1 table is aligned, at most 32 MiB and
// inside the file. Returns kCorruption naming the entry otherwise. May block.
Result<SnapshotTable> ReadSnapshotTable(BlockSource& file, const Header& header);

}  // namespace barge::formats::qcow2
