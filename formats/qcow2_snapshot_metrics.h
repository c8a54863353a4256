// Space metrics of every internal snapshot of a qcow2 image (and of the
// active image), computed in one pass over the L1 and L2 tables, in the
// terms of ZFS snapshot properties (EVE's snapshot design). Definitions in
// docs/snapshots.md.
#pragma once

#include <cstdint>
#include <vector>

#include "blockio/error.h"
#include "blockio/source.h"
#include "formats/image.h"

namespace barge::formats {

struct SnapshotUsage {
  // The view's disk size (the snapshot's, or the image's for the active one).
  uint64_t vol_size = 0;
  // Bytes of the file its L1 table reaches: its L1 table and L2 tables (whole
  // clusters), uncompressed data and preallocated zero clusters (whole
  // clusters) and compressed payloads (their stored bytes).
  uint64_t referenced = 0;
  // Guest bytes (inside vol_size) it maps to data, compressed or not.
  uint64_t logical_referenced = 0;
  // Bytes of the clusters no other snapshot and not the active image use:
  // what deleting it frees (for the active image: what only it holds).
  uint64_t used = 0;
  // Stored data bytes it maps that the previous snapshot (table order) does
  // not map at the same guest offset; for the first snapshot all its data,
  // for the active image what changed since the last snapshot.
  uint64_t written = 0;
  // logical bytes of its data / stored bytes of its data (1.0 without data).
  double compress_ratio = 1.0;
};

struct SnapshotMetrics {
  SnapshotInfo info;
  SnapshotUsage usage;
};

struct SnapshotMetricsReport {
  uint32_t cluster_size = 0;
  std::vector<SnapshotMetrics> snapshots;  // table order
  SnapshotUsage active;
};

struct SnapshotMetricsOptions {
  // Refuse files with more clusters than this (4 bytes of memory each).
  uint64_t max_file_clusters = uint64_t{1} << 28;
};

// Reads the header, the snapshot table and every L1 and L2 table once (a
// table several views share is read once) and computes each view's usage.
// Memory: 4 bytes per host cluster plus one L2 table per view at a time.
// Returns kNotSupported for a file that is not qcow2 or too large,
// kCorruption for malformed tables (offsets misaligned or outside the
// file), kIoError from the file. May block.
Result<SnapshotMetricsReport> ComputeSnapshotMetrics(BlockSource& file,
                                                     const SnapshotMetricsOptions& options = {});

}  // namespace barge::formats
