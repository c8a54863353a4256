// qcow2 guest view: L1/L2 lookup (standard and extended L2), reads of data,
// compressed, zero and unallocated clusters, and Map/Extents over the chain.
#include "formats/qcow2_image.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "formats/qcow2_compress.h"
#include "formats/units.h"

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
    bool with_host = run.kind == RunKind::kData || run.allocated;
    bool host_ok = (run.kind == RunKind::kData || last.allocated == run.allocated) &&
                   (!with_host || last.host_offset + last.length == run.host_offset);
    if (contiguous && run.kind != RunKind::kCompressed && host_ok) {
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
      l2_cache_(*file_, header_.cluster_bits, (16u << 20) >> header_.cluster_bits) {
  if (file_->capabilities().blocking_read_streams > 1) {
    // Each read a round trip (an object in a bucket): reading up to 1 MiB
    // more costs less than a second request.
    max_gap_ = 1 << 20;
  }
}

SourceCapabilities Qcow2Image::capabilities() const {
  SourceCapabilities caps;
  caps.has_extents = true;
  caps.preferred_request_bytes = std::max<uint32_t>(256 * 1024, header_.cluster_size());
  // A file read over the network (an object in a bucket, an https image)
  // answers each read after a round trip: the copy keeps as many reads in
  // flight as the file has streams (pipeline/copy.cc, ArenaThreads). Its
  // requests stay at this size: larger chunks (4 MiB, coalesced into GETs
  // of ~2 MiB) restored slower from radosgw (docs/benchmarks.md).
  caps.blocking_read_streams = file_->capabilities().blocking_read_streams;
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
    // Reserved bits mean the entry is not what we think it is (qemu-img
    // check calls it corrupt): refuse it rather than follow the offset.
    if (l1_entry & kL1ReservedMask) return Bad("L1 entry has reserved bits set", l1_entry_pos);
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
      const ClusterType type = GetClusterType(entry, ext, data_file);
      if (type == ClusterType::kCompressed) {
        if (data_file) return Bad("L2 entry: compressed cluster in an image with a data file", entry_pos);
        if (ext && bitmap != 0) return Bad("L2 entry: compressed cluster with a subcluster bitmap", entry_pos);
        const uint64_t host = DecodeCompressed(entry, cb).host;
        if ((host >> 56) != 0 || host >= file_size) {
          return Bad("L2 entry: compressed data offset lies beyond the end of the file", entry_pos);
        }
        Append(out, {pos, cluster_end - pos, RunKind::kCompressed, 0, entry});
        pos = cluster_end;
        continue;
      }
      if (entry & kL2ReservedMask) return Bad("L2 entry has reserved bits set", entry_pos);
      const uint64_t host = entry & kL2OffsetMask;
      // Normal and ZERO_ALLOC clusters keep a host cluster (offset 0 with
      // COPIED in a data-file image is the data file's first cluster).
      const bool mapped = HasHostCluster(type);
      if (mapped) {
        if (!IsClusterAligned(host, cb)) {
          return Bad("L2 entry: data cluster offset is not cluster aligned", entry_pos);
        }
        if (!data_file && host >= file_size) {
          return Bad("L2 entry: data cluster lies beyond the end of the file", entry_pos);
        }
      }
      if (!ext) {
        const RunKind kind = type == ClusterType::kNormal        ? RunKind::kData
                             : type == ClusterType::kUnallocated ? RunKind::kUnallocated
                                                                 : RunKind::kZero;
        // ZERO_ALLOC keeps its host cluster; ZERO_PLAIN has none.
        Append(out, {pos, cluster_end - pos, kind, mapped ? host + (pos - cluster_start) : 0, 0,
                     mapped && kind != RunKind::kData});
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
        Append(out, {pos, sub_end - pos, kind, mapped ? host + (pos - cluster_start) : 0, 0,
                     mapped && kind != RunKind::kData});
        pos = sub_end;
      }
    }
  }
  return OkStatus();
}

