// Offline internal snapshot edits: every operation is planned in memory as
// refcount deltas and table changes, then written as copy-on-write metadata
// and switched with one header write (docs/formats/qcow2.md §5.3).
#include "formats/qcow2_snapshot_edit.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <unordered_set>

#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_refcount_shadow.h"
#include "formats/qcow2_snapshot.h"
#include "formats/units.h"

namespace barge::formats {
namespace {

using namespace qcow2;

constexpr uint64_t kAutoclearKnown = kAutoclearBitmaps | kAutoclearDataFileRaw;

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 snapshot edit: " + what).set_offset(offset);
}
Error Unsupported(const std::string& what) {
  return Error::NotSupported("qcow2 snapshot edit: " + what);
}

Status InStep(Status s, const char* step) {
  if (!s.ok()) return std::move(s).error().Wrap(std::string("qcow2 snapshot edit: ") + step);
  return s;
}

using L2Table = std::shared_ptr<const std::vector<std::byte>>;

// Collects the writes of step 1 and sends them sorted, those that continue
// each other as one write (up to 4 MiB), so the file system sees few large
// writes. Single-threaded; `sink` must outlive it.
class BatchedWriter {
 public:
  explicit BatchedWriter(BlockSink& sink) : sink_(sink), adapter_(*this) {}
  void Add(uint64_t offset, std::vector<std::byte> bytes) {
    if (!bytes.empty()) writes_.emplace(offset, std::move(bytes));
  }
  // A sink whose WriteAt adds to the batch (for RefcountShadow::WriteNew).
  BlockSink& AsSink() { return adapter_; }
  Status Write() {
    constexpr uint64_t kMaxBytes = 4 << 20;
    std::vector<std::byte> run;
    uint64_t run_offset = 0;
    for (auto& [offset, bytes] : writes_) {
      if (!run.empty() && (offset != run_offset + run.size() || run.size() + bytes.size() > kMaxBytes)) {
        BARGE_RETURN_IF_ERROR(sink_.WriteAt(run_offset, run));
        run.clear();
      }
      if (run.empty()) run_offset = offset;
      run.insert(run.end(), bytes.begin(), bytes.end());
    }
    if (!run.empty()) BARGE_RETURN_IF_ERROR(sink_.WriteAt(run_offset, run));
    writes_.clear();
    return OkStatus();
  }

 private:
  class Adapter final : public BlockSink {
   public:
    explicit Adapter(BatchedWriter& w) : w_(w) {}
    const std::string& name() const override { return w_.sink_.name(); }
    uint64_t size_bytes() const override { return w_.sink_.size_bytes(); }
    Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
      w_.Add(offset, std::vector<std::byte>(data.begin(), data.end()));
      return OkStatus();
    }
    Status Flush() override { return Error::Internal("batched writer: flush through the batch"); }

   private:
    BatchedWriter& w_;
  };

  BlockSink& sink_;
  Adapter adapter_;
  std::map<uint64_t, std::vector<std::byte>> writes_;  // by offset; never overlapping
};

// One snapshot of the table being edited.
struct Entry {
  SnapshotInfo info;
  std::vector<std::byte> unknown_extra;
  std::vector<uint64_t> new_l1;  // created by this edit: its L1 entries
  bool is_new = false;
};

// One edit of one image. Single-threaded; `file` must outlive it.
class Transaction {
 public:
  Transaction(BlockSource& file, const SnapshotEditOptions& options) : file_(file), options_(options) {}

  Status Load();
  Result<size_t> Find(const std::string& id_or_name) const {
    std::vector<SnapshotInfo> infos = Infos();
    return FindSnapshot(infos, id_or_name);
  }
  const std::vector<Entry>& entries() const { return entries_; }

  Status Create(const SnapshotCreateSpec& spec);
  Status Delete(size_t index);
  Status Rename(size_t index, const std::string& new_name, bool allow_duplicate);
  Status Rollback(size_t index);
  // Plans the rest, calls before_write, writes, commits.
  Status Commit(BlockSink& sink);
  // EstimateSnapshotCreateBytes, once loaded.
  uint64_t EstimateCreate() const;

