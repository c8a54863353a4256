// In-place persistent bitmap edits of an existing qcow2 image (remove, add,
// clear, enable, disable): everything is read, validated and planned in
// memory first, then written in the crash-safe order of
// docs/formats/qcow2.md §4.1.
#include "formats/qcow2_bitmap_edit.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_refcount_shadow.h"
#include "formats/qcow2_writer_meta.h"
#include "formats/units.h"

namespace barge::formats {
namespace {

using namespace qcow2;

constexpr uint64_t kAutoclearKnown = kAutoclearBitmaps | kAutoclearDataFileRaw;
// Clusters past the end of the file whose refcount is not 0 (leaks of an
// earlier crash) are skipped by the allocator; crafted refcount blocks could
// make that search long, so it is bounded.
constexpr uint64_t kMaxSkippedClusters = uint64_t{1} << 20;
constexpr uint64_t kZeroChunkBytes = 4 << 20;
// Host offsets of bitmap tables and the directory must fit in bits 9..55.
constexpr uint64_t kMaxHostOffset = uint64_t{1} << 56;

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 bitmap edit: " + what).set_offset(offset);
}
Error Invalid(const std::string& what) {
  return Error::InvalidArgument("qcow2 bitmap edit: " + what);
}
Error Unsupported(const std::string& what) {
  return Error::NotSupported("qcow2 bitmap edit: " + what);
}

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

uint32_t Log2(uint64_t power_of_two) {
  uint32_t bits = 0;
  while ((uint64_t{1} << bits) < power_of_two) ++bits;
  return bits;
}

// Adds the outer step to an I/O error so the caller knows how far it got.
Status InStep(Status s, const char* step) {
  if (!s.ok()) return std::move(s).error().Wrap(std::string("qcow2 bitmap edit: ") + step);
  return s;
}

Status WithPath(Status s, const std::string& path) {
  if (s.ok() || !s.error().path().empty()) return s;
  return std::move(s).error().set_path(path);
}

// The refcounts an edit reads and changes: the refcount table, the blocks
// it touches (loaded on first use, all before the first write), and new
// blocks for clusters beyond what the existing blocks cover. New clusters
// come from a bump pointer that starts at the end of the file.
// Single-threaded.
class Refcounts {
 public:
  Refcounts(BlockSource& file, const Header& h)
      : file_(file), h_(h), per_block_(RefcountsPerBlock(h.cluster_bits, h.refcount_order)) {}

  // Reads the refcount table; sets the allocation pointer to the first
  // cluster boundary at or after the end of the file.
  Status Load() {
    const uint64_t file_size = file_.size_bytes();
    const uint64_t bytes = h_.refcount_table_bytes();
    if (bytes == 0 || h_.refcount_table_offset > file_size ||
        bytes > file_size - h_.refcount_table_offset) {
      return Bad("refcount table at " + Hex(h_.refcount_table_offset) + " (" +
                     std::to_string(h_.refcount_table_clusters) +
                     " clusters) lies beyond the end of the file",
                 48);
    }
    std::vector<std::byte> raw(bytes);
    BARGE_RETURN_IF_ERROR(file_.ReadAt(h_.refcount_table_offset, raw));
    table_.resize(bytes / 8);
    for (size_t i = 0; i < table_.size(); ++i) table_[i] = LoadBe64(raw.data() + 8 * i);
    next_cluster_ = SizeToClusters(file_size, h_.cluster_bits);
    return OkStatus();
  }

  Result<uint64_t> Get(uint64_t cluster) {
    BARGE_ASSIGN_OR_RETURN(Block * b, Find(cluster / per_block_));
    return b ? LoadRefcount(b->bytes.data(), cluster % per_block_, h_.refcount_order) : 0;
  }

  // In memory; the caller checked with Get that the count is not 0.
  Status Decrement(uint64_t cluster) {
    BARGE_ASSIGN_OR_RETURN(Block * b, Find(cluster / per_block_));
    const uint64_t index = cluster % per_block_;
    const uint64_t count = b ? LoadRefcount(b->bytes.data(), index, h_.refcount_order) : 0;
    if (count == 0) {
      return Bad("refcount of cluster " + Hex(cluster << h_.cluster_bits) + " is already 0",
                 cluster << h_.cluster_bits);
    }
    Set(*b, index, count - 1);
    return OkStatus();
  }

