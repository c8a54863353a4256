// One pass over every view's tables, L1 index by L1 index: each distinct L2
// table is read once, its clusters marked with the one view that owns them
// (or "shared"), and each view compared with the previous snapshot there.
#include "formats/qcow2_snapshot_metrics.h"

#include <algorithm>
#include <bit>
#include <map>
#include <set>

#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_snapshot.h"
#include "formats/units.h"

namespace barge::formats {
namespace {

using namespace qcow2;

constexpr uint32_t kNobody = 0xffffffffu;
constexpr uint32_t kShared = 0xfffffffeu;

Error Bad(const std::string& what, uint64_t offset) {
  return Error::Corruption("qcow2 snapshot metrics: " + what).set_offset(offset);
}

struct View {
  std::vector<uint64_t> l1;
  uint64_t l1_offset = 0;
  uint64_t vol_size = 0;
  SnapshotUsage usage;
  uint64_t data_logical = 0;  // for the ratio
  uint64_t data_stored = 0;
};

// What one L2 entry holds, for comparing views and adding up bytes.
struct Mapped {
  uint64_t key = 0;           // what identifies the stored data (0: none)
  uint64_t stored = 0;        // bytes of the file it takes
  uint64_t data_stored = 0;   // of those, data (not preallocated zeros)
  uint64_t logical = 0;       // guest bytes it maps to data (before clipping)
  uint64_t host = 0;          // first host byte (compressed: payload start)
  bool compressed = false;
};

class Pass {
 public:
  Pass(BlockSource& file, const Header& h, std::vector<View>& views)
      : file_(file), h_(h), views_(views), file_size_(file.size_bytes()) {}

  Status Run(uint64_t file_clusters) {
    owner_.assign(file_clusters, kNobody);
    for (uint32_t v = 0; v < views_.size(); ++v) {
      const View& view = views_[v];
      const uint64_t bytes = view.l1.size() * 8;
      if (bytes == 0) continue;
      const uint64_t clusters = SizeToClusters(bytes, h_.cluster_bits);
      views_[v].usage.referenced += clusters << h_.cluster_bits;
      for (uint64_t c = 0; c < clusters; ++c) Mark((view.l1_offset >> h_.cluster_bits) + c, v);
    }
    size_t max_l1 = 0;
    for (const View& view : views_) max_l1 = std::max(max_l1, view.l1.size());
    // Ask for every L2 table at once: a cold pass then waits for the disk
    // once, not once per table.
    std::set<uint64_t> tables;
    for (const View& view : views_) {
      for (uint64_t e : view.l1) {
        if (e & kL1OffsetMask) tables.insert(e & kL1OffsetMask);
      }
    }
    for (uint64_t l2 : tables) file_.WillNeed(l2, h_.cluster_size());
    for (size_t i = 0; i < max_l1; ++i) BARGE_RETURN_IF_ERROR(Index(i));
    std::vector<uint64_t> owned(views_.size(), 0);
    for (uint32_t o : owner_) {
      if (o < views_.size()) ++owned[o];
    }
    for (size_t v = 0; v < views_.size(); ++v) {
      View& view = views_[v];
      view.usage.used = owned[v] << h_.cluster_bits;
      view.usage.vol_size = view.vol_size;
      view.usage.compress_ratio =
          view.data_stored == 0 ? 1.0 : double(view.data_logical) / double(view.data_stored);
    }
    return OkStatus();
  }

 private:
  void Mark(uint64_t cluster, uint32_t who) {
    if (cluster >= owner_.size()) return;
    uint32_t& o = owner_[cluster];
    if (o == kNobody) {
      o = who;
    } else if (o != who) {
      o = kShared;
    }
  }

  Mapped Decode(const std::byte* p) const {
    const uint64_t cs = h_.cluster_size();
    const uint64_t entry = LoadBe64(p);
    Mapped m;
    const ClusterType type = GetClusterType(entry, h_.extended_l2(), h_.has_data_file());
    if (type == ClusterType::kCompressed) {
      const CompressedPayload payload = DecodeCompressed(entry, h_.cluster_bits);
      m.key = entry & ~kOflagCopied;
      m.host = payload.host;
      m.compressed = true;
      m.stored = m.data_stored = payload.bytes;
      m.logical = cs;
      return m;
    }
    const uint64_t host = entry & kL2OffsetMask;
    if (!HasHostCluster(type)) return m;
    m.key = host | 1;  // non-zero even for host offset 0 in a data file
    m.host = host;
    m.stored = cs;
    if (h_.extended_l2()) {
      const uint32_t alloc = static_cast<uint32_t>(LoadBe64(p + 8));
      m.logical = uint64_t(std::popcount(alloc)) * (cs / 32);
      m.data_stored = alloc ? cs : 0;
    } else if (type == ClusterType::kNormal) {
      m.logical = cs;
      m.data_stored = cs;
    }
    return m;
  }