 private:
  std::vector<SnapshotInfo> Infos() const {
    std::vector<SnapshotInfo> out;
    for (const Entry& e : entries_) out.push_back(e.info);
    return out;
  }
  Status CheckName(const std::string& name, bool allow_duplicate, const Entry* except) const;
  Result<std::vector<uint64_t>> ReadL1(uint64_t offset, uint32_t size, const std::string& what);
  Result<L2Table> ReadL2(uint64_t offset);
  Status CheckL2Offset(uint64_t l2, uint64_t entry_at) const;
  // Adds `delta` to every cluster the L1 table `l1` reaches: its L2 tables,
  // data and ZERO_ALLOC clusters, and each host cluster a compressed
  // payload touches (once per entry), as qemu's
  // qcow2_update_snapshot_refcount does.
  Status ApplyView(const std::vector<uint64_t>& l1, uint64_t l1_offset, int64_t delta);
  // Sets COPIED on standard entries exactly where the data's new count is
  // 1 (and clears it on compressed ones). Returns whether anything changed.
  Result<bool> FixFlags(std::vector<std::byte>& table);
  Status FreeRange(uint64_t offset, uint64_t bytes, const char* what);

  BlockSource& file_;
  const SnapshotEditOptions& options_;
  Header h_;
  std::vector<std::byte> cluster0_;
  uint64_t file_size_ = 0;
  std::unique_ptr<RefcountShadow> rc_;
  std::vector<uint64_t> old_active_l1_;
  std::vector<uint64_t> active_l1_;  // the active view after the operations (entries as read)
  std::unordered_set<uint64_t> old_active_l2_;
  std::vector<Entry> entries_;
  uint64_t old_table_bytes_ = 0;
  bool table_changed_ = false;
  // L2 tables read so far (up to options_.l2_cache_bytes), and the tables
  // fixed in place (tables the old active image does not use).
  std::map<uint64_t, L2Table> l2_cache_;
  uint64_t l2_cache_bytes_ = 0;
  std::map<uint64_t, std::vector<std::byte>> l2_in_place_;
};

Status Transaction::Load() {
  file_size_ = file_.size_bytes();
  std::byte magic[4] = {};
  if (file_size_ >= kV2HeaderLength) BARGE_RETURN_IF_ERROR(file_.ReadAt(0, magic));
  if (file_size_ < kV2HeaderLength || LoadBe32(magic) != kMagic) {
    return Unsupported("'" + file_.name() + "' is not a qcow2 image (raw images have no snapshots)");
  }
  BARGE_ASSIGN_OR_RETURN(h_, ReadHeader(file_));
  if (h_.incompatible_features & kIncompatCorrupt) {
    return Error::Corruption("qcow2 snapshot edit: the image is marked corrupt; repair it with "
                             "'qemu-img check -r all' first");
  }
  if (h_.incompatible_features & kIncompatDirty) {
    return Unsupported("the image is dirty (lazy refcounts not rebuilt); open it once with qemu or run "
                       "'qemu-img check -r all' first");
  }
  if (h_.has_data_file()) {
    return Unsupported("internal snapshots of an image with an external data file ('" + h_.data_file +
                       "') are not possible (qemu refuses them too: Operation not supported)");
  }
  cluster0_.resize(std::min<uint64_t>(h_.cluster_size(), file_size_));
  BARGE_RETURN_IF_ERROR(file_.ReadAt(0, cluster0_));
  BARGE_ASSIGN_OR_RETURN(old_active_l1_, ReadL1(h_.l1_table_offset, h_.l1_size, "active L1 table"));
  active_l1_ = old_active_l1_;
  for (uint64_t e : old_active_l1_) {
    if (e & kL1OffsetMask) old_active_l2_.insert(e & kL1OffsetMask);
  }
  BARGE_ASSIGN_OR_RETURN(SnapshotTable table, ReadSnapshotTable(file_, h_));
  old_table_bytes_ = table.table_bytes;
  for (size_t i = 0; i < table.snapshots.size(); ++i) {
    Entry e;
    e.info = std::move(table.snapshots[i]);
    e.unknown_extra = std::move(table.unknown_extra[i]);
    entries_.push_back(std::move(e));
  }
  rc_ = std::make_unique<RefcountShadow>(file_, h_);
  return rc_->Load();
}