Status Qcow2Image::ReadAt(uint64_t offset, std::span<std::byte> out) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  const Piece whole{offset, out};
  return ReadPieces(std::span(&whole, 1));
}

Status Qcow2Image::ReadMany(std::span<ReadRequest> requests) {
  std::vector<Piece> pieces;
  pieces.reserve(requests.size());
  for (ReadRequest& r : requests) {
    r.status = CheckRange(r.offset, r.buffer.size());
    if (!r.status.ok()) return r.status;
    pieces.push_back({r.offset, r.buffer});
  }
  Status s = ReadPieces(pieces);
  if (!s.ok()) {
    for (ReadRequest& r : requests) r.status = s;
  }
  return s;
}

// A stored run of this layer to fetch from its file: a compressed payload or
// uncompressed data.
struct Qcow2Image::Fetch {
  uint64_t host = 0;        // first byte in the file
  uint64_t end = 0;         // past the last byte, clipped to the file's end
  std::span<std::byte> dst; // the guest bytes it fills
  bool compressed = false;
  uint64_t in_cluster = 0;  // compressed: where dst starts in the cluster
  uint64_t guest = 0;       // compressed: the guest offset of the cluster
};

Status Qcow2Image::ReadPieces(std::span<const Piece> pieces) {
  const uint32_t cb = header_.cluster_bits;
  const uint64_t file_size = file_->size_bytes();
  const uint64_t backing_size = backing_ ? backing_->size_bytes() : 0;
  std::vector<Run> runs;
  std::vector<Fetch> fetches;
  std::vector<Piece> below;
  for (const Piece& piece : pieces) {
    runs.clear();
    BARGE_RETURN_IF_ERROR(MapLayer(piece.offset, piece.out.size(), runs));
    for (const Run& run : runs) {
      std::span<std::byte> dst = piece.out.subspan(run.guest_offset - piece.offset, run.length);
      switch (run.kind) {
        case RunKind::kZero:
          std::memset(dst.data(), 0, dst.size());
          break;
        case RunKind::kUnallocated: {
          // Past the end of a shorter backing file the disk reads as zeros.
          const uint64_t in_backing =
              run.guest_offset < backing_size ? std::min(run.length, backing_size - run.guest_offset) : 0;
          if (in_backing > 0) below.push_back({run.guest_offset, dst.first(in_backing)});
          std::memset(dst.data() + in_backing, 0, dst.size() - in_backing);
          break;
        }
        case RunKind::kCompressed: {
          // MapLayer checked that the payload starts inside the file; it
          // may end past it (inside a final, partial sector).
          const CompressedPayload p = DecodeCompressed(run.l2_entry, cb);
          const uint64_t in_cluster = OffsetIntoCluster(run.guest_offset, cb);
          fetches.push_back({p.host, p.host + std::min(p.bytes, file_size - p.host), dst, true, in_cluster,
                             run.guest_offset - in_cluster});
          break;
        }
        case RunKind::kData:
          if (header_.has_data_file()) {
            BARGE_RETURN_IF_ERROR(ReadDataFile(run, dst));
          } else {
            // Bytes past the end of the file read as zeros, as qemu's file
            // driver does.
            const uint64_t host = std::min(run.host_offset, file_size);
            fetches.push_back({host, host + std::min<uint64_t>(dst.size(), file_size - host), dst});
          }
          break;
      }
    }
  }
  BARGE_RETURN_IF_ERROR(FetchRuns(fetches));
  if (below.empty()) return OkStatus();
  // A qcow2 backing layer takes every range at once, so its reads batch too.
  if (auto* layer = dynamic_cast<Qcow2Image*>(backing_.get())) return layer->ReadPieces(below);
  for (const Piece& p : below) BARGE_RETURN_IF_ERROR(backing_->ReadAt(p.offset, p.out));
  return OkStatus();
}

