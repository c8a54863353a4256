// Copy-on-write refcount table and blocks for one metadata edit.
#include "formats/qcow2_refcount_shadow.h"

#include <algorithm>
#include <string>

#include "formats/units.h"

namespace barge::formats::qcow2 {

namespace {

// Host offsets of metadata must fit in bits 9..55 of table entries.
constexpr uint64_t kMaxHostOffset = uint64_t{1} << 56;

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 refcounts: " + what).set_offset(offset);
}

}  // namespace

std::string RefcountBlockEntryProblem(uint64_t entry, const Header& header, uint64_t file_size) {
  if ((entry & ~kRefcountTableOffsetMask) != 0 || !IsClusterAligned(entry, header.cluster_bits)) {
    return "refcount table entry " + Hex(entry) + " is not a cluster-aligned offset";
  }
  if (entry >= file_size) return "refcount block at " + Hex(entry) + " lies beyond the end of the file";
  return "";
}

struct RefcountShadow::Block {
  uint64_t old_offset = 0;  // 0: the table had no block here
  uint64_t new_offset = 0;  // 0: not placed (unchanged blocks stay where they are)
  bool changed = false;
  std::vector<std::byte> bytes;
};

RefcountShadow::RefcountShadow(BlockSource& file, const Header& header)
    : file_(file),
      h_(header),
      per_block_(RefcountsPerBlock(header.cluster_bits, header.refcount_order)),
      max_refcount_(header.refcount_order == 6 ? UINT64_MAX
                                               : (uint64_t{1} << (1u << header.refcount_order)) - 1) {}

RefcountShadow::~RefcountShadow() = default;

Status RefcountShadow::Load() {
  const uint64_t file_size = file_.size_bytes();
  const uint64_t bytes = h_.refcount_table_bytes();
  if (bytes == 0 || h_.refcount_table_offset > file_size || bytes > file_size - h_.refcount_table_offset) {
    return Bad("refcount table at " + Hex(h_.refcount_table_offset) + " (" +
                   std::to_string(h_.refcount_table_clusters) + " clusters) lies beyond the end of the file",
               48);
  }
  std::vector<std::byte> raw(bytes);
  BARGE_RETURN_IF_ERROR(file_.ReadAt(h_.refcount_table_offset, raw));
  old_table_.resize(bytes / 8);
  for (size_t i = 0; i < old_table_.size(); ++i) old_table_[i] = LoadBe64(raw.data() + 8 * i);
  blocks_.resize(old_table_.size());
  loaded_.resize(old_table_.size());
  const uint64_t file_clusters = SizeToClusters(file_size, h_.cluster_bits);
  freed_.assign(file_clusters, false);
  discard_.assign(file_clusters, false);
  cursor_ = 0;
  return OkStatus();
}

Result<RefcountShadow::Block*> RefcountShadow::FindOrLoad(uint64_t index, bool create) {
  if (index < blocks_.size() && blocks_[index]) return blocks_[index].get();
  const uint64_t entry = index < old_table_.size() ? old_table_[index] : 0;
  if (entry == 0 && !create) return static_cast<Block*>(nullptr);
  if (index >= blocks_.size()) {
    blocks_.resize(index + 1);
    loaded_.resize(index + 1);
  }
  auto b = std::make_unique<Block>();
  b->bytes.assign(h_.cluster_size(), std::byte{0});
  if (entry != 0) {
    const uint64_t entry_at = h_.refcount_table_offset + 8 * index;
    const uint64_t file_size = file_.size_bytes();
    if (std::string why = RefcountBlockEntryProblem(entry, h_, file_size); !why.empty()) return Bad(why, entry_at);
    // qemu reads a short final cluster as zero-padded; so do we.
    const uint64_t avail = std::min(h_.cluster_size(), file_size - entry);
    BARGE_RETURN_IF_ERROR(file_.ReadAt(entry, std::span<std::byte>(b->bytes).first(avail)));
    b->old_offset = entry;
  }
  loaded_[index] = b->bytes.data();
  blocks_[index] = std::move(b);
  return blocks_[index].get();
}

void RefcountShadow::MarkFreed(uint64_t cluster) {
  if (cluster >= freed_.size()) {
    freed_.resize(cluster + 1);
    discard_.resize(cluster + 1);
  }
  if (!freed_[cluster]) freed_list_.push_back(cluster);
  freed_[cluster] = true;
  discard_[cluster] = discard_class_;
}

Result<uint64_t> RefcountShadow::GetSlow(uint64_t cluster) {
  BARGE_ASSIGN_OR_RETURN(Block * b, FindOrLoad(cluster / per_block_, false));
  return b ? LoadRefcount(b->bytes.data(), cluster % per_block_, h_.refcount_order) : 0;
}

Status RefcountShadow::Add(uint64_t cluster, int64_t delta, const char* what) {
  return AddRun(cluster, 1, delta, what);
}