uint64_t Transaction::EstimateCreate() const {
  const uint64_t cs = h_.cluster_size();
  const uint64_t per_block = RefcountsPerBlock(h_.cluster_bits, h_.refcount_order);
  uint64_t l2_tables = 0;
  for (uint64_t e : old_active_l1_) l2_tables += (e & kL1OffsetMask) != 0;
  const uint64_t l1_clusters = SizeToClusters(old_active_l1_.size() * 8, h_.cluster_bits);
  // A new entry: fixed part, extra data, an id of up to 20 digits, a name.
  const uint64_t table_clusters =
      SizeToClusters(old_table_bytes_ + 8 + kSnapshotFixedBytes + kSnapshotKnownExtraBytes + 20 +
                         kMaxSnapshotNameBytes,
                     h_.cluster_bits);
  // Every existing refcount block may move; new clusters may need new
  // blocks, and the table may grow by a cluster.
  uint64_t blocks = SizeToClusters(file_size_, h_.cluster_bits) / per_block + 1;
  const uint64_t new_clusters = 2 * l1_clusters + l2_tables + table_clusters + h_.refcount_table_clusters + 1;
  blocks += new_clusters / per_block + 2;
  return (new_clusters + blocks) * cs + kSectorBytes;  // and the header write
}

Result<std::vector<uint64_t>> Transaction::ReadL1(uint64_t offset, uint32_t size, const std::string& what) {
  std::vector<uint64_t> l1(size);
  if (size == 0) return l1;
  const uint64_t bytes = uint64_t{size} * 8;
  if (bytes > kMaxL1Bytes || !IsClusterAligned(offset, h_.cluster_bits) || offset == 0 ||
      offset > file_size_ || bytes > file_size_ - offset) {
    return Bad(what + " at " + Hex(offset) + " (" + std::to_string(size) + " entries) is not a valid table",
               offset);
  }
  std::vector<std::byte> raw(bytes);
  BARGE_RETURN_IF_ERROR(file_.ReadAt(offset, raw));
  for (uint32_t i = 0; i < size; ++i) l1[i] = LoadBe64(raw.data() + 8 * uint64_t{i});
  return l1;
}

Status Transaction::CheckL2Offset(uint64_t l2, uint64_t entry_at) const {
  if (!IsClusterAligned(l2, h_.cluster_bits)) {
    return Bad("L1 entry: L2 table offset " + Hex(l2) + " is not cluster aligned", entry_at);
  }
  if (l2 > file_size_ || h_.cluster_size() > file_size_ - l2) {
    return Bad("L1 entry: L2 table " + Hex(l2) + " lies beyond the end of the file", entry_at);
  }
  return OkStatus();
}

Result<L2Table> Transaction::ReadL2(uint64_t offset) {
  if (auto it = l2_in_place_.find(offset); it != l2_in_place_.end()) {
    return std::make_shared<const std::vector<std::byte>>(it->second);
  }
  if (auto it = l2_cache_.find(offset); it != l2_cache_.end()) return it->second;
  auto table = std::make_shared<std::vector<std::byte>>(h_.cluster_size());
  BARGE_RETURN_IF_ERROR(file_.ReadAt(offset, *table));
  if (l2_cache_bytes_ + table->size() <= options_.l2_cache_bytes) {
    l2_cache_bytes_ += table->size();
    l2_cache_.emplace(offset, table);
  }
  return L2Table(std::move(table));
}