  // Finds `count` contiguous free clusters at or after the allocation
  // pointer, gives each refcount 1 (in memory) and returns the host offset
  // of the first. A cluster whose range has no refcount block gets a new
  // block placed at that very cluster, so that it describes itself (qemu
  // does the same). kNotSupported when the refcount table would have to
  // grow.
  Result<uint64_t> Allocate(uint64_t count, const std::string& what) {
    uint64_t start = next_cluster_;
    uint64_t run = 0;
    uint64_t skipped = 0;
    while (run < count) {
      const uint64_t cluster = start + run;
      if (cluster >> (64 - h_.cluster_bits) || (cluster + 1) << h_.cluster_bits > kMaxHostOffset) {
        return Unsupported("no host offset below 2^56 left for " + what);
      }
      const uint64_t index = cluster / per_block_;
      BARGE_ASSIGN_OR_RETURN(Block * b, Find(index));
      if (!b) {
        if (index >= table_.size()) {
          return Unsupported("allocating " + what + " at " + Hex(cluster << h_.cluster_bits) +
                             " needs a larger refcount table (" +
                             std::to_string(h_.refcount_table_clusters) +
                             " clusters cover the file only up to " +
                             Hex((uint64_t{table_.size()} * per_block_) << h_.cluster_bits) + ")");
        }
        NewBlock(index, cluster);
        start = cluster + 1;
        run = 0;
        continue;
      }
      if (LoadRefcount(b->bytes.data(), cluster % per_block_, h_.refcount_order) != 0) {
        if (++skipped > kMaxSkippedClusters) {
          return Bad("too many clusters past the end of the file have non-zero refcounts",
                     h_.refcount_table_offset);
        }
        start = cluster + 1;
        run = 0;
        continue;
      }
      ++run;
    }
    for (uint64_t c = start; c < start + count; ++c) {
      Block* b = Find(c / per_block_).value();  // loaded by the loop above
      Set(*b, c % per_block_, 1);
    }
    next_cluster_ = start + count;
    allocated_end_ = next_cluster_ << h_.cluster_bits;
    return start << h_.cluster_bits;
  }

  // Writes every block changed since the last call: new blocks in full,
  // existing ones only in the bytes that changed.
  Status WriteBlocks(BlockSink& sink) {
    for (auto& [index, b] : blocks_) {
      if (b.dirty_begin >= b.dirty_end) continue;
      if (b.is_new && !b.written) {
        BARGE_RETURN_IF_ERROR(sink.WriteAt(b.offset, b.bytes));
        b.written = true;
      } else {
        BARGE_RETURN_IF_ERROR(sink.WriteAt(
            b.offset + b.dirty_begin,
            std::span<const std::byte>(b.bytes).subspan(b.dirty_begin, b.dirty_end - b.dirty_begin)));
      }
      b.dirty_begin = UINT64_MAX;
      b.dirty_end = 0;
    }
    return OkStatus();
  }

  bool has_new_blocks() const { return !new_indices_.empty(); }
  // One past the last cluster allocated, in bytes (0: none allocated).
  uint64_t end_bytes() const { return allocated_end_; }

  // Points the refcount table at the new blocks (one 8-byte write each).
  // Must follow a flush of WriteBlocks: a table entry that reached the disk
  // before its block would point at garbage.
  Status WriteNewTableEntries(BlockSink& sink) {
    for (uint64_t index : new_indices_) {
      std::byte entry[8];
      StoreBe64(entry, blocks_.at(index).offset);
      BARGE_RETURN_IF_ERROR(sink.WriteAt(h_.refcount_table_offset + 8 * index, entry));
    }
    new_indices_.clear();
    return OkStatus();
  }

 private:
  struct Block {
    uint64_t offset = 0;
    std::vector<std::byte> bytes;
    bool is_new = false;
    bool written = false;
    // Bytes changed since the last WriteBlocks.
    uint64_t dirty_begin = UINT64_MAX;
    uint64_t dirty_end = 0;
  };

