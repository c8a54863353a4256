// Refcount bookkeeping for the one-pass qcow2 writer: compact runs of host
// clusters with equal refcounts, the fixed-point sizing of the refcount area
// and its serialization (QCOW2.md §3).
#pragma once

#include <cstdint>
#include <vector>

#include "blockio/error.h"
#include "blockio/sink.h"

namespace barge::formats::qcow2 {

// Where the refcount table and blocks go: at the end of the file, starting
// at `table_offset`, table first, then `block_count` blocks.
struct RefcountLayout {
  uint64_t table_offset = 0;
  uint64_t table_clusters = 0;
  uint64_t block_count = 0;
  uint64_t end_offset = 0;  // first byte after the last block
  friend bool operator==(const RefcountLayout&, const RefcountLayout&) = default;
};

// Sizes the refcount area that starts at cluster `base_cluster` so that its
// blocks also describe the table's and their own clusters: the least fixed
// point of R = ceil((base+T+R)/per_block), T = ceil(R*8/cs).
RefcountLayout PlanRefcountArea(uint64_t base_cluster, uint32_t cluster_bits,
                                uint32_t refcount_order);

// Refcounts of host clusters allocated in increasing order, kept as runs of
// equal counts. Memory is one run per change of count: a single run for any
// stretch of ordinary clusters, one per cluster only where compressed
// payloads share clusters. Single-threaded.
class RefcountBuilder {
 public:
  RefcountBuilder(uint32_t cluster_bits, uint32_t refcount_order);

  // Largest refcount the order can store (1 for order 0, 2^64-1 for 6).
  uint64_t max_refcount() const { return max_refcount_; }
  // One past the highest cluster counted so far.
  uint64_t end_cluster() const;
  // The refcount of `cluster` (0 if never counted).
  uint64_t RefcountOf(uint64_t cluster) const;
  // Adds one reference to each of `count` clusters from `first`. Clusters
  // must be counted in order: `first` may repeat only the last counted
  // cluster (a shared, packed cluster). kInvalidArgument when that rule is
  // broken or a count would exceed max_refcount().
  Status AddReference(uint64_t first, uint64_t count = 1);
  size_t run_count() const { return runs_.size(); }

  // Counts the refcount area of `layout` and writes the table, then the
  // blocks, into `sink`. Every cluster counted so far must lie below
  // layout.table_offset.
  Status WriteArea(BlockSink& sink, const RefcountLayout& layout);

 private:
  struct Run {
    uint64_t first = 0;
    uint64_t length = 0;
    uint64_t refcount = 0;
  };
  void MergeTail();
  // Fills one refcount block covering clusters [first, first+per_block).
  void EncodeBlock(uint64_t first, std::vector<std::byte>& block, size_t& run_cursor) const;

  uint32_t cluster_bits_;
  uint32_t refcount_order_;
  uint64_t max_refcount_;
  std::vector<Run> runs_;
};

}  // namespace barge::formats::qcow2
