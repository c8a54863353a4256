// qcow2 refcount and structure checker: one in-memory reference count per
// host cluster, compared with the stored refcounts and COPIED flags.
#include "formats/qcow2_check.h"

#include <algorithm>
#include <map>

#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_snapshot.h"
#include "formats/units.h"

namespace barge::formats::qcow2 {

namespace {

// The automatic scan budget: four times the file plus this. Walking each
// table once reads each metadata byte about once (refcount blocks and
// bitmap data too), so only crafted files come near it.
constexpr uint64_t kScanAllowanceBytes = uint64_t{256} << 20;

class Checker {
 public:
  Checker(BlockSource& file, const Header& h, const CheckOptions& options)
      : file_(file), h_(h), options_(options), cs_(h.cluster_size()) {}

  Result<CheckReport> Run();

 private:
  void Corrupt(std::string message) {
    ++report_.corruptions;
    Note("ERROR " + std::move(message));
  }
  void Note(std::string message) {
    if (report_.messages.size() < options_.max_messages) report_.messages.push_back(std::move(message));
  }
  // +times on every host cluster that [offset, offset+length) touches.
  // As qemu: a region may end less than one cluster past the end of the
  // file (the last cluster may be short); one that reaches further is a
  // corruption and counts nothing.
  void Reference(uint64_t offset, uint64_t length, const char* what, uint64_t times = 1) {
    if (length == 0) return;
    const uint64_t file_size = file_.size_bytes();
    const uint64_t end = offset + length;
    if (end < offset || (end > file_size && end - file_size >= cs_)) {
      Corrupt(std::string("counting reference for region exceeding the end of the file by one "
                          "cluster or more: ") + what + " at " + Hex(offset) + " size " + Hex(length));
      return;
    }
    const uint64_t first = offset >> h_.cluster_bits;
    const uint64_t last = (end - 1) >> h_.cluster_bits;
    // At most one cluster past the file's (refs_ has room for it).
    compared_clusters_ = std::max(compared_clusters_, last + 1);
    for (uint64_t c = first; c <= last; ++c) refs_[c] = uint32_t(std::min<uint64_t>(refs_[c] + times, UINT32_MAX));
  }
  // Reads metadata, charging it to the scan budget.
  Status Read(uint64_t offset, std::span<std::byte> out) {
    scanned_ += out.size();
    if (scanned_ > scan_limit_) {
      return Error::NotSupported("check needs more metadata reads than its limit").set_path(file_.name());
    }
    return file_.ReadAt(offset, out);
  }
  // Reads what of [offset, offset + out.size()) lies in the file; the rest
  // reads as zeros (as qemu's file driver reads past the end).
  Status ReadPadded(uint64_t offset, std::span<std::byte> out) {
    const uint64_t size = file_.size_bytes();
    const uint64_t have = offset >= size ? 0 : std::min<uint64_t>(out.size(), size - offset);
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(have), out.end(), std::byte{0});
    if (have == 0) return OkStatus();
    return Read(offset, out.first(have));
  }
  // How often a table is referenced: by any L1 (or snapshot table entry),
  // and by the active L1 alone.
  struct Uses {
    uint64_t times = 0;
    uint64_t active = 0;
  };
  Status CheckL1(uint64_t l1_offset, uint32_t l1_size, const Uses& uses);
  Status CheckL2(uint64_t l2_offset, const Uses& uses);
  void CheckSnapshotExtraData(const SnapshotTable& table);
  Status ReadRefcounts();
  void CountRefcountBlocks();
  Status CheckBitmaps();
  void CompareRefcounts();
  void CheckCopied();