  // The block of table entry `index`, loading it on first use; nullptr when
  // there is none (every refcount in its range is 0).
  Result<Block*> Find(uint64_t index) {
    if (auto it = blocks_.find(index); it != blocks_.end()) return &it->second;
    if (index >= table_.size() || table_[index] == 0) return static_cast<Block*>(nullptr);
    const uint64_t entry = table_[index];
    const uint64_t entry_at = h_.refcount_table_offset + 8 * index;
    const uint64_t file_size = file_.size_bytes();
    if (std::string why = qcow2::RefcountBlockEntryProblem(entry, h_, file_size); !why.empty()) {
      return Bad(why, entry_at);
    }
    Block b;
    b.offset = entry;
    b.bytes.assign(h_.cluster_size(), std::byte{0});
    // qemu reads a short final cluster as zero-padded; so do we.
    const uint64_t avail = std::min(h_.cluster_size(), file_size - entry);
    BARGE_RETURN_IF_ERROR(file_.ReadAt(entry, std::span<std::byte>(b.bytes).first(avail)));
    return &blocks_.emplace(index, std::move(b)).first->second;
  }

  void NewBlock(uint64_t index, uint64_t cluster) {
    Block b;
    b.offset = cluster << h_.cluster_bits;
    b.bytes.assign(h_.cluster_size(), std::byte{0});
    b.is_new = true;
    Block& placed = blocks_.emplace(index, std::move(b)).first->second;
    Set(placed, cluster % per_block_, 1);
    new_indices_.push_back(index);
  }

  void Set(Block& b, uint64_t index, uint64_t value) {
    StoreRefcount(b.bytes.data(), index, h_.refcount_order, value);
    const uint64_t bits = uint64_t{1} << h_.refcount_order;
    b.dirty_begin = std::min(b.dirty_begin, index * bits / 8);
    b.dirty_end = std::max(b.dirty_end, (index * bits + bits + 7) / 8);
  }