Status Transaction::ApplyView(const std::vector<uint64_t>& l1, uint64_t l1_offset, int64_t delta) {
  const uint32_t cb = h_.cluster_bits;
  const uint32_t entry_bytes = h_.l2_entry_bytes();
  const uint64_t n = h_.l2_entries();
  // The data a view drops is what a snapshot delete or rollback frees for
  // the file system; freed L2 tables are left for the next edit's copies.
  const bool discard = delta < 0;
  // Consecutive data clusters (the common case) are counted as one run.
  uint64_t run_first = 0, run_count = 0;
  auto flush_run = [&]() -> Status {
    rc_->set_discard_class(discard);
    Status s = rc_->AddRun(run_first, run_count, delta, "data cluster");
    rc_->set_discard_class(false);
    run_count = 0;
    return s;
  };
  // Ask for all the view's tables at once (a cold cache then waits once).
  for (uint64_t e : l1) {
    if ((e & kL1OffsetMask) != 0 && !l2_cache_.count(e & kL1OffsetMask)) {
      file_.WillNeed(e & kL1OffsetMask, h_.cluster_size());
    }
  }
  for (size_t i = 0; i < l1.size(); ++i) {
    const uint64_t l2 = l1[i] & kL1OffsetMask;
    if (l2 == 0) continue;
    BARGE_RETURN_IF_ERROR(CheckL2Offset(l2, l1_offset + 8 * i));
    BARGE_RETURN_IF_ERROR(rc_->Add(l2 >> cb, delta, "L2 table"));
    BARGE_ASSIGN_OR_RETURN(L2Table table, ReadL2(l2));
    for (uint64_t j = 0; j < n; ++j) {
      const uint64_t at = l2 + j * entry_bytes;
      const uint64_t entry = LoadBe64(table->data() + j * entry_bytes);
      if (entry & kOflagCompressed) {
        const CompressedPayload p = DecodeCompressed(entry, cb);
        if ((p.host >> 56) != 0 || p.host >= file_size_) {
          return Bad("L2 entry: compressed data offset " + Hex(p.host) + " lies beyond the end of the file", at);
        }
        rc_->set_discard_class(discard);
        for (uint64_t c = p.host >> cb; c <= (p.host + p.bytes - 1) >> cb; ++c) {
          BARGE_RETURN_IF_ERROR(rc_->Add(c, delta, "compressed data cluster"));
        }
        rc_->set_discard_class(false);
        continue;
      }
      const uint64_t host = entry & kL2OffsetMask;
      if (host == 0) continue;
      if (!IsClusterAligned(host, cb)) return Bad("L2 entry: data cluster offset is not cluster aligned", at);
      if (host >= file_size_) return Bad("L2 entry: data cluster lies beyond the end of the file", at);
      const uint64_t c = host >> cb;
      if (run_count > 0 && c == run_first + run_count) {
        ++run_count;
        continue;
      }
      if (run_count > 0) BARGE_RETURN_IF_ERROR(flush_run());
      run_first = c;
      run_count = 1;
    }
  }
  return flush_run();
}

Result<bool> Transaction::FixFlags(std::vector<std::byte>& table) {
  const uint32_t entry_bytes = h_.l2_entry_bytes();
  const uint64_t n = h_.l2_entries();
  bool changed = false;
  for (uint64_t j = 0; j < n; ++j) {
    std::byte* p = table.data() + j * entry_bytes;
    const uint64_t entry = LoadBe64(p);
    uint64_t want = entry;
    if (entry & kOflagCompressed) {
      want = entry & ~kOflagCopied;
    } else if (const uint64_t host = entry & kL2OffsetMask; host != 0) {
      BARGE_ASSIGN_OR_RETURN(uint64_t count, rc_->Get(host >> h_.cluster_bits));
      want = count == 1 ? (entry | kOflagCopied) : (entry & ~kOflagCopied);
    }
    if (want != entry) {
      StoreBe64(p, want);
      changed = true;
    }
  }
  return changed;
}

Status Transaction::FreeRange(uint64_t offset, uint64_t bytes, const char* what) {
  if (bytes == 0) return OkStatus();
  const uint64_t first = offset >> h_.cluster_bits;
  const uint64_t last = (offset + bytes - 1) >> h_.cluster_bits;
  for (uint64_t c = first; c <= last; ++c) BARGE_RETURN_IF_ERROR(rc_->Add(c, -1, what));
  return OkStatus();
}

Status Transaction::CheckName(const std::string& name, bool allow_duplicate, const Entry* except) const {
  Status valid = ValidateSnapshotName(name);
  if (!valid.ok()) return std::move(valid).error().Wrap("qcow2 snapshot edit");
  if (allow_duplicate) return OkStatus();
  for (const Entry& e : entries_) {
    if (&e != except && e.info.name == name) {
      return Error::InvalidArgument("qcow2 snapshot edit: a snapshot named '" + name + "' exists (id " +
                                    e.info.id + ")");
    }
  }
  return OkStatus();
}

