// Compact refcount runs for the one-pass qcow2 writer and the refcount area
// written at the end of the file (QCOW2.md §3).
#include "formats/qcow2_refcount_builder.h"

#include <algorithm>
#include <string>

#include "formats/qcow2_format.h"

namespace barge::formats::qcow2 {
namespace {

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Stores refcount `value` as entry `index` of a block. Entries narrower than
// a byte are packed from the least significant bit; wider ones are
// big-endian integers.
void StoreRefcount(std::byte* block, uint64_t index, uint32_t order, uint64_t value) {
  switch (order) {
    case 0:
    case 1:
    case 2: {
      uint32_t bits = 1u << order;
      uint64_t bit = index * bits;
      uint8_t mask = static_cast<uint8_t>(((1u << bits) - 1) << (bit % 8));
      uint8_t v = static_cast<uint8_t>((value << (bit % 8)) & mask);
      std::byte& b = block[bit / 8];
      b = std::byte((uint8_t(b) & ~mask) | v);
      return;
    }
    case 3: block[index] = std::byte(value); return;
    case 4: StoreBe16(block + index * 2, static_cast<uint16_t>(value)); return;
    case 5: StoreBe32(block + index * 4, static_cast<uint32_t>(value)); return;
    default: StoreBe64(block + index * 8, value); return;
  }
}

}  // namespace

RefcountLayout PlanRefcountArea(uint64_t base_cluster, uint32_t cluster_bits,
                                uint32_t refcount_order) {
  uint64_t cs = ClusterSize(cluster_bits);
  uint64_t per_block = RefcountsPerBlock(cluster_bits, refcount_order);
  uint64_t table = 1;
  uint64_t blocks = 1;
  // Both quantities only grow, so the first repeat is the least fixed point.
  for (;;) {
    uint64_t new_blocks = DivRoundUp(base_cluster + table + blocks, per_block);
    uint64_t new_table = DivRoundUp(new_blocks * 8, cs);
    if (new_blocks == blocks && new_table == table) break;
    blocks = std::max(blocks, new_blocks);
    table = std::max(table, new_table);
  }
  RefcountLayout layout;
  layout.table_offset = base_cluster << cluster_bits;
  layout.table_clusters = table;
  layout.block_count = blocks;
  layout.end_offset = (base_cluster + table + blocks) << cluster_bits;
  return layout;
}

RefcountBuilder::RefcountBuilder(uint32_t cluster_bits, uint32_t refcount_order)
    : cluster_bits_(cluster_bits),
      refcount_order_(refcount_order),
      max_refcount_(refcount_order >= 6 ? ~uint64_t{0}
                                        : (uint64_t{1} << (1u << refcount_order)) - 1) {}

uint64_t RefcountBuilder::end_cluster() const {
  return runs_.empty() ? 0 : runs_.back().first + runs_.back().length;
}

uint64_t RefcountBuilder::RefcountOf(uint64_t cluster) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), cluster,
                             [](uint64_t c, const Run& r) { return c < r.first; });
  if (it == runs_.begin()) return 0;
  --it;
  return cluster < it->first + it->length ? it->refcount : 0;
}

void RefcountBuilder::MergeTail() {
  while (runs_.size() >= 2) {
    Run& a = runs_[runs_.size() - 2];
    const Run& b = runs_.back();
    if (a.first + a.length != b.first || a.refcount != b.refcount) return;
    a.length += b.length;
    runs_.pop_back();
  }
}

Status RefcountBuilder::AddReference(uint64_t first, uint64_t count) {
  if (count == 0) return OkStatus();
  uint64_t end = end_cluster();
  if (first < end) {
    // Only the last counted cluster may gain another reference: it is the
    // host cluster that packed compressed payloads share.
    if (first != end - 1) {
      return Error::InvalidArgument("refcounts: cluster " + std::to_string(first) +
                                    " counted out of order (next is " + std::to_string(end) + ")");
    }
    Run& last = runs_.back();
    if (last.refcount >= max_refcount_) {
      return Error::InvalidArgument("refcounts: cluster " + std::to_string(first) +
                                    " would exceed the largest refcount " +
                                    std::to_string(max_refcount_));
    }
    if (last.length > 1) {
      last.length -= 1;
      runs_.push_back(Run{first, 1, last.refcount + 1});
    } else {
      last.refcount += 1;
      MergeTail();
    }
    ++first;
    --count;
    if (count == 0) return OkStatus();
  }
  runs_.push_back(Run{first, count, 1});
  MergeTail();
  return OkStatus();
}

void RefcountBuilder::EncodeBlock(uint64_t first, std::vector<std::byte>& block,
                                  size_t& run_cursor) const {
  std::fill(block.begin(), block.end(), std::byte{0});
  uint64_t per_block = RefcountsPerBlock(cluster_bits_, refcount_order_);
  uint64_t last = first + per_block;
  while (run_cursor < runs_.size()) {
    const Run& r = runs_[run_cursor];
    if (r.first >= last) return;
    uint64_t from = std::max(r.first, first);
    uint64_t to = std::min(r.first + r.length, last);
    for (uint64_t c = from; c < to; ++c) {
      StoreRefcount(block.data(), c - first, refcount_order_, r.refcount);
    }
    if (r.first + r.length > last) return;  // the run continues in the next block
    ++run_cursor;
  }
}

Status RefcountBuilder::WriteArea(BlockSink& sink, const RefcountLayout& layout) {
  uint64_t cs = ClusterSize(cluster_bits_);
  uint64_t table_cluster = layout.table_offset >> cluster_bits_;
  if (end_cluster() > table_cluster) {
    return Error::InvalidArgument("refcounts: clusters counted past the refcount area");
  }
  if (layout.table_clusters * cs > kMaxRefcountTableBytes) {
    return Error::NotSupported("refcounts: the image needs a refcount table larger than 8 MiB");
  }
  BARGE_RETURN_IF_ERROR(AddReference(table_cluster, layout.table_clusters + layout.block_count));

  uint64_t first_block_offset = layout.table_offset + layout.table_clusters * cs;
  std::vector<std::byte> table(layout.table_clusters * cs);
  for (uint64_t i = 0; i < layout.block_count; ++i) {
    StoreBe64(table.data() + i * 8, first_block_offset + i * cs);
  }
  Status st = sink.WriteAt(layout.table_offset, table);
  if (!st.ok()) {
    return std::move(st).error().Wrap("qcow2 writer: writing the refcount table at " +
                                      std::to_string(layout.table_offset));
  }

  uint64_t per_block = RefcountsPerBlock(cluster_bits_, refcount_order_);
  std::vector<std::byte> block(cs);
  size_t run_cursor = 0;
  for (uint64_t i = 0; i < layout.block_count; ++i) {
    EncodeBlock(i * per_block, block, run_cursor);
    uint64_t offset = first_block_offset + i * cs;
    st = sink.WriteAt(offset, block);
    if (!st.ok()) {
      return std::move(st).error().Wrap("qcow2 writer: writing a refcount block at " +
                                        std::to_string(offset));
    }
  }
  return OkStatus();
}

}  // namespace barge::formats::qcow2
