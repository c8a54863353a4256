// qcow2 refcount and structure checker: one in-memory reference count per
// host cluster, compared with the stored refcounts and COPIED flags.
#include "formats/qcow2_check.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_snapshot.h"

namespace barge::formats::qcow2 {

namespace {

// The automatic scan budget: four times the file plus this. Walking each
// table once reads each metadata byte about once (refcount blocks and
// bitmap data too), so only crafted files come near it.
constexpr uint64_t kScanAllowanceBytes = uint64_t{256} << 20;

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

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
  bool InFile(uint64_t offset, uint64_t length) const {
    return offset <= file_.size_bytes() && length <= file_.size_bytes() - offset;
  }
  // +times on every host cluster that [offset, offset+length) touches.
  void Reference(uint64_t offset, uint64_t length, const char* what, uint64_t times = 1) {
    if (length == 0) return;
    uint64_t first = offset >> h_.cluster_bits;
    uint64_t last = (offset + (length - 1)) >> h_.cluster_bits;
    // As qemu-img check: a region that ends a cluster or more past the end
    // of the file is an error and counts nothing; one that ends less than a
    // cluster past it counts (its last cluster then has no refcount).
    const uint64_t end = offset + (length - 1) < offset ? UINT64_MAX : offset + length;
    if (end > file_.size_bytes() && end - file_.size_bytes() >= cs_) {
      Corrupt(std::string("counting reference for region exceeding the end of the file by one "
                          "cluster or more: ") + what + " at " + Hex(offset));
      return;
    }
    if (last >= refs_.size()) {
      refs_.resize(last + 1, 0);
      stored_.resize(last + 1, 0);
    }
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
  // How often a table is referenced: by any L1 (or snapshot table entry),
  // and by the active L1 alone.
  struct Uses {
    uint64_t times = 0;
    uint64_t active = 0;
  };
  Status CheckL1(uint64_t l1_offset, uint32_t l1_size, const Uses& uses);
  Status CheckL2(uint64_t l2_offset, const Uses& uses);
  Status CheckRefcountTable();
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
  std::vector<uint32_t> refs_;    // references we counted, per host cluster
  std::vector<uint32_t> stored_;  // refcounts stored in the file (saturating)
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

Status Checker::CheckL2(uint64_t l2_offset, const Uses& uses) {
  std::vector<std::byte> table(cs_);
  BARGE_RETURN_IF_ERROR(Read(l2_offset, table));
  const uint32_t entry_bytes = h_.l2_entry_bytes();
  const uint64_t n = h_.l2_entries();
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t at = l2_offset + i * entry_bytes;
    const uint64_t entry = LoadBe64(table.data() + i * entry_bytes);
    if (entry & kOflagCompressed) {
      if (entry & kOflagCopied) Corrupt("compressed cluster with the COPIED flag: l2_entry=" + Hex(entry));
      const CompressedPayload payload = DecodeCompressed(entry, h_.cluster_bits);
      Reference(payload.host, payload.bytes, "compressed cluster", uses.times);
      report_.allocated_clusters += uses.active;
      continue;
    }
    const uint64_t host = entry & kL2OffsetMask;
    if (h_.extended_l2()) {
      const uint64_t bitmap = LoadBe64(table.data() + i * entry_bytes + 8);
      if (uint32_t(bitmap) & uint32_t(bitmap >> 32)) Corrupt("subcluster both allocated and zero at " + Hex(at));
    }
    // With a data file, COPIED and offset 0 is guest cluster 0 in place.
    const bool mapped = host != 0 || (h_.has_data_file() && (entry & kOflagCopied) &&
                                      (h_.extended_l2() || !(entry & kOflagZero)));
    if (!mapped) continue;
    report_.allocated_clusters += uses.active;
    // As qemu-img check, the range an unaligned offset names is still
    // counted: no leak, and an error for a straddled cluster without refcount.
    if (!IsClusterAligned(host, h_.cluster_bits)) {
      Corrupt("data cluster is not properly aligned; L2 entry corrupted at " + Hex(at));
    }
    if (h_.has_data_file()) continue;  // lives in the data file: not refcounted
    Reference(host, cs_, "data cluster", uses.times);
    if (uses.active) copied_.push_back({at, entry, host, false});
  }
  return OkStatus();
}

// Counts the L2 tables of one L1 table; they are walked later, once each.
Status Checker::CheckL1(uint64_t l1_offset, uint32_t l1_size, const Uses& uses) {
  Reference(l1_offset, uint64_t{l1_size} * 8, "L1 table", uses.times);
  if (!InFile(l1_offset, uint64_t{l1_size} * 8)) return OkStatus();
  std::vector<std::byte> l1(uint64_t{l1_size} * 8);
  BARGE_RETURN_IF_ERROR(Read(l1_offset, l1));
  for (uint32_t i = 0; i < l1_size; ++i) {
    const uint64_t at = l1_offset + 8 * uint64_t{i};
    const uint64_t entry = LoadBe64(l1.data() + 8 * uint64_t{i});
    const uint64_t l2 = entry & kL1OffsetMask;
    if (l2 == 0) continue;
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

Status Checker::CheckRefcountTable() {
  const uint64_t table_bytes = h_.refcount_table_bytes();
  Reference(h_.refcount_table_offset, table_bytes, "refcount table");
  if (!InFile(h_.refcount_table_offset, table_bytes)) return OkStatus();
  std::vector<std::byte> table(table_bytes);
  BARGE_RETURN_IF_ERROR(Read(h_.refcount_table_offset, table));
  const uint64_t per_block = RefcountsPerBlock(h_.cluster_bits, h_.refcount_order);
  const uint32_t bits = 1u << h_.refcount_order;
  std::vector<std::byte> block(cs_);
  for (uint64_t i = 0; i < table_bytes / 8; ++i) {
    const uint64_t block_offset = LoadBe64(table.data() + 8 * i) & kRefcountTableOffsetMask;
    if (block_offset == 0) continue;
    if (!IsClusterAligned(block_offset, h_.cluster_bits)) {
      Corrupt("refcount block offset " + Hex(block_offset) + " is not cluster aligned");
      continue;
    }
    Reference(block_offset, cs_, "refcount block");
    if (!InFile(block_offset, cs_)) continue;
    BARGE_RETURN_IF_ERROR(Read(block_offset, block));
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
      if (entry & kBitmapTableReservedMask) Corrupt("bitmap '" + e.info.name + "' table entry has reserved bits");
      if (data == 0) continue;
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
  for (uint64_t c = 0; c < refs_.size(); ++c) {
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
    // Past the end of the file the refcount is 0 (qemu-img check then adds
    // this error to the one for the reference).
    const uint64_t refcount = c < stored_.size() ? stored_[c] : 0;
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
  refs_.assign(file_clusters, 0);
  stored_.assign(file_clusters, 0);
  Reference(0, cs_, "header");
  Uses& active = l1_tables_[{h_.l1_table_offset, h_.l1_size}];
  active.times = 1;
  active.active = 1;
  auto snapshots = ReadSnapshotTable(file_, h_);
  if (!snapshots.ok()) {
    Corrupt(snapshots.error().message());
  } else if (h_.nb_snapshots > 0) {
    Reference(h_.snapshots_offset, snapshots->table_bytes, "snapshot table");
    for (const SnapshotInfo& s : snapshots->snapshots) ++l1_tables_[{s.l1_table_offset, s.l1_size}].times;
  }
  for (const auto& [table, uses] : l1_tables_) {
    BARGE_RETURN_IF_ERROR(CheckL1(table.first, table.second, uses));
  }
  for (const auto& [l2, uses] : l2_tables_) {
    Reference(l2, cs_, "L2 table", uses.times);
    if (!InFile(l2, cs_)) continue;  // reported by Reference
    BARGE_RETURN_IF_ERROR(CheckL2(l2, uses));
  }
  BARGE_RETURN_IF_ERROR(CheckRefcountTable());
  BARGE_RETURN_IF_ERROR(CheckBitmaps());
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