Status Qcow2Image::FetchRuns(std::vector<Fetch>& fetches) {
  const uint64_t cs = header_.cluster_size();
  std::sort(fetches.begin(), fetches.end(), [](const Fetch& a, const Fetch& b) { return a.host < b.host; });
  // Runs close together in the file are fetched with one read: a writer
  // appends a chunk's payloads one after another, so a chunk of compressed
  // clusters costs one read instead of one per cluster. Payloads lie in
  // guest order, so a pass in guest order reads the file front to back (with
  // gaps) and read_ahead_ hints what comes next. The buffers are
  // reused per thread; nothing below calls into another layer while they
  // are in use.
  thread_local std::vector<std::byte> batch;
  thread_local std::vector<std::byte> cluster;
  for (size_t i = 0; i < fetches.size();) {
    const uint64_t first = fetches[i].host;
    uint64_t last = fetches[i].end;
    size_t j = i + 1;
    while (j < fetches.size() && fetches[j].host <= last + max_gap_ &&
           std::max(last, fetches[j].end) - first <= max_batch_) {
      last = std::max(last, fetches[j].end);
      ++j;
    }
    const Fetch& lone = fetches[i];
    if (j == i + 1 && !lone.compressed) {
      // Uncompressed data on its own goes straight to its destination.
      read_ahead_.Before(*file_, lone.end);
      BARGE_RETURN_IF_ERROR(file_->ReadAt(lone.host, lone.dst.first(lone.end - lone.host)));
      std::memset(lone.dst.data() + (lone.end - lone.host), 0, lone.dst.size() - (lone.end - lone.host));
      ++i;
      continue;
    }
    if (batch.size() < last - first) batch.resize(last - first);
    read_ahead_.Before(*file_, last);
    BARGE_RETURN_IF_ERROR(file_->ReadAt(first, std::span(batch).first(last - first)));
    for (; i < j; ++i) {
      const Fetch& f = fetches[i];
      std::span<const std::byte> bytes = std::span(batch).subspan(f.host - first, f.end - f.host);
      if (!f.compressed) {
        std::memcpy(f.dst.data(), bytes.data(), bytes.size());
        std::memset(f.dst.data() + bytes.size(), 0, f.dst.size() - bytes.size());
        continue;
      }
      // A whole cluster decodes in place; part of one goes through a copy.
      const bool whole = f.in_cluster == 0 && f.dst.size() == cs;
      if (!whole && cluster.size() < cs) cluster.resize(cs);
      std::span<std::byte> target = whole ? f.dst : std::span(cluster).first(cs);
      Status st = DecompressCluster(CompressionOf(header_), bytes, target);
      if (!st.ok()) {
        // Named like a damaged uncompressed cluster: the guest cluster and
        // this layer's file; the payload's host offset is in the message.
        Error e = std::move(st).error();
        return Error(e.code(), "compressed cluster " + std::to_string(f.guest >> header_.cluster_bits) +
                                 " at guest offset " + Hex(f.guest) + " (payload at host offset " +
                                 Hex(f.host) + ") does not decompress: " + e.message())
            .set_path(info_.path)
            .set_range(f.guest, cs);
      }
      if (!whole) std::memcpy(f.dst.data(), cluster.data() + f.in_cluster, f.dst.size());
    }
  }
  return OkStatus();
}

Status Qcow2Image::ReadDataFile(const Run& run, std::span<std::byte> out) {
  if (!data_file_) {
    return Error::NotSupported("the external data file was not opened").set_path(info_.path);
  }
  // Bytes past the end of the file read as zeros, as qemu's file driver does.
  const uint64_t src_size = data_file_->size_bytes();
  const uint64_t avail =
      run.host_offset >= src_size ? 0 : std::min<uint64_t>(out.size(), src_size - run.host_offset);
  if (avail > 0) BARGE_RETURN_IF_ERROR(data_file_->ReadAt(run.host_offset, out.first(avail)));
  std::memset(out.data() + avail, 0, out.size() - avail);
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
        if (run.allocated) m.host_offset = run.host_offset;
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
        // An unallocated subcluster of an allocated cluster, not covered by
        // a backing file: qemu-img map gives its host offset.
        if (run.allocated) m.host_offset = run.host_offset + in_backing;
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