Status Transaction::Create(const SnapshotCreateSpec& spec) {
  BARGE_RETURN_IF_ERROR(CheckName(spec.name, spec.allow_duplicate_name, nullptr));
  if (entries_.size() >= kMaxSnapshots) {
    return Unsupported("the image already has 65536 snapshots, qemu's limit");
  }
  BARGE_RETURN_IF_ERROR(ApplyView(active_l1_, h_.l1_table_offset, +1));
  Entry e;
  e.is_new = true;
  e.info.id = NextSnapshotId(Infos());
  e.info.name = spec.name;
  e.info.virtual_size = h_.size;
  e.info.vm_state_size = 0;
  e.info.vm_clock_nsec = spec.vm_clock_nsec;
  e.info.icount = 0;  // what qemu-img writes
  if (spec.date_sec == 0 && spec.date_nsec == 0) {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
    e.info.date_sec = static_cast<uint32_t>(ns / 1000000000);
    e.info.date_nsec = static_cast<uint32_t>(ns % 1000000000);
  } else {
    e.info.date_sec = spec.date_sec;
    e.info.date_nsec = spec.date_nsec;
  }
  e.info.l1_size = static_cast<uint32_t>(active_l1_.size());
  // The snapshot keeps the tables the active image uses now; COPIED means
  // nothing outside the active tables, so its copy carries none.
  e.new_l1.resize(active_l1_.size());
  for (size_t i = 0; i < active_l1_.size(); ++i) e.new_l1[i] = active_l1_[i] & kL1OffsetMask;
  entries_.push_back(std::move(e));
  table_changed_ = true;
  return OkStatus();
}

Status Transaction::Delete(size_t index) {
  Entry& e = entries_[index];
  if (e.is_new) return Error::Internal("qcow2 snapshot edit: delete of a snapshot made in the same edit");
  BARGE_ASSIGN_OR_RETURN(std::vector<uint64_t> l1,
                         ReadL1(e.info.l1_table_offset, e.info.l1_size, "L1 table of snapshot " + e.info.id));
  BARGE_RETURN_IF_ERROR(ApplyView(l1, e.info.l1_table_offset, -1));
  BARGE_RETURN_IF_ERROR(FreeRange(e.info.l1_table_offset, uint64_t{e.info.l1_size} * 8, "snapshot L1 table"));
  entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(index));
  table_changed_ = true;
  return OkStatus();
}

Status Transaction::Rename(size_t index, const std::string& new_name, bool allow_duplicate) {
  Entry& e = entries_[index];
  if (e.info.name == new_name) return OkStatus();
  BARGE_RETURN_IF_ERROR(CheckName(new_name, allow_duplicate, &e));
  e.info.name = new_name;
  table_changed_ = true;
  return OkStatus();
}

Status Transaction::Rollback(size_t index) {
  const Entry& e = entries_[index];
  if (h_.bitmaps_valid() && h_.nb_bitmaps > 0) {
    return Unsupported("the image has persistent dirty bitmaps, which a rollback would make wrong (qemu "
                       "refuses too: Device has active dirty bitmaps); remove them first");
  }
  if (e.info.virtual_size != h_.size) {
    return Unsupported("snapshot '" + e.info.name + "' (id " + e.info.id + ") has a disk size of " +
                       std::to_string(e.info.virtual_size) + " bytes, the image " + std::to_string(h_.size) +
                       "; rolling back across a resize is not implemented");
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<uint64_t> l1,
                         ReadL1(e.info.l1_table_offset, e.info.l1_size, "L1 table of snapshot " + e.info.id));
  // Up first, so no count passes through 0 on the way.
  BARGE_RETURN_IF_ERROR(ApplyView(l1, e.info.l1_table_offset, +1));
  BARGE_RETURN_IF_ERROR(ApplyView(active_l1_, h_.l1_table_offset, -1));
  // qemu grows the active L1 to the snapshot's size and never shrinks it.
  std::vector<uint64_t> next(std::max(active_l1_.size(), l1.size()), 0);
  for (size_t i = 0; i < l1.size(); ++i) next[i] = l1[i] & kL1OffsetMask;
  active_l1_ = std::move(next);
  return OkStatus();
}