  BlockSource& file_;
  const Header& h_;
  const CheckOptions& options_;
  const uint64_t cs_;
  CheckReport report_;
  uint64_t scanned_ = 0;
  uint64_t scan_limit_ = 0;
  // References we counted and refcounts stored in the file (saturating),
  // per host cluster: the file's clusters and one more (a region may end
  // less than a cluster past the end of the file, as qemu allows).
  std::vector<uint32_t> refs_;
  std::vector<uint32_t> stored_;
  uint64_t compared_clusters_ = 0;  // the file's clusters, or one more when referenced
  std::vector<uint64_t> refcount_table_;  // the refcount table's entries
  // Active entries whose COPIED flag must equal (refcount == 1).
  struct CopiedUse { uint64_t entry_offset, entry, host; bool l1; };
  std::vector<CopiedUse> copied_;
  // Each L1 and L2 table is read and walked once, its references counted
  // `times` over: snapshots share tables, and a crafted file can point
  // millions of L1 entries at one L2 table (re-reading it for each made a
  // 17 MB file cost 128 GiB of reads).
  std::map<std::pair<uint64_t, uint32_t>, Uses> l1_tables_;  // (offset, entries)
  std::map<uint64_t, Uses> l2_tables_;
};

// The rules are qemu's check_refcounts_l2 (docs/formats/qcow2.md §3.1).
Status Checker::CheckL2(uint64_t l2_offset, const Uses& uses) {
  std::vector<std::byte> table(cs_);
  BARGE_RETURN_IF_ERROR(ReadPadded(l2_offset, table));
  const uint32_t entry_bytes = h_.l2_entry_bytes();
  const uint64_t n = h_.l2_entries();
  const bool ext = h_.extended_l2();
  const bool data_file = h_.has_data_file();
  uint64_t next_contiguous = 0;  // host offset right after the last mapped cluster
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t at = l2_offset + i * entry_bytes;
    const uint64_t entry = LoadBe64(table.data() + i * entry_bytes);
    const uint64_t bitmap = ext ? LoadBe64(table.data() + i * entry_bytes + 8) : 0;
    const ClusterType type = GetClusterType(entry, ext, data_file);
    if (type == ClusterType::kCompressed) {
      if (entry & kOflagCopied) {
        Corrupt("compressed cluster with the COPIED flag: l2_entry=" + Hex(entry) + " at " + Hex(at));
      }
      if (data_file) {
        Corrupt("compressed cluster in an image with a data file: l2_entry=" + Hex(entry) + " at " + Hex(at));
        continue;
      }
      if (bitmap != 0) {
        Corrupt("compressed cluster with a non-zero subcluster bitmap at " + Hex(at));
        continue;
      }
      const CompressedPayload payload = DecodeCompressed(entry, h_.cluster_bits);
      Reference(payload.host, payload.bytes, "compressed cluster", uses.times);
      report_.allocated_clusters += uses.active;
      // A compressed cluster counts as fragmented too (qemu: it shares
      // sectors with its neighbours, so they are read again).
      report_.compressed_clusters += uses.active;
      report_.fragmented_clusters += uses.active;
      continue;
    }
    if (entry & kL2ReservedMask) {
      Corrupt("L2 entry with reserved bits set: l2_entry=" + Hex(entry) + " at " + Hex(at));
    }
    const uint64_t host = entry & kL2OffsetMask;
    const uint32_t alloc = uint32_t(bitmap);
    const uint32_t zero = uint32_t(bitmap >> 32);
    // ZERO_PLAIN and unallocated entries have no host cluster (offset 0
    // with COPIED in a data-file image is the data file's first cluster).
    if (!HasHostCluster(type)) {
      if (alloc != 0) Corrupt("unallocated cluster with a non-zero subcluster allocation bitmap at " + Hex(at));
      continue;
    }
    report_.allocated_clusters += uses.active;
    // Fragmentation is counted within one L2 table, as qemu walks it.
    if (next_contiguous != 0 && host != next_contiguous) report_.fragmented_clusters += uses.active;
    next_contiguous = host + cs_;
    if (alloc & zero) Corrupt("subcluster both allocated and zero at " + Hex(at));
    // As qemu-img check, the range an unaligned offset names is still
    // counted: no leak, and an error for a straddled cluster without refcount.
    if (!IsClusterAligned(host, h_.cluster_bits)) {
      Corrupt("data cluster is not properly aligned; L2 entry corrupted at " + Hex(at));
    }
    if (!data_file) Reference(host, cs_, "data cluster", uses.times);
    if (uses.active) copied_.push_back({at, entry, host, false});
  }
  return OkStatus();
}