Status RefcountShadow::AddRun(uint64_t first, uint64_t count, int64_t delta, const char* what) {
  if (delta == 0 || count == 0) return OkStatus();
  if (finished_) return Error::Internal("qcow2 refcounts: change after Finish");
  const uint32_t order = h_.refcount_order;
  const uint64_t end = first + count;
  for (uint64_t cluster = first; cluster < end;) {
    const uint64_t block_index = cluster / per_block_;
    const uint64_t block_end = std::min(end, (block_index + 1) * per_block_);
    BARGE_ASSIGN_OR_RETURN(Block * b, FindOrLoad(block_index, delta > 0));
    if (b && order == 4 && (delta == 1 || delta == -1)) {
      // The common case, one tight loop: 16-bit counts, +1 or -1.
      std::byte* p = b->bytes.data() + 2 * (cluster % per_block_);
      for (; cluster < block_end; ++cluster, p += 2) {
        const uint16_t now = LoadBe16(p);
        if (delta > 0 ? (now == 0 || now == 0xffff) : now == 0) break;  // the general loop reports it
        StoreBe16(p, static_cast<uint16_t>(now + delta));
        if (now + delta == 0) MarkFreed(cluster);
        crossed_one_ += (now == 1) != (now + delta == 1);
      }
      b->changed = true;
      if (cluster == block_end) continue;
    }
    for (; cluster < block_end; ++cluster) {
      const uint64_t index = cluster % per_block_;
      const uint64_t count_now = b ? LoadRefcount(b->bytes.data(), index, order) : 0;
      const uint64_t offset = cluster << h_.cluster_bits;
      uint64_t next;
      if (delta < 0) {
        const uint64_t down = static_cast<uint64_t>(-delta);
        if (count_now < down) {
          return Bad(std::string(what) + " at " + Hex(offset) + " has refcount " + std::to_string(count_now) +
                         ", lower than its references",
                     offset);
        }
        next = count_now - down;
        if (next == 0) MarkFreed(cluster);
      } else {
        const uint64_t up = static_cast<uint64_t>(delta);
        if (count_now > max_refcount_ - up) {
          return Error::NotSupported("qcow2 refcounts: " + std::string(what) + " at " + Hex(offset) +
                                     " would need a refcount above " + std::to_string(max_refcount_) +
                                     ", the most " + std::to_string(1u << order) +
                                     "-bit refcounts hold (qemu refuses too)")
              .set_offset(offset);
        }
        if (count_now == 0) {
          return Bad(std::string(what) + " at " + Hex(offset) + " is referenced but its refcount is 0", offset);
        }
        next = count_now + up;
      }
      StoreRefcount(b->bytes.data(), index, order, next);
      crossed_one_ += (count_now == 1) != (next == 1);
    }
    b->changed = true;
  }
  return OkStatus();
}

Result<uint64_t> RefcountShadow::Allocate(uint64_t count, const char* what) {
  if (finished_) return Error::Internal("qcow2 refcounts: allocation after Finish");
  if (count == 0) return Error::Internal("qcow2 refcounts: empty allocation");
  uint64_t start = cursor_;
  uint64_t run = 0;
  bool at_cursor = true;  // every cluster from cursor_ to start is in use
  while (run < count) {
    const uint64_t cluster = start + run;
    if (cluster >= (kMaxHostOffset >> h_.cluster_bits)) {
      return Error::NotSupported(std::string("qcow2 refcounts: no host offset below 2^56 left for ") + what);
    }
    const uint64_t index = cluster / per_block_;
    BARGE_ASSIGN_OR_RETURN(Block * b, FindOrLoad(index, false));
    if (!b) {
      // No block: the whole range is free; jump over it.
      const uint64_t block_end = (index + 1) * per_block_;
      const uint64_t take = std::min(count - run, block_end - cluster);
      bool clear = true;
      for (uint64_t c = cluster; c < cluster + take; ++c) {
        if (IsFreed(c)) {
          clear = false;
          start = c + 1;
          run = 0;
          break;
        }
      }
      if (clear) run += take;
      at_cursor = false;
      continue;
    }
    if (run == 0 && h_.refcount_order == 4) {
      // Skip the clusters in use in this block in one tight loop (most of
      // a full image's clusters are).
      const std::byte* p = b->bytes.data();
      uint64_t c = cluster;
      const uint64_t block_end = (index + 1) * per_block_;
      while (c < block_end && (LoadBe16(p + 2 * (c % per_block_)) != 0 || IsFreed(c))) ++c;
      if (c != cluster) {
        if (at_cursor) cursor_ = c;
        start = c;
        continue;
      }
    }
    if (LoadRefcount(b->bytes.data(), cluster % per_block_, h_.refcount_order) != 0 || IsFreed(cluster)) {
      if (at_cursor) cursor_ = cluster + 1;
      start = cluster + 1;
      run = 0;
      continue;
    }
    at_cursor = false;
    ++run;
  }
  for (uint64_t c = start; c < start + count; ++c) {
    BARGE_ASSIGN_OR_RETURN(Block * b, FindOrLoad(c / per_block_, true));
    StoreRefcount(b->bytes.data(), c % per_block_, h_.refcount_order, 1);
    b->changed = true;
  }
  allocated_end_cluster_ = std::max(allocated_end_cluster_, start + count);
  return start << h_.cluster_bits;
}

