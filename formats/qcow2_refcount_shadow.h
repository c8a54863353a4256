// Internal to formats: a copy-on-write image of an existing qcow2 file's
// refcount table and blocks, for metadata edits that commit with one header
// write (the snapshot editor, docs/formats/qcow2.md §5.3). Changes stay in
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
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"

namespace barge::formats::qcow2 {

// Refcount entry `index` of a block: orders 0..2 are packed from the least
// significant bit of each byte, orders 3..6 are big-endian (QCOW2.md §3).
// Inline: they run once per cluster of an image.
inline uint64_t LoadRefcount(const std::byte* block, uint64_t index, uint32_t order) {
  if (order == 4) return LoadBe16(block + 2 * index);  // qemu's default, the hot path
  const uint32_t bits = 1u << order;
  if (bits < 8) {
    const uint64_t bit = index * bits;
    return (uint8_t(block[bit / 8]) >> (bit % 8)) & ((1u << bits) - 1);
  }
  const std::byte* p = block + index * (bits / 8);
  uint64_t v = 0;
  for (uint32_t i = 0; i < bits / 8; ++i) v = (v << 8) | uint8_t(p[i]);
  return v;
}

inline void StoreRefcount(std::byte* block, uint64_t index, uint32_t order, uint64_t value) {
  if (order == 4) {
    StoreBe16(block + 2 * index, static_cast<uint16_t>(value));
    return;
  }
  const uint32_t bits = 1u << order;
  if (bits < 8) {
    const uint64_t bit = index * bits;
    const uint8_t mask = static_cast<uint8_t>(((1u << bits) - 1) << (bit % 8));
    const uint8_t old = uint8_t(block[bit / 8]);
    block[bit / 8] = std::byte((old & ~mask) | ((value << (bit % 8)) & mask));
    return;
  }
  std::byte* p = block + index * (bits / 8);
  for (uint32_t i = bits / 8; i-- > 0;) {
    p[i] = std::byte(value & 0xff);
    value >>= 8;
  }
}

// Why refcount table entry `entry` (non-zero) cannot name a refcount block
// of a file of `file_size` bytes; "" when it can. Bytes read from an image
// are untrusted: every edit checks an entry before following it.
std::string RefcountBlockEntryProblem(uint64_t entry, const Header& header, uint64_t file_size);

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
  Result<uint64_t> Get(uint64_t cluster) {
    const uint64_t index = cluster / per_block_;
    if (index < loaded_.size() && loaded_[index]) {
      return LoadRefcount(loaded_[index], cluster % per_block_, h_.refcount_order);
    }
    return GetSlow(cluster);
  }
  // Adds `delta` to the count of `cluster`. A count that was not 0 and
  // reaches 0 is freed: it was in use in the old structures, so it is
  // never handed out by Allocate in this edit. kCorruption when the count
  // would go below 0, kNotSupported when above max_refcount() (`what`
  // names the cluster's use in the message).
  Status Add(uint64_t cluster, int64_t delta, const char* what);
  // The same for `count` clusters from `first`.
  Status AddRun(uint64_t first, uint64_t count, int64_t delta, const char* what);
  // Clusters freed while this is set are the ones FreedRanges(true)
  // returns: the data a snapshot delete or rollback freed, which qemu
  // discards (pass-discard-snapshot).
  void set_discard_class(bool discard) { discard_class_ = discard; }
  // `count` contiguous clusters, free in the old structures and not yet
  // used by this edit (first fit from the start of the file), each counted
  // 1. Returns the host offset of the first.
  Result<uint64_t> Allocate(uint64_t count, const char* what);

  // Whether any count changed.
  bool changed() const;
  // How many Add/AddRun changes moved a count onto 1 or off it (the
  // changes that can flip a COPIED flag). Allocations are not counted.
  uint64_t crossed_one() const { return crossed_one_; }
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
  Result<uint64_t> GetSlow(uint64_t cluster);
  void MarkFreed(uint64_t cluster);
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
  std::vector<std::byte*> loaded_;              // by table index: the loaded block's bytes
  std::vector<bool> freed_;                     // by cluster
  std::vector<bool> discard_;                   // by cluster: freed under the discard class
  bool discard_class_ = false;
  std::vector<uint64_t> freed_list_;            // the freed clusters, in the order freed
  uint64_t crossed_one_ = 0;
  uint64_t cursor_ = 0;                         // first cluster Allocate looks at
  uint64_t allocated_end_cluster_ = 0;
  uint64_t new_table_offset_ = 0;
  uint64_t new_table_clusters_ = 0;
  bool finished_ = false;
};

}  // namespace barge::formats::qcow2