// Counts the L2 tables of one L1 table; they are walked later, once each.
Status Checker::CheckL1(uint64_t l1_offset, uint32_t l1_size, const Uses& uses) {
  if (l1_size == 0) return OkStatus();
  Reference(l1_offset, uint64_t{l1_size} * 8, "L1 table", uses.times);
  if (l1_offset >= file_.size_bytes()) return OkStatus();  // reported by Reference
  std::vector<std::byte> l1(uint64_t{l1_size} * 8);
  BARGE_RETURN_IF_ERROR(ReadPadded(l1_offset, l1));
  for (uint32_t i = 0; i < l1_size; ++i) {
    const uint64_t at = l1_offset + 8 * uint64_t{i};
    const uint64_t entry = LoadBe64(l1.data() + 8 * uint64_t{i});
    if (entry == 0) continue;
    if (entry & kL1ReservedMask) {
      Corrupt("L1 entry with reserved bits set: l1_entry=" + Hex(entry) + " at " + Hex(at));
    }
    const uint64_t l2 = entry & kL1OffsetMask;
    if (l2 == 0) {
      // qemu would take the header cluster for the L2 table.
      Corrupt("L1 entry with flags but no L2 table offset: l1_entry=" + Hex(entry) + " at " + Hex(at));
      continue;
    }
    if (!IsClusterAligned(l2, h_.cluster_bits)) {
      Corrupt("L2 table offset " + Hex(l2) + " not aligned; L1 entry at " + Hex(at));
      continue;
    }
    Uses& l2_uses = l2_tables_[l2];
    l2_uses.times += uses.times;
    l2_uses.active += uses.active;
    if (uses.active) copied_.push_back({at, entry, l2, true});
  }
  return OkStatus();
}

// qemu: every snapshot table entry of a version 3 image carries at least
// 16 bytes of extra data (the 64-bit VM state size and the disk size).
void Checker::CheckSnapshotExtraData(const SnapshotTable& table) {
  if (h_.version < 3) return;
  for (size_t i = 0; i < table.extra_bytes.size(); ++i) {
    if (table.extra_bytes[i] < 16) {
      Corrupt("snapshot table entry " + std::to_string(i) + " is incomplete (" +
              std::to_string(table.extra_bytes[i]) + " bytes of extra data)");
    }
  }
}

// Reads the refcount table and the stored refcount of every cluster (a
// block is read wherever its entry points, as qemu's refcount lookup does;
// CountRefcountBlocks judges the entries).
Status Checker::ReadRefcounts() {
  const uint64_t table_bytes = h_.refcount_table_bytes();
  Reference(h_.refcount_table_offset, table_bytes, "refcount table");
  refcount_table_.assign(table_bytes / 8, 0);
  if (h_.refcount_table_offset < file_.size_bytes()) {
    std::vector<std::byte> table(table_bytes);
    BARGE_RETURN_IF_ERROR(ReadPadded(h_.refcount_table_offset, table));
    for (uint64_t i = 0; i < table_bytes / 8; ++i) refcount_table_[i] = LoadBe64(table.data() + 8 * i);
  }
  const uint64_t per_block = RefcountsPerBlock(h_.cluster_bits, h_.refcount_order);
  const uint32_t bits = 1u << h_.refcount_order;
  std::vector<std::byte> block(cs_);
  for (uint64_t i = 0; i < refcount_table_.size() && i * per_block < stored_.size(); ++i) {
    const uint64_t block_offset = refcount_table_[i] & kRefcountTableOffsetMask;
    if (block_offset == 0 || !IsClusterAligned(block_offset, h_.cluster_bits)) continue;
    if (block_offset >= file_.size_bytes()) continue;  // reads as zeros
    BARGE_RETURN_IF_ERROR(ReadPadded(block_offset, block));
    for (uint64_t j = 0; j < per_block; ++j) {
      const uint64_t cluster = i * per_block + j;
      if (cluster >= stored_.size()) break;
      uint64_t value;
      if (bits >= 8) {
        value = 0;
        for (uint32_t b = 0; b < bits / 8; ++b) value = (value << 8) | uint8_t(block[j * (bits / 8) + b]);
      } else {
        value = (uint8_t(block[j * bits / 8]) >> ((j * bits) % 8)) & ((1u << bits) - 1);
      }
      stored_[cluster] = uint32_t(std::min<uint64_t>(value, UINT32_MAX));
    }
  }
  return OkStatus();
}

