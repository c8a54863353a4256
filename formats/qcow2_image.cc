// qcow2 guest view: L1/L2 lookup (standard and extended L2), reads of data,
// compressed, zero and unallocated clusters, and Map/Extents over the chain.
#include "formats/qcow2_image.h"

#include <algorithm>
#include <cstring>

#include "formats/qcow2_compress.h"

namespace barge::formats::qcow2 {

L2Cache::L2Cache(BlockSource& file, uint32_t cluster_bits, size_t capacity_tables)
    : file_(file), cluster_bits_(cluster_bits), capacity_(std::max<size_t>(capacity_tables, 2)) {}

Result<std::shared_ptr<const std::vector<std::byte>>> L2Cache::Get(uint64_t l2_offset) {
  {
    std::lock_guard lock(mu_);
    auto it = tables_.find(l2_offset);
    if (it != tables_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.second);
      return it->second.first;
    }
  }
  // Load without holding the lock so other threads keep reading.
  auto table = std::make_shared<std::vector<std::byte>>(ClusterSize(cluster_bits_));
  BARGE_RETURN_IF_ERROR(file_.ReadAt(l2_offset, *table));
  std::lock_guard lock(mu_);
  auto it = tables_.find(l2_offset);
  if (it != tables_.end()) return it->second.first;
  lru_.push_front(l2_offset);
  tables_.emplace(l2_offset, std::make_pair(Table(table), lru_.begin()));
  while (tables_.size() > capacity_) {
    tables_.erase(lru_.back());
    lru_.pop_back();
  }
  return Table(table);
}

namespace {

// Adds a run, merging it into the previous one when they continue each other.
void Append(std::vector<Run>& out, const Run& run) {
  if (!out.empty()) {
    Run& last = out.back();
    bool contiguous = last.guest_offset + last.length == run.guest_offset && last.kind == run.kind;
    if (contiguous && (run.kind == RunKind::kZero || run.kind == RunKind::kUnallocated ||
                       (run.kind == RunKind::kData &&
                        last.host_offset + last.length == run.host_offset))) {
      last.length += run.length;
      return;
    }
  }
  out.push_back(run);
}

Compression CompressionOf(const Header& h) {
  return h.compression_type == kCompressionZstd ? Compression::kZstd : Compression::kDeflate;
}

}  // namespace

Qcow2Image::Qcow2Image(std::unique_ptr<BlockSource> file, Header header, std::vector<uint64_t> l1,
                       ImageInfo info)
    : file_(std::move(file)),
      header_(std::move(header)),
      l1_(std::move(l1)),
      info_(std::move(info)),
      l2_cache_(*file_, header_.cluster_bits, (16u << 20) >> header_.cluster_bits) {}

SourceCapabilities Qcow2Image::capabilities() const {
  SourceCapabilities caps;
  caps.has_extents = true;
  caps.preferred_request_bytes = std::max<uint32_t>(256 * 1024, header_.cluster_size());
  return caps;
}

Error Qcow2Image::Bad(std::string what, uint64_t offset) const {
  return Error::Corruption(std::move(what)).set_path(info_.path).set_offset(offset);
}