Status Transaction::Commit(BlockSink& sink) {
  const uint32_t cb = h_.cluster_bits;
  const uint64_t cs = h_.cluster_size();
  SnapshotEditPlan plan;
  plan.file_bytes = file_size_;

  // The active tables: COPIED exactly where the new count is 1. A table the
  // old active image uses cannot change before the header switch, so it
  // gets a new copy; a table only snapshots use is fixed in place.
  // When the active image keeps its tables and no count moved onto or off
  // 1, no flag of theirs can change: they are not read again (a delete of
  // a snapshot that shares nothing with the active image, or any create
  // after the first).
  std::map<uint64_t, std::vector<std::byte>> l2_copies;  // new offset -> table
  const bool same_tables = active_l1_.size() == old_active_l1_.size() &&
                           std::equal(active_l1_.begin(), active_l1_.end(), old_active_l1_.begin(),
                                      [](uint64_t a, uint64_t b) { return (a & kL1OffsetMask) == (b & kL1OffsetMask); });
  const bool flags_may_change = !same_tables || rc_->crossed_one() > 0;
  std::vector<uint64_t> new_l1(active_l1_.size(), 0);
  for (size_t i = 0; i < active_l1_.size(); ++i) {
    uint64_t l2 = active_l1_[i] & kL1OffsetMask;
    if (l2 == 0) continue;
    if (!flags_may_change) {
      new_l1[i] = l2;
      continue;
    }
    BARGE_RETURN_IF_ERROR(CheckL2Offset(l2, h_.l1_table_offset + 8 * i));
    BARGE_ASSIGN_OR_RETURN(L2Table table, ReadL2(l2));
    std::vector<std::byte> fixed = *table;
    BARGE_ASSIGN_OR_RETURN(bool changed, FixFlags(fixed));
    if (changed) {
      if (!old_active_l2_.count(l2)) {
        l2_in_place_[l2] = std::move(fixed);
      } else {
        BARGE_ASSIGN_OR_RETURN(uint64_t copy, rc_->Allocate(1, "an L2 table copy"));
        BARGE_RETURN_IF_ERROR(rc_->Add(l2 >> cb, -1, "L2 table"));
        l2_copies[copy] = std::move(fixed);
        l2 = copy;
        ++plan.copied_l2_tables;
      }
    }
    new_l1[i] = l2;
  }
  for (uint64_t& e : new_l1) {
    if (e == 0) continue;
    BARGE_ASSIGN_OR_RETURN(uint64_t count, rc_->Get(e >> cb));
    if (count == 1) e |= kOflagCopied;
  }

  // The active L1 table moves when any entry changes.
  Header next = h_;
  const bool l1_changed = new_l1 != old_active_l1_;
  if (l1_changed && !new_l1.empty()) {
    BARGE_RETURN_IF_ERROR(FreeRange(h_.l1_table_offset, uint64_t{h_.l1_size} * 8, "active L1 table"));
    BARGE_ASSIGN_OR_RETURN(next.l1_table_offset,
                           rc_->Allocate(SizeToClusters(new_l1.size() * 8, cb), "the active L1 table"));
    next.l1_size = static_cast<uint32_t>(new_l1.size());
  }
  // L1 tables of new snapshots.
  for (Entry& e : entries_) {
    if (!e.is_new || e.new_l1.empty()) continue;
    BARGE_ASSIGN_OR_RETURN(e.info.l1_table_offset,
                           rc_->Allocate(SizeToClusters(e.new_l1.size() * 8, cb), "a snapshot L1 table"));
  }
  // The snapshot table.
  std::vector<std::byte> table_bytes;
  if (table_changed_) {
    if (h_.nb_snapshots > 0) BARGE_RETURN_IF_ERROR(FreeRange(h_.snapshots_offset, old_table_bytes_, "snapshot table"));
    std::vector<SnapshotInfo> infos = Infos();
    std::vector<std::vector<std::byte>> unknown;
    for (const Entry& e : entries_) unknown.push_back(e.unknown_extra);
    table_bytes = EncodeSnapshotTable(infos, unknown);
    if (table_bytes.size() > kMaxSnapshotTableBytes) {
      return Unsupported("the snapshot table would exceed qemu's 64 MiB limit");
    }
    next.nb_snapshots = static_cast<uint32_t>(entries_.size());
    next.snapshots_offset = 0;
    if (!table_bytes.empty()) {
      BARGE_ASSIGN_OR_RETURN(next.snapshots_offset,
                             rc_->Allocate(SizeToClusters(table_bytes.size(), cb), "the snapshot table"));
    }
  }
  // Nothing to do (a rename to the same name): write nothing at all.
  if (!rc_->changed() && !table_changed_ && !l1_changed && l2_in_place_.empty()) return OkStatus();
  BARGE_RETURN_IF_ERROR(rc_->Finish());
  next.refcount_table_offset = rc_->table_offset();
  next.refcount_table_clusters = rc_->table_clusters();

  // The header switch: bytes 36..72, plus the autoclear word when bits we
  // do not know must go (a program that does not understand them must clear
  // them before it modifies the file).
  std::vector<std::byte> header(cluster0_.begin(), cluster0_.begin() + std::min<size_t>(cluster0_.size(), 96));
  StoreBe32(header.data() + 36, next.l1_size);
  StoreBe64(header.data() + 40, next.l1_table_offset);
  StoreBe64(header.data() + 48, next.refcount_table_offset);
  StoreBe32(header.data() + 56, next.refcount_table_clusters);
  StoreBe32(header.data() + 60, next.nb_snapshots);
  StoreBe64(header.data() + 64, next.snapshots_offset);
  if (h_.version >= 3 && (h_.autoclear_features & ~kAutoclearKnown)) {
    StoreBe64(header.data() + 88, h_.autoclear_features & kAutoclearKnown);
  }
  size_t lo = 0;
  while (lo < header.size() && header[lo] == cluster0_[lo]) ++lo;
  size_t hi = header.size();
  while (hi > lo && header[hi - 1] == cluster0_[hi - 1]) --hi;

  const auto freed = rc_->FreedRanges();
  for (const auto& [offset, length] : freed) {
    plan.freed_clusters += length >> cb;
    plan.freed_bytes += length;
  }
  plan.new_file_bytes = std::max(file_size_, rc_->end_bytes());
  plan.write_bytes = rc_->write_bytes() + (l2_copies.size() + l2_in_place_.size()) * cs +
                     (l1_changed ? new_l1.size() * 8 : 0) + table_bytes.size() + (hi - lo);
  for (const Entry& e : entries_) {
    if (e.is_new) plan.write_bytes += e.new_l1.size() * 8;
  }
  if (options_.before_write) BARGE_RETURN_IF_ERROR(options_.before_write(plan));
  if (!sink.capabilities().can_grow && plan.new_file_bytes > sink.size_bytes()) {
    return Unsupported("'" + sink.name() + "' cannot grow to hold the new metadata clusters");
  }

  // Step 1: everything new, into clusters the current refcounts call free,
  // and the flags of tables only snapshots use. Nothing the current header
  // reaches changes, so any subset of these writes leaves the old image.
  // New clusters are mostly consecutive: writes that continue each other go
  // out as one.
  BatchedWriter out(sink);
  auto write_l1 = [&](uint64_t offset, const std::vector<uint64_t>& l1) {
    std::vector<std::byte> raw(l1.size() * 8);
    for (size_t i = 0; i < l1.size(); ++i) StoreBe64(raw.data() + 8 * i, l1[i]);
    out.Add(offset, std::move(raw));
  };
  for (auto& [offset, table] : l2_copies) out.Add(offset, std::move(table));
  for (auto& [offset, table] : l2_in_place_) out.Add(offset, table);
  for (const Entry& e : entries_) {
    if (e.is_new && !e.new_l1.empty()) write_l1(e.info.l1_table_offset, e.new_l1);
  }
  if (l1_changed && !new_l1.empty()) write_l1(next.l1_table_offset, new_l1);
  if (!table_bytes.empty()) out.Add(next.snapshots_offset, std::move(table_bytes));
  BARGE_RETURN_IF_ERROR(InStep(rc_->WriteNew(out.AsSink()), "writing the refcounts"));
  BARGE_RETURN_IF_ERROR(InStep(out.Write(), "writing the new metadata"));
  BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "writing the new metadata"));

  // Step 2: the commit point, one write inside the first sector.
  BARGE_RETURN_IF_ERROR(InStep(sink.WriteAt(lo, std::span(header).subspan(lo, hi - lo)), "switching the header"));
  BARGE_RETURN_IF_ERROR(InStep(sink.Flush(), "switching the header"));
  for (Entry& e : entries_) e.is_new = false;

  // Step 3: give the freed clusters back to the filesystem. They are free
  // in the new refcounts, so this is only a hint; a crash here changes
  // nothing, and a file system without hole punching keeps the bytes.
  if (options_.discard_freed && sink.capabilities().can_trim) {
    for (const auto& [offset, length] : rc_->FreedRanges(true)) {
      if (offset >= file_size_) break;
      Status trimmed = sink.Trim(offset, std::min(length, file_size_ - offset));
      if (trimmed.ok()) continue;
      if (trimmed.error().code() == ErrorCode::kNotSupported) break;
      return std::move(trimmed).error().Wrap(
          "qcow2 snapshot edit: committed, but discarding the freed clusters failed");
    }
  }
  return OkStatus();
}

}  // namespace