  BlockSource& file_;  // borrowed for the edit
  const Header& h_;    // borrowed for the edit
  uint64_t per_block_;
  std::vector<uint64_t> table_;
  std::map<uint64_t, Block> blocks_;  // by refcount table index
  std::vector<uint64_t> new_indices_;
  uint64_t next_cluster_ = 0;
  uint64_t allocated_end_ = 0;
};

// What the file says before the edit.
struct ImageState {
  std::vector<std::byte> cluster0;  // min(cluster size, file size) bytes
  Header header;
  std::vector<BitmapEntry> bitmaps;
};

Result<ImageState> ReadState(BlockSource& file) {
  ImageState s;
  const uint64_t file_size = file.size_bytes();
  std::byte head[kV3HeaderLengthWithCompression] = {};
  const uint64_t head_bytes = std::min<uint64_t>(file_size, sizeof head);
  BARGE_RETURN_IF_ERROR(file.ReadAt(0, std::span<std::byte>(head, head_bytes)));
  if (head_bytes < kV2HeaderLength || LoadBe32(head) != kMagic) {
    return Unsupported("'" + file.name() + "' is not a qcow2 image");
  }
  if (LoadBe32(head + 4) == 2) {
    return Unsupported("qcow2 version 2 images have no persistent bitmaps; convert with "
                       "qemu-img amend -o compat=1.1");
  }
  const uint32_t cluster_bits = LoadBe32(head + 20);
  const uint64_t c0_bytes = cluster_bits >= kMinClusterBits && cluster_bits <= kMaxClusterBits
                                ? std::min(file_size, ClusterSize(cluster_bits))
                                : head_bytes;  // ParseHeader reports the bad field
  s.cluster0.resize(c0_bytes);
  BARGE_RETURN_IF_ERROR(file.ReadAt(0, s.cluster0));
  BARGE_ASSIGN_OR_RETURN(s.header, ParseHeader(s.cluster0, file_size));
  const Header& h = s.header;
  if (h.incompatible_features & kIncompatCorrupt) {
    return Bad("the image is marked corrupt; repair it with qemu-img check -r all first", 72);
  }
  if (h.incompatible_features & kIncompatDirty) {
    return Unsupported("the image is dirty (lazy refcounts not yet rebuilt); open and close it "
                       "with qemu or run qemu-img check -r all first");
  }
  BARGE_ASSIGN_OR_RETURN(s.bitmaps, ReadBitmapDirectory(file, h));
  return s;
}

struct BitmapsExtension {
  uint32_t count = 0;
  uint64_t directory_size = 0;
  uint64_t directory_offset = 0;
};

// Cluster 0 after the edit, from offset 0 up to the end of what the old or
// new header uses: the fixed header with `autoclear`, the extension records
// in their old order with the bitmaps record replaced, appended (before the
// end marker) or dropped, the end marker, and the backing file name, moved
// down only when the extensions grow into it.
Result<std::vector<std::byte>> RebuildCluster0(const std::vector<std::byte>& c0, const Header& h,
                                               uint64_t autoclear,
                                               const std::optional<BitmapsExtension>& bitmaps) {
  const uint64_t cs = h.cluster_size();
  // The records end at the backing file name, if any, and never past the
  // bytes of cluster 0 that were read (bytes from the image are untrusted).
  uint64_t limit = std::min<uint64_t>(cs, c0.size());
  if (h.backing_file_offset != 0 &&
      (h.backing_file_offset > limit || h.backing_file_size > limit - h.backing_file_offset)) {
    return Error::Corruption("qcow2 backing file name (offset " + std::to_string(h.backing_file_offset) +
                             ", " + std::to_string(h.backing_file_size) + " bytes) lies outside cluster 0");
  }

  if (h.backing_file_offset != 0) limit = std::min<uint64_t>(limit, h.backing_file_offset);
  std::vector<std::byte> area;  // records and end marker
  auto append = [&](uint32_t type, std::span<const std::byte> data) {
    const size_t at = area.size();
    area.resize(at + 8 + Align8(data.size()));
    StoreBe32(area.data() + at, type);
    StoreBe32(area.data() + at + 4, static_cast<uint32_t>(data.size()));
    std::copy(data.begin(), data.end(), area.begin() + at + 8);
  };
  std::byte ext[24] = {};
  if (bitmaps) {
    StoreBe32(ext, bitmaps->count);
    StoreBe64(ext + 8, bitmaps->directory_size);
    StoreBe64(ext + 16, bitmaps->directory_offset);
  }
  bool placed = false;
  // ParseHeader walked the same records and bounded every length.
  for (uint64_t off = h.header_length; off < limit && limit - off >= 8;) {
    const uint32_t type = LoadBe32(c0.data() + off);
    const uint32_t len = LoadBe32(c0.data() + off + 4);
    if (type == kExtEnd) break;
    if (len > limit - off - 8) {
      return Error::Corruption("qcow2 header extension 0x" + std::to_string(type) + " at offset " +
                               std::to_string(off) + " runs past the header area (" + std::to_string(len) +
                               " bytes)");
    }
    if (type == kExtBitmaps) {
      if (bitmaps) append(kExtBitmaps, ext);
      placed = true;
    } else {
      append(type, std::span<const std::byte>(c0).subspan(off + 8, len));
    }
    off += 8 + Align8(len);
  }
  if (bitmaps && !placed) append(kExtBitmaps, ext);
  area.resize(area.size() + 8);  // end marker

  const uint64_t area_end = h.header_length + area.size();
  uint64_t name_at = h.backing_file_offset;
  if (h.backing_file_offset != 0 && area_end > name_at) name_at = area_end;
  const uint64_t new_end = h.backing_file_offset ? name_at + h.backing_file_size : area_end;
  if (new_end > cs) {
    return Unsupported("the header extensions and backing file name need " +
                       std::to_string(new_end) + " bytes, more than cluster 0 holds");
  }
  // Without a backing file (offset 0) its size field means nothing.
  const uint64_t old_end = std::max<uint64_t>(
      std::min<uint64_t>(h.extensions_end, limit),
      h.backing_file_offset ? h.backing_file_offset + h.backing_file_size : 0);
  std::vector<std::byte> out(std::max(old_end, new_end));
  std::copy_n(c0.begin(), h.header_length, out.begin());
  StoreBe64(out.data() + 88, autoclear);
  if (h.backing_file_offset) {
    StoreBe64(out.data() + 8, name_at);
    std::copy_n(c0.begin() + h.backing_file_offset, h.backing_file_size, out.begin() + name_at);
  }
  std::copy(area.begin(), area.end(), out.begin() + h.header_length);
  return out;
}

// Writes the bytes of `now` that differ from `before` as one write (the
// header switch must be a single write; the changed range is usually the
// 24 bytes of the bitmaps extension).
Status WriteChangedRange(BlockSink& sink, std::span<const std::byte> before,
                         std::span<const std::byte> now) {
  auto differs = [&](size_t i) { return i >= before.size() || before[i] != now[i]; };
  size_t lo = 0;
  while (lo < now.size() && !differs(lo)) ++lo;
  if (lo == now.size()) return OkStatus();
  size_t hi = now.size();
  while (hi > lo && !differs(hi - 1)) --hi;
  return sink.WriteAt(lo, now.subspan(lo, hi - lo));
}

// The clusters an edit frees: the old directory, and the tables and data
// clusters of the removed and cleared bitmaps (each data offset checked).
Result<std::vector<uint64_t>> ClustersToFree(BlockSource& file, const ImageState& s,
                                             const std::vector<const BitmapEntry*>& removed) {
  const Header& h = s.header;
  const uint64_t cs = h.cluster_size();
  std::vector<uint64_t> out;
  auto add_range = [&](uint64_t offset, uint64_t bytes) {
    for (uint64_t c = offset >> h.cluster_bits; c < (offset >> h.cluster_bits) + SizeToClusters(bytes, h.cluster_bits); ++c) {
      out.push_back(c);
    }
  };
  if (h.bitmaps_valid()) add_range(h.bitmap_directory_offset, h.bitmap_directory_size);
  for (const BitmapEntry* e : removed) {
    const uint64_t table_bytes = uint64_t{e->info.table_size} * 8;
    add_range(e->info.table_offset, table_bytes);
    std::vector<std::byte> table(table_bytes);
    BARGE_RETURN_IF_ERROR(file.ReadAt(e->info.table_offset, table));
    for (uint64_t i = 0; i < e->info.table_size; ++i) {
      const uint64_t at = e->info.table_offset + 8 * i;
      const uint64_t entry = LoadBe64(table.data() + 8 * i);
      if (entry & kBitmapTableReservedMask) {
        return Bad("bitmap '" + e->info.name + "' table entry has reserved bits set", at);
      }
      const uint64_t data = entry & kBitmapTableOffsetMask;
      if (data == 0) continue;
      if (data > file.size_bytes() || cs > file.size_bytes() - data) {
        return Bad("bitmap '" + e->info.name + "' data cluster " + Hex(data) +
                       " lies beyond the end of the file",
                   at);
      }
      out.push_back(data >> h.cluster_bits);
    }
  }
  return out;
}

// What the edit does to the bitmaps of the image.
struct Plan {
  std::vector<const BitmapEntry*> removed;  // in the order of `remove`
  std::vector<const BitmapEntry*> kept;     // in directory order
  std::set<std::string> cleared;
  std::map<std::string, bool> enabled;      // kept bitmaps whose auto flag is set or cleared
  // Kept bitmaps whose directory entry changes (cleared, or the auto flag
  // flipped), or bitmaps removed or added: false means nothing to write.
  bool changes = false;
};

// Checks the edit against the image and plans it.
Result<Plan> PlanEdit(const ImageState& s, const BitmapEdit& edit) {
  Plan plan;
  auto find = [&](const std::string& name) -> const BitmapEntry* {
    auto it = std::find_if(s.bitmaps.begin(), s.bitmaps.end(),
                           [&](const BitmapEntry& e) { return e.info.name == name; });
    return it == s.bitmaps.end() ? nullptr : &*it;
  };
  std::set<std::string> remove_names;
  for (const std::string& name : edit.remove) {
    if (!remove_names.insert(name).second) return Invalid("bitmap '" + name + "' is named twice to remove");
    const BitmapEntry* e = find(name);
    if (e == nullptr) return Error::NotFound("qcow2 bitmap edit: no bitmap named '" + name + "' to remove");
    plan.removed.push_back(e);
  }
  // Clear, enable and disable name existing bitmaps that are kept.
  auto check_kept = [&](const std::string& name, const char* verb) -> Status {
    if (find(name) == nullptr) {
      return Error::NotFound("qcow2 bitmap edit: no bitmap named '" + name + "' to " + verb);
    }
    if (remove_names.count(name)) return Invalid("bitmap '" + name + "' is both removed and " + verb + "d");
    return OkStatus();
  };
  for (const std::string& name : edit.clear) {
    BARGE_RETURN_IF_ERROR(check_kept(name, "clear"));
    if (!plan.cleared.insert(name).second) return Invalid("bitmap '" + name + "' is named twice to clear");
  }
  for (const auto& [names, on] : {std::pair{&edit.enable, true}, std::pair{&edit.disable, false}}) {
    for (const std::string& name : *names) {
      BARGE_RETURN_IF_ERROR(check_kept(name, on ? "enable" : "disable"));
      if (!plan.enabled.emplace(name, on).second) {
        return Invalid("bitmap '" + name + "' is named twice to enable or disable");
      }
    }
  }
  plan.changes = !edit.remove.empty() || !edit.add.empty() || !edit.clear.empty();
  std::vector<BitmapSpec> result;  // the bitmaps after the edit
  for (const BitmapEntry& e : s.bitmaps) {
    if (remove_names.count(e.info.name)) continue;
    if (e.info.in_use) {
      return Invalid("bitmap '" + e.info.name +
                     "' is in use: a qemu process has the image open, or it was not closed "
                     "cleanly; remove that bitmap too or close the image first");
    }
    plan.kept.push_back(&e);
    bool enabled = e.info.enabled;
    if (auto it = plan.enabled.find(e.info.name); it != plan.enabled.end()) {
      plan.changes |= it->second != enabled;
      enabled = it->second;
    }
    result.push_back(BitmapSpec{e.info.name, e.info.granularity_bytes, enabled, {}});
  }
  for (const BitmapSpec& b : edit.add) {
    if (!b.dirty.empty()) {
      return Unsupported("new bitmap '" + b.name + "' must be empty (dirty ranges are not written)");
    }
    if (std::any_of(plan.kept.begin(), plan.kept.end(),
                    [&](const BitmapEntry* e) { return e->info.name == b.name; })) {
      return Invalid("bitmap '" + b.name + "' already exists and is not removed");
    }
    result.push_back(BitmapSpec{b.name, b.granularity_bytes, b.enabled, {}});
  }
  Status valid = ValidateBitmaps(result, s.header.size, s.header.cluster_bits);
  if (!valid.ok()) return std::move(valid).error().Wrap("qcow2 bitmap edit");
  return plan;
}

}  // namespace

