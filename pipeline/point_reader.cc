// Verified reads of a point for serving it (barge export).
#include "pipeline/point_reader.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "formats/digest.h"
#include "formats/qcow2_check.h"
#include "formats/units.h"

namespace barge::pipeline {

Status CheckLayerStructure(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, env.OpenSource(path));
  auto report = formats::qcow2::CheckQcow2(*file);
  if (!report.ok()) return Error(report.error()).set_path(path);
  if (!report->clean()) {
    std::string first = report->messages.empty() ? "" : ": " + report->messages.front();
    return Error::Corruption("structure check failed: " + std::to_string(report->corruptions) +
                             " errors, " + std::to_string(report->leaks) + " leaked clusters" + first)
        .set_path(path);
  }
  return OkStatus();
}

Result<std::unique_ptr<PointReader>> PointReader::Open(Env& env, const std::string& dir, const std::string& at,
                                                       bool check_structure) {
  std::unique_ptr<PointReader> r(new PointReader());
  BARGE_ASSIGN_OR_RETURN(r->lock_, ExportLock::Take(env, dir, &r->chain_));
  BARGE_ASSIGN_OR_RETURN(size_t index, r->chain_.Resolve(at));
  BARGE_ASSIGN_OR_RETURN(r->point_, OpenPoint(env, r->chain_, index));
  if (check_structure) {
    BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, r->chain_.LayersOf(index));
    for (size_t l : layers) {
      BARGE_RETURN_IF_ERROR(CheckLayerStructure(env, r->chain_.PathOf(r->chain_.points[l].manifest.image)));
    }
    for (const std::string& base_image : r->point_.base_images) {
      BARGE_RETURN_IF_ERROR(CheckLayerStructure(env, base_image));
    }
  }
  const formats::BackupManifest& m = r->manifest();
  if (m.cluster_size == 0 || m.cluster_size != r->point_.digests.cluster_bytes) {
    return Error::Corruption("the manifest's cluster size does not match its digest table")
        .set_path(r->point_.point->manifest_path);
  }
  r->size_bytes_ = m.virtual_size;
  r->cluster_bytes_ = m.cluster_size;
  r->zero_digest_ = formats::ZeroClusterDigest(m.cluster_size);
  return r;
}

PointReader::~PointReader() = default;

std::string PointReader::LayerHolding(uint64_t offset) const {
  auto map = point_.image->Map(offset, 1);
  if (!map.ok() || map->empty() || map->front().depth < 0) return "";
  const formats::Image* layer = point_.image.get();
  for (int depth = map->front().depth; depth > 0 && layer != nullptr; --depth) layer = layer->backing();
  return layer != nullptr ? layer->info().path : "";
}

Status PointReader::Read(uint64_t offset, std::span<std::byte> out) {
  if (offset > size_bytes_ || out.size() > size_bytes_ - offset) {
    return Error::InvalidArgument("read past the end of the disk").set_range(offset, out.size());
  }
  if (out.empty()) return OkStatus();
  const uint64_t cb = cluster_bytes_;
  const uint64_t first = offset / cb;
  const uint64_t end = offset + out.size();
  const uint64_t begin_bytes = first * cb;
  const uint64_t end_bytes = std::min(size_bytes_, (end + cb - 1) / cb * cb);
  // Whole clusters read straight into `out` when the request is aligned to
  // them; otherwise through a scratch buffer, so that a cluster's bytes
  // reach the caller only once its digest matched.
  const bool direct = begin_bytes == offset && end_bytes == end;
  thread_local std::vector<std::byte> scratch;
  std::span<std::byte> whole;
  if (direct) {
    whole = out;
  } else {
    scratch.resize(end_bytes - begin_bytes);
    whole = std::span<std::byte>(scratch.data(), scratch.size());
  }
  BARGE_RETURN_IF_ERROR(point_.image->ReadAt(begin_bytes, whole));
  for (uint64_t at = begin_bytes; at < end_bytes; at += cb) {
    const uint64_t n = std::min(cb, end_bytes - at);
    auto data = whole.subspan(at - begin_bytes, n);
    const uint64_t cluster = at / cb;
    std::optional<formats::Digest128> want = point_.Expected(cluster);
    if (formats::HashCluster(data, cluster_bytes_) != *want) {
      // The caller gets an error, never these bytes (nor, when direct,
      // any; nbdkit sends no data with an error reply).
      std::string layer = LayerHolding(at);
      return Error::Corruption("cluster " + std::to_string(cluster) + " at guest offset " + formats::Hex(at) +
                               " does not match the digest of backup " + manifest().id +
                               " (the layer file is damaged)")
          .set_path(layer.empty() ? point_.point->manifest_path : layer)
          .set_range(at, n);
    }
  }
  if (!direct) std::memcpy(out.data(), scratch.data() + (offset - begin_bytes), out.size());
  return OkStatus();
}

Result<ExtentList> PointReader::Extents(uint64_t offset, uint64_t length) {
  if (offset > size_bytes_ || length > size_bytes_ - offset) {
    return Error::InvalidArgument("extents past the end of the disk").set_range(offset, length);
  }
  BARGE_ASSIGN_OR_RETURN(ExtentList raw, point_.image->Extents(offset, length));
  const uint64_t cb = cluster_bytes_;
  const auto& entries = point_.digests.entries;
  ExtentList out;
  out.reserve(raw.size());
  for (const Extent& e : raw) {
    if (e.kind == ExtentKind::kData || e.length == 0) {
      out.push_back(e);
      continue;
    }
    // Clusters of this zero run that the digest table says hold data.
    uint64_t at = e.offset;
    auto it = std::lower_bound(entries.begin(), entries.end(), e.offset / cb,
                               [](const formats::DigestEntry& d, uint64_t c) { return d.cluster_index < c; });
    for (; it != entries.end() && it->cluster_index * cb < e.end(); ++it) {
      if (it->digest == zero_digest_) continue;
      const uint64_t data_begin = std::max(e.offset, it->cluster_index * cb);
      const uint64_t data_end = std::min(e.end(), (it->cluster_index + 1) * cb);
      if (data_begin > at) out.push_back({at, data_begin - at, e.kind});
      out.push_back({data_begin, data_end - data_begin, ExtentKind::kData});
      at = data_end;
    }
    if (at < e.end()) out.push_back({at, e.end() - at, e.kind});
  }
  return MergeAdjacent(std::move(out));
}

}  // namespace barge::pipeline