Result<SnapshotInfo> CreateSnapshot(BlockSource& file, BlockSink& sink, const SnapshotCreateSpec& spec,
                                    const SnapshotEditOptions& options) {
  Transaction t(file, options);
  BARGE_RETURN_IF_ERROR(t.Load());
  BARGE_RETURN_IF_ERROR(t.Create(spec));
  BARGE_RETURN_IF_ERROR(t.Commit(sink));
  return t.entries().back().info;
}

Result<SnapshotInfo> DeleteSnapshot(BlockSource& file, BlockSink& sink, const std::string& id_or_name,
                                    const SnapshotEditOptions& options) {
  Transaction t(file, options);
  BARGE_RETURN_IF_ERROR(t.Load());
  BARGE_ASSIGN_OR_RETURN(size_t index, t.Find(id_or_name));
  SnapshotInfo deleted = t.entries()[index].info;
  BARGE_RETURN_IF_ERROR(t.Delete(index));
  BARGE_RETURN_IF_ERROR(t.Commit(sink));
  return deleted;
}

Result<SnapshotInfo> RenameSnapshot(BlockSource& file, BlockSink& sink, const std::string& id_or_name,
                                    const std::string& new_name, bool allow_duplicate_name,
                                    const SnapshotEditOptions& options) {
  Transaction t(file, options);
  BARGE_RETURN_IF_ERROR(t.Load());
  BARGE_ASSIGN_OR_RETURN(size_t index, t.Find(id_or_name));
  BARGE_RETURN_IF_ERROR(t.Rename(index, new_name, allow_duplicate_name));
  BARGE_RETURN_IF_ERROR(t.Commit(sink));
  return t.entries()[index].info;
}