// qemu's check_refblocks: counted last, each refcount block must then be
// referenced exactly once (a block shared by two entries, or lying on other
// metadata, is a corruption whatever its stored refcount says).
void Checker::CountRefcountBlocks() {
  for (uint64_t i = 0; i < refcount_table_.size(); ++i) {
    const uint64_t entry = refcount_table_[i];
    const uint64_t block_offset = entry & kRefcountTableOffsetMask;
    if (entry & ~kRefcountTableOffsetMask) {
      Corrupt("refcount table entry " + std::to_string(i) + " has reserved bits set: " + Hex(entry));
      continue;
    }
    if (block_offset == 0) continue;
    if (!IsClusterAligned(block_offset, h_.cluster_bits)) {
      Corrupt("refcount block " + std::to_string(i) + " at " + Hex(block_offset) + " is not cluster aligned");
      continue;
    }
    const uint64_t cluster = block_offset >> h_.cluster_bits;
    if (cluster >= compared_clusters_) {
      Corrupt("refcount block " + std::to_string(i) + " at " + Hex(block_offset) + " is outside the image");
      continue;
    }
    Reference(block_offset, cs_, "refcount block");
    if (refs_[cluster] != 1) {
      Corrupt("refcount block " + std::to_string(i) + " at " + Hex(block_offset) + " is referenced " +
              std::to_string(refs_[cluster]) + " times");
    }
  }
}

// qemu's qcow2_check_bitmaps_refcounts.
Status Checker::CheckBitmaps() {
  if (!h_.bitmaps_valid()) return OkStatus();  // without autoclear bit 0 they are leaks
  auto entries = ReadBitmapDirectory(file_, h_);
  if (!entries.ok()) {
    Corrupt(entries.error().message());
    return OkStatus();
  }
  Reference(h_.bitmap_directory_offset, h_.bitmap_directory_size, "bitmap directory");
  for (const BitmapEntry& e : *entries) {
    const uint64_t table_bytes = uint64_t{e.info.table_size} * 8;
    Reference(e.info.table_offset, table_bytes, "bitmap table");
    std::vector<std::byte> table(table_bytes);  // inside the file (checked by the directory)
    BARGE_RETURN_IF_ERROR(Read(e.info.table_offset, table));
    for (uint64_t i = 0; i < e.info.table_size; ++i) {
      const uint64_t entry = LoadBe64(table.data() + 8 * i);
      const uint64_t data = entry & kBitmapTableOffsetMask;
      if (entry & kBitmapTableReservedMask) {
        Corrupt("bitmap '" + e.info.name + "' table entry " + std::to_string(i) +
                " has reserved bits set: " + Hex(entry));
        continue;
      }
      if (data == 0) continue;
      if (entry & 1) {
        Corrupt("bitmap '" + e.info.name + "' table entry " + std::to_string(i) +
                " has a data cluster and the all-ones flag: " + Hex(entry));
        continue;
      }
      if (!IsClusterAligned(data, h_.cluster_bits)) {
        Corrupt("bitmap '" + e.info.name + "' data cluster " + Hex(data) + " is not aligned");
        continue;
      }
      Reference(data, cs_, "bitmap data cluster");
    }
  }
  return OkStatus();
}

void Checker::CompareRefcounts() {
  for (uint64_t c = 0; c < compared_clusters_; ++c) {
    if (stored_[c] > 0 || refs_[c] > 0) report_.image_end_offset = (c + 1) << h_.cluster_bits;
    if (stored_[c] < refs_[c]) {
      Corrupt("cluster " + std::to_string(c) + " refcount=" + std::to_string(stored_[c]) +
              " reference=" + std::to_string(refs_[c]));
    } else if (stored_[c] > refs_[c]) {
      ++report_.leaks;
      Note("Leaked cluster " + std::to_string(c) + " refcount=" + std::to_string(stored_[c]) +
           " reference=" + std::to_string(refs_[c]));
    }
  }
}