Status RefcountShadow::Release(uint64_t cluster) {
  BARGE_ASSIGN_OR_RETURN(Block * b, FindOrLoad(cluster / per_block_, false));
  if (!b || LoadRefcount(b->bytes.data(), cluster % per_block_, h_.refcount_order) != 1) {
    return Error::Internal("qcow2 refcounts: release of a cluster this edit did not allocate");
  }
  StoreRefcount(b->bytes.data(), cluster % per_block_, h_.refcount_order, 0);
  cursor_ = std::min(cursor_, cluster);
  return OkStatus();
}

Status RefcountShadow::Finish() {
  // The old table goes once the header names the new one.
  for (uint64_t i = 0; i < h_.refcount_table_clusters; ++i) {
    BARGE_RETURN_IF_ERROR(Add((h_.refcount_table_offset >> h_.cluster_bits) + i, -1, "refcount table"));
  }
  const uint64_t max_table_clusters = kMaxRefcountTableBytes >> h_.cluster_bits;
  for (int round = 0;; ++round) {
    if (round > 1000) return Error::Internal("qcow2 refcounts: block placement does not settle");
    // Every changed block moves to a new cluster; placing one changes the
    // counts of two clusters (the old copy freed, the new one used), which
    // may change more blocks, or need blocks the table does not have yet.
    bool placed_any = false;
    for (uint64_t i = 0; i < blocks_.size(); ++i) {
      Block* b = blocks_[i].get();
      if (!b || !b->changed || b->new_offset != 0) continue;
      if (b->old_offset != 0) {
        BARGE_RETURN_IF_ERROR(Add(b->old_offset >> h_.cluster_bits, -1, "refcount block"));
      }
      BARGE_ASSIGN_OR_RETURN(b->new_offset, Allocate(1, "a refcount block"));
      placed_any = true;
    }
    if (placed_any) continue;
    // The table: as large as the old one, larger when blocks lie beyond it.
    uint64_t entries = old_table_.size();
    for (uint64_t i = blocks_.size(); i-- > 0;) {
      if (blocks_[i] && (blocks_[i]->new_offset || blocks_[i]->old_offset)) {
        entries = std::max<uint64_t>(entries, i + 1);
        break;
      }
    }
    const uint64_t clusters = SizeToClusters(entries * 8, h_.cluster_bits);
    if (clusters > max_table_clusters) {
      return Error::NotSupported("qcow2 refcounts: the refcount table would need " + std::to_string(clusters) +
                                 " clusters, more than qemu's 8 MiB limit");
    }
    if (new_table_offset_ != 0 && new_table_clusters_ >= clusters) break;
    if (new_table_offset_ != 0) {
      for (uint64_t c = 0; c < new_table_clusters_; ++c) {
        BARGE_RETURN_IF_ERROR(Release((new_table_offset_ >> h_.cluster_bits) + c));
      }
    }
    BARGE_ASSIGN_OR_RETURN(new_table_offset_, Allocate(clusters, "the refcount table"));
    new_table_clusters_ = clusters;
  }
  finished_ = true;
  return OkStatus();
}

bool RefcountShadow::changed() const {
  return std::any_of(blocks_.begin(), blocks_.end(), [](const auto& b) { return b && b->changed; });
}

uint64_t RefcountShadow::write_bytes() const {
  uint64_t n = new_table_clusters_ << h_.cluster_bits;
  for (const auto& b : blocks_) {
    if (b && b->new_offset) n += h_.cluster_size();
  }
  return n;
}

std::vector<std::pair<uint64_t, uint64_t>> RefcountShadow::FreedRanges(bool discardable_only) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  const uint64_t cs = h_.cluster_size();
  std::vector<uint64_t> freed = freed_list_;
  std::sort(freed.begin(), freed.end());
  for (uint64_t c : freed) {
    if (discardable_only && !discard_[c]) continue;
    // A freed cluster is never allocated again in the same edit, so its
    // count is still 0.
    const uint64_t offset = c << h_.cluster_bits;
    if (!out.empty() && out.back().first + out.back().second == offset) {
      out.back().second += cs;
    } else {
      out.emplace_back(offset, cs);
    }
  }
  return out;
}

Status RefcountShadow::WriteNew(BlockSink& sink) {
  if (!finished_) return Error::Internal("qcow2 refcounts: write before Finish");
  std::vector<std::byte> table(new_table_clusters_ << h_.cluster_bits);
  for (uint64_t i = 0; i < blocks_.size() || i < old_table_.size(); ++i) {
    uint64_t entry = i < old_table_.size() ? old_table_[i] : 0;
    const Block* b = i < blocks_.size() ? blocks_[i].get() : nullptr;
    if (b && b->new_offset) {
      entry = b->new_offset;
      BARGE_RETURN_IF_ERROR(sink.WriteAt(b->new_offset, b->bytes));
    }
    if (entry != 0) StoreBe64(table.data() + 8 * i, entry);
  }
  return sink.WriteAt(new_table_offset_, table);
}

}  // namespace barge::formats::qcow2