Status Qcow2Image::MapLayer(uint64_t offset, uint64_t length, std::vector<Run>& out) {
  const uint32_t cb = header_.cluster_bits;
  const uint64_t cs = header_.cluster_size();
  const uint64_t l2_entries = header_.l2_entries();
  const uint32_t entry_bytes = header_.l2_entry_bytes();
  const bool ext = header_.extended_l2();
  const bool data_file = header_.has_data_file();
  const uint64_t file_size = file_->size_bytes();
  const uint64_t end = offset + length;
  uint64_t pos = offset;
  while (pos < end) {
    const uint64_t l1_index = (pos >> cb) / l2_entries;
    const uint64_t l1_span_end = std::min(end, ((l1_index + 1) * l2_entries) << cb);
    const uint64_t l1_entry = l1_index < l1_.size() ? l1_[l1_index] : 0;
    const uint64_t l2_offset = l1_entry & kL1OffsetMask;
    const uint64_t l1_entry_pos = header_.l1_table_offset + 8 * l1_index;
    if (l2_offset == 0) {
      Append(out, {pos, l1_span_end - pos, RunKind::kUnallocated});
      pos = l1_span_end;
      continue;
    }
    if (!IsClusterAligned(l2_offset, cb)) return Bad("L1 entry: L2 table offset is not cluster aligned", l1_entry_pos);
    if (l2_offset > file_size || cs > file_size - l2_offset) {
      return Bad("L1 entry: L2 table lies beyond the end of the file", l1_entry_pos);
    }
    BARGE_ASSIGN_OR_RETURN(auto table, l2_cache_.Get(l2_offset));
    while (pos < l1_span_end) {
      const uint64_t cluster_start = pos & ~(cs - 1);
      const uint64_t cluster_end = std::min(cluster_start + cs, l1_span_end);
      const uint64_t index = (pos >> cb) % l2_entries;
      const uint64_t entry_pos = l2_offset + index * entry_bytes;
      const uint64_t entry = LoadBe64(table->data() + index * entry_bytes);
      const uint64_t bitmap = ext ? LoadBe64(table->data() + index * entry_bytes + 8) : 0;
      if (entry & kOflagCompressed) {
        if (data_file) return Bad("L2 entry: compressed cluster in an image with a data file", entry_pos);
        if (ext && bitmap != 0) return Bad("L2 entry: compressed cluster with a subcluster bitmap", entry_pos);
        const uint32_t x = CompressedOffsetBits(cb);
        const uint64_t host = entry & ((uint64_t{1} << x) - 1);
        if ((host >> 56) != 0 || host >= file_size) {
          return Bad("L2 entry: compressed data offset lies beyond the end of the file", entry_pos);
        }
        Append(out, {pos, cluster_end - pos, RunKind::kCompressed, 0, entry});
        pos = cluster_end;
        continue;
      }
      const uint64_t host = entry & kL2OffsetMask;
      const bool mapped = host != 0 || (data_file && (entry & kOflagCopied));
      if (mapped) {
        if (!IsClusterAligned(host, cb)) {
          return Bad("L2 entry: data cluster offset is not cluster aligned", entry_pos);
        }
        if (!data_file && host >= file_size) {
          return Bad("L2 entry: data cluster lies beyond the end of the file", entry_pos);
        }
      }
      if (!ext) {
        RunKind kind = (entry & kOflagZero) ? RunKind::kZero
                       : mapped             ? RunKind::kData
                                            : RunKind::kUnallocated;
        Append(out, {pos, cluster_end - pos, kind, kind == RunKind::kData ? host + (pos - cluster_start) : 0});
        pos = cluster_end;
        continue;
      }
      const uint32_t alloc = static_cast<uint32_t>(bitmap);
      const uint32_t zero = static_cast<uint32_t>(bitmap >> 32);
      if (alloc & zero) return Bad("L2 entry: subcluster both allocated and zero", entry_pos + 8);
      if (alloc != 0 && !mapped) return Bad("L2 entry: allocated subclusters without a host cluster", entry_pos + 8);
      const uint64_t sub = cs / 32;
      while (pos < cluster_end) {
        const uint32_t sc = static_cast<uint32_t>((pos - cluster_start) / sub);
        const uint64_t sub_end = std::min(cluster_start + (sc + 1) * sub, cluster_end);
        RunKind kind = (alloc >> sc) & 1  ? RunKind::kData
                       : (zero >> sc) & 1 ? RunKind::kZero
                                          : RunKind::kUnallocated;
        Append(out, {pos, sub_end - pos, kind, kind == RunKind::kData ? host + (pos - cluster_start) : 0});
        pos = sub_end;
      }
    }
  }
  return OkStatus();
}

Status Qcow2Image::ReadAt(uint64_t offset, std::span<std::byte> out) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  std::vector<Run> runs;
  BARGE_RETURN_IF_ERROR(MapLayer(offset, out.size(), runs));
  for (const Run& run : runs) {
    BARGE_RETURN_IF_ERROR(ReadRun(run, out.subspan(run.guest_offset - offset, run.length)));
  }
  return OkStatus();
}

Status Qcow2Image::ReadRun(const Run& run, std::span<std::byte> out) {
  switch (run.kind) {
    case RunKind::kZero:
      std::memset(out.data(), 0, out.size());
      return OkStatus();
    case RunKind::kUnallocated:
      return ReadBacking(run.guest_offset, out);
    case RunKind::kCompressed:
      return ReadCompressed(run, out);
    case RunKind::kData:
      break;
  }
  BlockSource* src = file_.get();
  if (header_.has_data_file()) {
    if (!data_file_) {
      return Error::NotSupported("the external data file was not opened").set_path(info_.path);
    }
    src = data_file_.get();
  }
  // Bytes past the end of the file read as zeros, as qemu's file driver does.
  const uint64_t src_size = src->size_bytes();
  const uint64_t avail = run.host_offset >= src_size ? 0 : std::min<uint64_t>(out.size(), src_size - run.host_offset);
  if (avail > 0) BARGE_RETURN_IF_ERROR(src->ReadAt(run.host_offset, out.first(avail)));
  std::memset(out.data() + avail, 0, out.size() - avail);
  return OkStatus();
}

