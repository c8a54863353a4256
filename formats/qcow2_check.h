// Structural check of a qcow2 file (barge check), in the spirit of
// `qemu-img check`: recompute every reference count and compare.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blockio/source.h"

namespace barge::formats::qcow2 {

struct CheckOptions {
  // Keep at most this many problem descriptions (counts are always exact).
  size_t max_messages = 100;
  // Refuse files with more clusters than this (8 bytes of memory each).
  uint64_t max_file_clusters = uint64_t{1} << 27;
  // Stop with kNotSupported after reading this many metadata bytes. 0: four
  // times the file's size plus 256 MiB. Each L1 and L2 table is read once
  // however often it is referenced, so a sound image reads each metadata
  // byte about once; crafted ones (overlapping snapshot L1 tables) are cut
  // short.
  uint64_t max_scan_bytes = 0;
};

struct CheckReport {
  uint64_t corruptions = 0;         // refcount too low, bad offsets, COPIED mismatches...
  uint64_t leaks = 0;               // clusters whose refcount is higher than their references
  uint64_t allocated_clusters = 0;  // guest clusters with data, compressed or ZERO_ALLOC
  uint64_t total_clusters = 0;      // guest clusters of the virtual disk
  uint64_t file_clusters = 0;       // host clusters of the file
  // As qemu-img check counts them (active L1 table only): compressed guest
  // clusters, and fragmented ones (compressed, or stored elsewhere than
  // right after the previous cluster of the same L2 table).
  uint64_t compressed_clusters = 0;
  uint64_t fragmented_clusters = 0;
  // One past the last host cluster that is referenced or has a refcount,
  // in bytes (qemu-img check's "Image end offset").
  uint64_t image_end_offset = 0;
  std::vector<std::string> messages;  // the first problems, qemu-like wording

  bool clean() const { return corruptions == 0 && leaks == 0; }
  // The `barge check` exit code: 0 clean, 2 corruption, 3 leaks only.
  int exit_code() const { return corruptions ? 2 : leaks ? 3 : 0; }
};

// Checks the image in `file` (the .qcow2 file itself; its backing and data
// files are not opened). Counts a reference for: the header cluster, the
// active and snapshot L1 tables and their L2 tables, data and ZERO_ALLOC
// clusters (not when they live in an external data file), every host cluster
// a compressed payload touches, the refcount table and blocks, the snapshot
// table, the bitmap directory, tables and data clusters. Then compares with
// the stored refcounts and the COPIED flags. What counts as a corruption
// (reserved bits, misaligned offsets, regions past the end of the file,
// shared refcount blocks...) follows `qemu-img check`; the rules and the
// few places where barge is stricter are in docs/formats/qcow2.md §3.1.
// Returns the report, or an error when the header cannot be parsed
// (kCorruption/kNotSupported), the file is too large for max_file_clusters
// or needs more than max_scan_bytes of reads (kNotSupported), or the file cannot be read (kIoError). May block; the
// memory used is about 8 bytes per host cluster.
Result<CheckReport> CheckQcow2(BlockSource& file, const CheckOptions& options = {});

}  // namespace barge::formats::qcow2