Result<SnapshotRollbackResult> RollbackSnapshot(BlockSource& file, BlockSink& sink,
                                                const std::string& id_or_name, bool discard_newer,
                                                const SnapshotEditOptions& options) {
  Transaction t(file, options);
  BARGE_RETURN_IF_ERROR(t.Load());
  BARGE_ASSIGN_OR_RETURN(size_t index, t.Find(id_or_name));
  SnapshotRollbackResult result;
  if (discard_newer) {
    for (size_t i = t.entries().size(); i-- > index + 1;) {
      result.discarded.insert(result.discarded.begin(), t.entries()[i].info);
      BARGE_RETURN_IF_ERROR(t.Delete(i));
    }
  }
  BARGE_RETURN_IF_ERROR(t.Rollback(index));
  BARGE_RETURN_IF_ERROR(t.Commit(sink));
  result.target = t.entries()[index].info;
  return result;
}

Result<uint64_t> EstimateSnapshotCreateBytes(BlockSource& file) {
  SnapshotEditOptions options;
  Transaction t(file, options);
  BARGE_RETURN_IF_ERROR(t.Load());
  return t.EstimateCreate();
}

Result<std::vector<SnapshotInfo>> ListSnapshots(BlockSource& file) {
  BARGE_ASSIGN_OR_RETURN(Header h, ReadHeader(file));
  BARGE_ASSIGN_OR_RETURN(SnapshotTable table, ReadSnapshotTable(file, h));
  return std::move(table.snapshots);
}

}  // namespace barge::formats