  // Every view's L2 table at L1 index `i`.
  Status Index(size_t i) {
    const uint32_t cb = h_.cluster_bits;
    const uint64_t cs = h_.cluster_size();
    const uint32_t entry_bytes = h_.l2_entry_bytes();
    const uint64_t n = h_.l2_entries();
    std::vector<uint64_t> offs(views_.size(), 0);
    std::map<uint64_t, std::set<uint32_t>> users;
    for (uint32_t v = 0; v < views_.size(); ++v) {
      if (i < views_[v].l1.size()) offs[v] = views_[v].l1[i] & kL1OffsetMask;
      if (offs[v] != 0) users[offs[v]].insert(v);
    }
    if (users.empty()) return OkStatus();
    std::map<uint64_t, std::vector<std::byte>> tables;
    for (const auto& [l2, who_set] : users) {
      if (!IsClusterAligned(l2, cb) || l2 > file_size_ || cs > file_size_ - l2) {
        return Bad("L2 table " + Hex(l2) + " is misaligned or lies beyond the end of the file", l2);
      }
      std::vector<std::byte>& table = tables[l2];
      table.resize(cs);
      BARGE_RETURN_IF_ERROR(file_.ReadAt(l2, table));
      const uint32_t who = who_set.size() == 1 ? *who_set.begin() : kShared;
      Mark(l2 >> cb, who);
      for (uint64_t j = 0; j < n; ++j) {
        const Mapped m = Decode(table.data() + j * entry_bytes);
        if (m.key == 0 || h_.has_data_file()) continue;
        if (m.compressed) {
          for (uint64_t c = m.host >> cb; c <= (m.host + m.stored - 1) >> cb; ++c) Mark(c, who);
        } else {
          Mark(m.host >> cb, who);
        }
      }
    }
    for (uint32_t v = 0; v < views_.size(); ++v) {
      if (offs[v] == 0) continue;
      View& view = views_[v];
      const std::vector<std::byte>& table = tables[offs[v]];
      // The previous snapshot's table here, unless it is the same table.
      const uint32_t prev = v == 0 ? kNobody : v - 1;
      const std::vector<std::byte>* before = nullptr;
      bool same = false;
      if (prev != kNobody && offs[prev] != 0) {
        same = offs[prev] == offs[v];
        before = &tables[offs[prev]];
      }
      view.usage.referenced += cs;
      for (uint64_t j = 0; j < n; ++j) {
        const Mapped m = Decode(table.data() + j * entry_bytes);
        if (m.key == 0) continue;
        view.usage.referenced += m.stored;
        const uint64_t guest = (uint64_t{i} * n + j) << cb;
        if (guest < view.vol_size && m.data_stored) {
          const uint64_t logical = std::min(m.logical, view.vol_size - guest);
          view.usage.logical_referenced += logical;
          view.data_logical += logical;
          view.data_stored += m.data_stored;
        }
        if (same || m.data_stored == 0) continue;
        if (before && Decode(before->data() + j * entry_bytes).key == m.key) continue;
        view.usage.written += m.data_stored;
      }
    }
    return OkStatus();
  }

  BlockSource& file_;
  const Header& h_;
  std::vector<View>& views_;
  const uint64_t file_size_;
  std::vector<uint32_t> owner_;  // by host cluster: a view index, kNobody or kShared
};

}  // namespace

Result<SnapshotMetricsReport> ComputeSnapshotMetrics(BlockSource& file, const SnapshotMetricsOptions& options) {
  std::byte magic[4] = {};
  if (file.size_bytes() >= kV2HeaderLength) BARGE_RETURN_IF_ERROR(file.ReadAt(0, magic));
  if (file.size_bytes() < kV2HeaderLength || LoadBe32(magic) != kMagic) {
    return Error::NotSupported("'" + file.name() + "' is not a qcow2 image (raw images have no snapshots)");
  }
  BARGE_ASSIGN_OR_RETURN(Header h, ReadHeader(file));
  BARGE_ASSIGN_OR_RETURN(SnapshotTable table, ReadSnapshotTable(file, h));
  const uint64_t file_clusters = SizeToClusters(file.size_bytes(), h.cluster_bits);
  if (file_clusters > options.max_file_clusters) {
    return Error::NotSupported("file has " + std::to_string(file_clusters) +
                               " clusters, more than the metrics' limit")
        .set_path(file.name());
  }
  auto read_l1 = [&](uint64_t offset, uint32_t size) -> Result<std::vector<uint64_t>> {
    std::vector<uint64_t> l1(size);
    if (size == 0) return l1;
    // The header and table parsers checked the table lies inside the file
    // and is at most 32 MiB.
    std::vector<std::byte> raw(uint64_t{size} * 8);
    BARGE_RETURN_IF_ERROR(file.ReadAt(offset, raw));
    for (uint32_t i = 0; i < size; ++i) l1[i] = LoadBe64(raw.data() + 8 * uint64_t{i});
    return l1;
  };
  std::vector<View> views(table.snapshots.size() + 1);
  for (size_t v = 0; v < table.snapshots.size(); ++v) {
    const SnapshotInfo& s = table.snapshots[v];
    BARGE_ASSIGN_OR_RETURN(views[v].l1, read_l1(s.l1_table_offset, s.l1_size));
    views[v].l1_offset = s.l1_table_offset;
    views[v].vol_size = s.virtual_size;
  }
  View& active = views.back();
  BARGE_ASSIGN_OR_RETURN(active.l1, read_l1(h.l1_table_offset, h.l1_size));
  active.l1_offset = h.l1_table_offset;
  active.vol_size = h.size;

  Pass pass(file, h, views);
  BARGE_RETURN_IF_ERROR(pass.Run(file_clusters));
  SnapshotMetricsReport report;
  report.cluster_size = static_cast<uint32_t>(h.cluster_size());
  for (size_t v = 0; v < table.snapshots.size(); ++v) {
    report.snapshots.push_back({std::move(table.snapshots[v]), views[v].usage});
  }
  report.active = active.usage;
  return report;
}

}  // namespace barge::formats
