// Internal to formats: a copy-on-write image of an existing qcow2 file's
// refcount table and blocks, for metadata edits that commit with one header
// write (the snapshot editor, docs/formats/qcow2.md §5.1). Changes stay in
// memory; every changed block and the table get new clusters, so the
// structures the current header names are never written, and the old ones
// are counted as free in the new ones.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "blockio/error.h"
#include "blockio/sink.h"
#include "blockio/source.h"
#include "formats/qcow2_header.h"

namespace barge::formats::qcow2 {

// Refcount entry `index` of a block: orders 0..2 are packed from the least
// significant bit of each byte, orders 3..6 are big-endian (QCOW2.md §3).
uint64_t LoadRefcount(const std::byte* block, uint64_t index, uint32_t order);
void StoreRefcount(std::byte* block, uint64_t index, uint32_t order, uint64_t value);

// Single-threaded; `file` and `header` are borrowed and must outlive it.
class RefcountShadow {
 public:
  RefcountShadow(BlockSource& file, const Header& header);
  ~RefcountShadow();
  RefcountShadow(const RefcountShadow&) = delete;
  RefcountShadow& operator=(const RefcountShadow&) = delete;

  // Reads and checks the refcount table (blocks are read on first use).
  // kCorruption when the table lies outside the file.
  Status Load();

  uint64_t max_refcount() const { return max_refcount_; }
  // The current (new) count of `cluster`. kCorruption for a bad block entry.
  Result<uint64_t> Get(uint64_t cluster);
  // Adds `delta` to the count of `cluster`. A count that was not 0 and
  // reaches 0 is freed: it was in use in the old structures, so it is
  // never handed out by Allocate in this edit. kCorruption when the count
  // would go below 0, kNotSupported when above max_refcount() (`what`
  // names the cluster's use in the message).
  Status Add(uint64_t cluster, int64_t delta, const char* what);
  // The same for `count` clusters from `first`.
  Status AddRun(uint64_t first, uint64_t count, int64_t delta, const char* what);
  // Clusters freed while this is set are the ones FreedRanges(true)
  // returns: what a snapshot delete or rollback freed, which qemu discards
  // (pass-discard-snapshot), apart from metadata that only moved.
  void set_discard_class(bool discard) { discard_class_ = discard; }
  // `count` contiguous clusters, free in the old structures and not yet
  // used by this edit (first fit from the start of the file), each counted
  // 1. Returns the host offset of the first.
  Result<uint64_t> Allocate(uint64_t count, const char* what);

  // Whether any count changed.
  bool changed() const;
  // Places every changed block and a new table (growing it when blocks lie
  // beyond the old one), counting their clusters and freeing the old
  // table and the old copies of the changed blocks. After it, no more
  // Add/Allocate. kNotSupported past qemu's 8 MiB table limit.
  Status Finish();
  uint64_t table_offset() const { return new_table_offset_; }
  uint32_t table_clusters() const { return static_cast<uint32_t>(new_table_clusters_); }
  // One past the last cluster this edit allocated, in bytes (0: none).
  uint64_t end_bytes() const { return allocated_end_cluster_ << h_.cluster_bits; }
  // Bytes WriteNew writes.
  uint64_t write_bytes() const;
  // Writes the placed blocks and the new table (no flush).
  Status WriteNew(BlockSink& sink);
  // The clusters this edit freed (in use before, count 0 now), as merged
  // [offset, offset + length) byte ranges in increasing order; only those
  // freed under set_discard_class(true) when `discardable_only`.
  std::vector<std::pair<uint64_t, uint64_t>> FreedRanges(bool discardable_only = false) const;

 private:
  struct Block;
  Result<Block*> FindOrLoad(uint64_t index, bool create);
  bool IsFreed(uint64_t cluster) const {
    return cluster < freed_.size() && freed_[cluster];
  }
  // Takes back a cluster this edit allocated (count 1 -> 0, reusable).
  Status Release(uint64_t cluster);

  BlockSource& file_;
  const Header& h_;
  const uint64_t per_block_;
  const uint64_t max_refcount_;
  std::vector<uint64_t> old_table_;
  std::vector<std::unique_ptr<Block>> blocks_;  // by table index, loaded on use
  std::vector<bool> freed_;                     // by cluster
  std::vector<bool> discard_;                   // by cluster: freed under the discard class
  bool discard_class_ = false;
  uint64_t cursor_ = 0;                         // first cluster Allocate looks at
  uint64_t allocated_end_cluster_ = 0;
  uint64_t new_table_offset_ = 0;
  uint64_t new_table_clusters_ = 0;
  bool finished_ = false;
};

}  // namespace barge::formats::qcow2