Status Qcow2Image::ReadCompressed(const Run& run, std::span<std::byte> out) {
  const uint32_t cb = header_.cluster_bits;
  const uint32_t x = CompressedOffsetBits(cb);
  const uint64_t host = run.l2_entry & ((uint64_t{1} << x) - 1);
  const uint64_t sectors = ((run.l2_entry >> x) & ((uint64_t{1} << (cb - 8)) - 1)) + 1;
  uint64_t payload_bytes = sectors * kSectorBytes - (host & (kSectorBytes - 1));
  // The last payload may end inside a final, partial sector of the file.
  payload_bytes = std::min(payload_bytes, file_->size_bytes() - host);
  std::vector<std::byte> payload(payload_bytes);
  BARGE_RETURN_IF_ERROR(file_->ReadAt(host, payload));
  std::vector<std::byte> cluster(header_.cluster_size());
  Status st = DecompressCluster(CompressionOf(header_), payload, cluster);
  if (!st.ok()) {
    return Error(std::move(st).error()).set_path(info_.path).set_offset(host);
  }
  const uint64_t in_cluster = OffsetIntoCluster(run.guest_offset, cb);
  std::memcpy(out.data(), cluster.data() + in_cluster, out.size());
  return OkStatus();
}

Status Qcow2Image::ReadBacking(uint64_t offset, std::span<std::byte> out) {
  uint64_t from_backing = 0;
  if (backing_ && offset < backing_->size_bytes()) {
    from_backing = std::min<uint64_t>(out.size(), backing_->size_bytes() - offset);
    BARGE_RETURN_IF_ERROR(backing_->ReadAt(offset, out.first(from_backing)));
  }
  std::memset(out.data() + from_backing, 0, out.size() - from_backing);
  return OkStatus();
}

Result<std::vector<MappedExtent>> Qcow2Image::Map(uint64_t offset, uint64_t length) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
  std::vector<Run> runs;
  BARGE_RETURN_IF_ERROR(MapLayer(offset, length, runs));
  std::vector<MappedExtent> out;
  auto add = [&out](MappedExtent m) {
    if (m.length == 0) return;
    if (!out.empty()) {
      MappedExtent& last = out.back();
      bool same = last.offset + last.length == m.offset && last.kind == m.kind &&
                  last.depth == m.depth && last.compressed == m.compressed &&
                  last.host_offset.has_value() == m.host_offset.has_value() &&
                  (!m.host_offset || *last.host_offset + last.length == *m.host_offset);
      if (same) {
        last.length += m.length;
        return;
      }
    }
    out.push_back(m);
  };
  for (const Run& run : runs) {
    MappedExtent m;
    m.offset = run.guest_offset;
    m.length = run.length;
    m.depth = 0;
    switch (run.kind) {
      case RunKind::kData:
        m.kind = ExtentKind::kData;
        m.host_offset = run.host_offset;
        add(m);
        break;
      case RunKind::kCompressed:
        m.kind = ExtentKind::kData;
        m.compressed = true;
        add(m);
        break;
      case RunKind::kZero:
        m.kind = ExtentKind::kZero;
        add(m);
        break;
      case RunKind::kUnallocated: {
        // Depth follows qemu-img map: the deepest layer that covers the
        // offset, so bytes past the end of a shorter backing file are a hole
        // of this layer.
        uint64_t in_backing = 0;
        if (backing_ && run.guest_offset < backing_->size_bytes()) {
          in_backing = std::min(run.length, backing_->size_bytes() - run.guest_offset);
          BARGE_ASSIGN_OR_RETURN(auto below, backing_->Map(run.guest_offset, in_backing));
          for (MappedExtent b : below) {
            b.depth = b.depth < 0 ? 1 : b.depth + 1;
            add(b);
          }
        }
        m.offset = run.guest_offset + in_backing;
        m.length = run.length - in_backing;
        m.kind = ExtentKind::kHole;
        m.depth = 0;
        add(m);
        break;
      }
    }
  }
  return out;
}

Result<ExtentList> Qcow2Image::Extents(uint64_t offset, uint64_t length) {
  BARGE_ASSIGN_OR_RETURN(auto mapped, Map(offset, length));
  ExtentList out;
  out.reserve(mapped.size());
  for (const MappedExtent& m : mapped) out.push_back({m.offset, m.length, m.kind});
  return MergeAdjacent(std::move(out));
}

const Qcow2Image* AsQcow2(const Image& image) { return dynamic_cast<const Qcow2Image*>(&image); }

}  // namespace barge::formats::qcow2