void Checker::CheckCopied() {
  for (const CopiedUse& use : copied_) {
    const uint64_t c = use.host >> h_.cluster_bits;
    // Data in a data file has refcount 1 by definition.
    const bool in_data_file = !use.l1 && h_.has_data_file();
    // Past the end of the refcounts the refcount is 0 (qemu-img check then
    // adds this error to the one for the reference).
    const uint32_t refcount = in_data_file ? 1 : c < stored_.size() ? stored_[c] : 0;
    const bool want = refcount == 1;
    if (bool(use.entry & kOflagCopied) != want) {
      Corrupt(std::string("OFLAG_COPIED ") + (use.l1 ? "L2 cluster" : "data cluster") +
              ": entry=" + Hex(use.entry) + " at " + Hex(use.entry_offset) +
              " refcount=" + std::to_string(refcount));
    }
  }
}

Result<CheckReport> Checker::Run() {
  const uint64_t file_clusters = SizeToClusters(file_.size_bytes(), h_.cluster_bits);
  scan_limit_ = options_.max_scan_bytes ? options_.max_scan_bytes
                                        : 4 * file_.size_bytes() + kScanAllowanceBytes;
  if (file_clusters > options_.max_file_clusters) {
    return Error::NotSupported("file has " + std::to_string(file_clusters) +
                               " clusters, more than the checker's limit")
        .set_path(file_.name());
  }
  report_.file_clusters = file_clusters;
  report_.total_clusters = SizeToClusters(h_.size, h_.cluster_bits);
  refs_.assign(file_clusters + 1, 0);
  stored_.assign(file_clusters + 1, 0);
  compared_clusters_ = file_clusters;
  // qemu's order: header, active L1 and L2, snapshots, snapshot table,
  // refcount table, bitmaps, refcount blocks.
  Reference(0, cs_, "header");
  Uses& active = l1_tables_[{h_.l1_table_offset, h_.l1_size}];
  active.times = 1;
  active.active = 1;
  auto snapshots = ReadSnapshotTable(file_, h_);
  if (!snapshots.ok()) {
    Corrupt(snapshots.error().message());
  } else if (h_.nb_snapshots > 0) {
    if (h_.has_data_file()) Corrupt(std::to_string(h_.nb_snapshots) + " snapshots in an image with a data file");
    CheckSnapshotExtraData(*snapshots);
    for (const SnapshotInfo& s : snapshots->snapshots) ++l1_tables_[{s.l1_table_offset, s.l1_size}].times;
  }
  for (const auto& [table, uses] : l1_tables_) {
    BARGE_RETURN_IF_ERROR(CheckL1(table.first, table.second, uses));
  }
  for (const auto& [l2, uses] : l2_tables_) {
    Reference(l2, cs_, "L2 table", uses.times);
    if (l2 >= file_.size_bytes()) continue;  // reported by Reference
    BARGE_RETURN_IF_ERROR(CheckL2(l2, uses));
  }
  if (snapshots.ok() && h_.nb_snapshots > 0) {
    Reference(h_.snapshots_offset, snapshots->table_bytes, "snapshot table");
  }
  BARGE_RETURN_IF_ERROR(ReadRefcounts());
  BARGE_RETURN_IF_ERROR(CheckBitmaps());
  CountRefcountBlocks();
  CompareRefcounts();
  CheckCopied();
  return std::move(report_);
}

}  // namespace

Result<CheckReport> CheckQcow2(BlockSource& file, const CheckOptions& options) {
  auto header = ReadHeader(file);
  if (!header.ok()) {
    Error e = std::move(header).error();
    if (e.path().empty()) e.set_path(file.name());  // name the file, as OpenImage does
    return e;
  }
  const Header h = std::move(header).value();
  Checker checker(file, h, options);
  return checker.Run();
}

}  // namespace barge::formats::qcow2