Status EditBitmaps(BlockSource& file, BlockSink& sink, const BitmapEdit& edit) {
  // Read and plan: nothing is written until every check has passed.
  BARGE_ASSIGN_OR_RETURN(ImageState s, ReadState(file));
  const Header& h = s.header;
  BARGE_ASSIGN_OR_RETURN(Plan plan, PlanEdit(s, edit));
  if (!plan.changes) return OkStatus();
  const std::vector<const BitmapEntry*>& removed = plan.removed;
  const std::vector<const BitmapEntry*>& kept = plan.kept;

  Refcounts refcounts(file, h);
  BARGE_RETURN_IF_ERROR(refcounts.Load());
  // A cleared bitmap's old table and data go exactly as a removed one's.
  std::vector<const BitmapEntry*> dropped_tables = removed;
  for (const BitmapEntry* e : kept) {
    if (plan.cleared.count(e->info.name)) dropped_tables.push_back(e);
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<uint64_t> to_free, ClustersToFree(file, s, dropped_tables));
  std::map<uint64_t, uint64_t> frees;
  for (uint64_t c : to_free) ++frees[c];
  for (const auto& [cluster, times] : frees) {
    BARGE_ASSIGN_OR_RETURN(uint64_t count, refcounts.Get(cluster));
    if (count < times) {
      return Bad("cluster " + Hex(cluster << h.cluster_bits) + " has refcount " +
                     std::to_string(count) + " but the bitmaps reference it " +
                     std::to_string(times) + " times",
                 cluster << h.cluster_bits);
    }
  }

  // The new directory: kept entries byte for byte (but a cleared one's
  // table offset and a changed auto flag), then the new ones. Cleared and
  // new bitmaps get a table of zero entries (all clean) in clusters of its
  // own.
  struct NewTable {
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  std::vector<NewTable> new_tables;
  std::vector<std::byte> directory;
  for (const BitmapEntry* e : kept) {
    std::vector<std::byte> entry(Align8(kBitmapDirEntryFixedBytes + e->info.name.size()));
    BARGE_RETURN_IF_ERROR(file.ReadAt(e->entry_offset, entry));
    if (plan.cleared.count(e->info.name)) {
      NewTable t;
      t.bytes = uint64_t{e->info.table_size} * 8;
      BARGE_ASSIGN_OR_RETURN(t.offset, refcounts.Allocate(SizeToClusters(t.bytes, h.cluster_bits),
                                                          "the new table of bitmap '" + e->info.name + "'"));
      new_tables.push_back(t);
      StoreBe64(entry.data(), t.offset);
    }
    if (auto it = plan.enabled.find(e->info.name); it != plan.enabled.end()) {
      const uint32_t flags = LoadBe32(entry.data() + 12);
      StoreBe32(entry.data() + 12, it->second ? flags | kBitmapAuto : flags & ~kBitmapAuto);
    }
    directory.insert(directory.end(), entry.begin(), entry.end());
  }
  for (const BitmapSpec& b : edit.add) {
    const uint64_t entries = BitmapTableEntries(h.size, b.granularity_bytes, h.cluster_bits);
    NewTable t;
    t.bytes = entries * 8;
    BARGE_ASSIGN_OR_RETURN(t.offset, refcounts.Allocate(SizeToClusters(t.bytes, h.cluster_bits),
                                                        "the table of bitmap '" + b.name + "'"));
    new_tables.push_back(t);
    const size_t at = directory.size();
    directory.resize(at + Align8(kBitmapDirEntryFixedBytes + b.name.size()));
    std::byte* p = directory.data() + at;
    StoreBe64(p, t.offset);
    StoreBe32(p + 8, static_cast<uint32_t>(entries));
    StoreBe32(p + 12, b.enabled ? kBitmapAuto : 0);
    p[16] = std::byte(kBitmapTypeDirtyTracking);
    p[17] = std::byte(Log2(b.granularity_bytes));
    StoreBe16(p + 18, static_cast<uint16_t>(b.name.size()));
    std::copy_n(reinterpret_cast<const std::byte*>(b.name.data()), b.name.size(),
                p + kBitmapDirEntryFixedBytes);
  }
  std::optional<BitmapsExtension> extension;
  if (!directory.empty()) {
    extension.emplace();
    extension->count = static_cast<uint32_t>(kept.size() + edit.add.size());
    extension->directory_size = directory.size();
    BARGE_ASSIGN_OR_RETURN(extension->directory_offset,
                           refcounts.Allocate(SizeToClusters(directory.size(), h.cluster_bits),
                                              "the bitmap directory"));
  }
  // New clusters lie past the end of the file: a block device cannot take
  // them (qemu allocates inside the device; this code does not).
  if (!sink.capabilities().can_grow && refcounts.end_bytes() > sink.size_bytes()) {
    return Unsupported("'" + sink.name() + "' cannot grow to hold the new bitmap clusters");
  }
  // Without bitmaps the extension goes and autoclear bit 0 is cleared (§6).
  // Unknown autoclear bits are cleared before the first change, as the
  // spec asks of a program that does not understand them.
  const uint64_t autoclear = (h.autoclear_features & kAutoclearKnown & ~kAutoclearBitmaps) |
                             (extension ? kAutoclearBitmaps : 0);
  std::vector<std::byte> cluster0 = s.cluster0;
  BARGE_ASSIGN_OR_RETURN(std::vector<std::byte> new_cluster0,
                         RebuildCluster0(cluster0, h, autoclear, extension));

  // Step 0: drop autoclear bits we do not understand before changing anything.
  if (h.autoclear_features & ~kAutoclearKnown) {
    StoreBe64(cluster0.data() + 88, h.autoclear_features & kAutoclearKnown);
    BARGE_RETURN_IF_ERROR(InStep(sink.WriteAt(88, std::span(cluster0).subspan(88, 8)),
                                 "clearing unknown autoclear bits"));
    BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "clearing unknown autoclear bits"));
  }

  // Step 1: mark the bitmaps to remove in_use in the current directory, so
  // that no later crash can leave them looking valid while their clusters
  // are being freed. An in_use bitmap only means "take a full backup".
  bool marked = false;
  for (const BitmapEntry* e : removed) {
    if (e->info.in_use) continue;
    std::byte flags[4];
    StoreBe32(flags, e->info.flags | kBitmapInUse);
    BARGE_RETURN_IF_ERROR(InStep(sink.WriteAt(e->entry_offset + 12, flags), "marking bitmaps in use"));
    marked = true;
  }
  if (marked) BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "marking bitmaps in use"));

  // Cleared bitmaps are not marked: the old directory keeps referencing
  // their old, intact table and data until the switch in step 3.

  // Step 2: the new tables and directory in new clusters, then their
  // refcounts. Nothing references them yet, so any subset reaching the disk
  // is at worst a leak; new refcount blocks are linked into the table only
  // after they are durable.
  // Tables are written as zeros, not left to read as zeros past the end of
  // the file; a table can reach 1 GiB, so in pieces.
  uint64_t largest_table = 0;
  for (const NewTable& t : new_tables) largest_table = std::max(largest_table, t.bytes);
  const std::vector<std::byte> zeros(std::min(kZeroChunkBytes, largest_table));
  for (const NewTable& t : new_tables) {
    for (uint64_t done = 0; done < t.bytes;) {
      const uint64_t n = std::min<uint64_t>(zeros.size(), t.bytes - done);
      BARGE_RETURN_IF_ERROR(InStep(sink.WriteAt(t.offset + done, std::span(zeros).first(n)),
                                   "writing new bitmap tables"));
      done += n;
    }
  }
  if (extension) {
    BARGE_RETURN_IF_ERROR(InStep(sink.WriteAt(extension->directory_offset, directory),
                                 "writing the new bitmap directory"));
  }
  BARGE_RETURN_IF_ERROR(InStep(refcounts.WriteBlocks(sink), "counting new clusters"));
  BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "counting new clusters"));
  if (refcounts.has_new_blocks()) {
    BARGE_RETURN_IF_ERROR(InStep(refcounts.WriteNewTableEntries(sink), "linking new refcount blocks"));
    BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "linking new refcount blocks"));
  }

  // Step 3: switch to the new directory with one write of cluster 0.
  BARGE_RETURN_IF_ERROR(InStep(WriteChangedRange(sink, cluster0, new_cluster0), "switching the header"));
  BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "switching the header"));

  // Step 4: free the old directory, the removed bitmaps and the cleared
  // bitmaps' old tables and data. A crash before this point leaves these
  // clusters leaked, nothing worse.
  for (uint64_t c : to_free) BARGE_RETURN_IF_ERROR(refcounts.Decrement(c));
  BARGE_RETURN_IF_ERROR(InStep(refcounts.WriteBlocks(sink), "freeing old bitmap clusters"));
  return InStep(sink.Flush(), "freeing old bitmap clusters");
}

Status RotateBitmap(BlockSource& file, BlockSink& sink, const std::string& old_name,
                    const std::string& new_name) {
  BARGE_ASSIGN_OR_RETURN(ImageState s, ReadState(file));
  auto it = std::find_if(s.bitmaps.begin(), s.bitmaps.end(),
                         [&](const BitmapEntry& e) { return e.info.name == old_name; });
  if (it == s.bitmaps.end()) {
    return Error::NotFound("qcow2 bitmap edit: no bitmap named '" + old_name + "' to rotate");
  }
  BitmapEdit edit;
  edit.remove = {old_name};
  edit.add = {BitmapSpec{new_name, it->info.granularity_bytes, true, {}}};
  return EditBitmaps(file, sink, edit);
}

Status EditBitmaps(const std::string& path, const SourceOpener& open_source,
                   const SinkOpener& open_sink, const BitmapEdit& edit) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, open_source(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, open_sink(path));
  return WithPath(EditBitmaps(*file, *sink, edit), path);
}

Status RotateBitmap(const std::string& path, const SourceOpener& open_source,
                    const SinkOpener& open_sink, const std::string& old_name,
                    const std::string& new_name) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, open_source(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, open_sink(path));
  return WithPath(RotateBitmap(*file, *sink, old_name, new_name), path);
}

}  // namespace barge::formats
