// Strong digest tables of chain points, and comparing a source with one.
#include "pipeline/digest_changes.h"

#include <algorithm>

#include "pipeline/chain_files.h"

namespace barge::pipeline {

namespace {

CopyOptions ScanOptions(const CopyOptions& copy, uint32_t cluster_bytes) {
  CopyOptions o;
  o.cluster_bytes = cluster_bytes;
  o.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, cluster_bytes);
  o.memory_bytes = copy.memory_bytes;
  o.threads = copy.threads;
  o.compression = formats::Compression::kNone;
  o.strong_digests = true;
  o.progress = copy.progress;
  o.stats = copy.stats;
  o.cancel = copy.cancel;
  return o;
}

}  // namespace

Result<PointStrongTable> LoadPointStrongTable(Env& env, const ChainFolder& chain, size_t index,
                                              const CopyOptions& copy) {
  const ChainPoint& point = chain.points.at(index);
  const formats::BackupManifest& m = point.manifest;
  PointStrongTable out;
  if (!m.strong_digest_table.empty()) {
    std::string path = chain.PathOf(m.strong_digest_table);
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, path, 1ull << 34));
    auto table = formats::DecodeStrongDigestTable(std::as_bytes(std::span(text.data(), text.size())));
    if (!table.ok()) return Error(table.error()).set_path(path);
    if (table->cluster_bytes != m.cluster_size || table->virtual_size != m.virtual_size ||
        table->image_digest != m.image_digest) {
      return Error::Corruption("strong digest table is not of backup " + m.id + " (its cluster size, disk size or "
                               "image digest differ from the manifest's)")
          .set_path(path);
    }
    out.table = std::move(table).value();
    return out;
  }
  // No table of its own: read the point once, each cluster checked
  // against the chain's xxh3 digests on the way (as verify reads it).
  BARGE_ASSIGN_OR_RETURN(OpenedPoint opened, OpenPoint(env, chain, index));
  CopyOptions o = ScanOptions(copy, m.cluster_size);
  o.digest_algorithm = m.image_digest_algorithm;
  o.verify = [&opened](uint64_t c) { return opened.Expected(c); };
  o.skip_zero_extents = !o.sha512 && !o.record_zero_digests;
  o.verify_zero_run = [&opened](uint64_t b, uint64_t e) { return FirstListedData(opened.digests, b, e); };
  auto copied = RunCopy(*opened.image, {{0, m.virtual_size}}, {}, o);
  if (!copied.ok()) {
    return Error(copied.error()).Wrap("computing the strong digests of backup " + m.id + " from the chain");
  }
  if (copied->image_digest != m.image_digest) {
    return Error::Corruption("image digest " + copied->image_digest.ToHex() + " differs from the manifest's " +
                             m.image_digest.ToHex())
        .set_path(point.manifest_path);
  }
  out.table.cluster_bytes = m.cluster_size;
  out.table.virtual_size = m.virtual_size;
  out.table.image_digest = m.image_digest;
  out.table.entries = std::move(copied->strong_digests);
  out.computed = true;
  out.bytes_read = copied->bytes_read;
  return out;
}

Result<DigestChanges> FindChangedClusters(BlockSource& source, const formats::StrongDigestTable& base,
                                          const CopyOptions& copy) {
  uint64_t size = source.size_bytes();
  if (base.virtual_size != size) {
    return Error::InvalidArgument("the strong digest table is of a disk of " + std::to_string(base.virtual_size) +
                                  " bytes, the source has " + std::to_string(size))
        .set_path(source.name());
  }
  CopyOptions o = ScanOptions(copy, base.cluster_bytes);
  o.weak_digests = false;  // only the SHA-256s are compared: no xxh3 pass
  // Only data clusters are listed: runs of holes are not walked.
  o.skip_zero_extents = true;
  auto copied = RunCopy(source, {{0, size}}, {}, o);
  if (!copied.ok()) return Error(copied.error()).Wrap("comparing the source with the chain's strong digests");
  DigestChanges out;
  out.bytes_read = copied->bytes_read;
  out.source = std::move(copied->strong_digests);
  const uint64_t cluster = base.cluster_bytes;
  auto mark = [&](uint64_t c) {
    ++out.changed_clusters;
    uint64_t begin = c * cluster;
    uint64_t length = std::min(cluster, size - begin);
    if (!out.changed.empty() && out.changed.back().end() == begin) {
      out.changed.back().length += length;
    } else {
      out.changed.push_back({begin, length});
    }
  };
  // Both lists are sorted by cluster: one merge walk. A cluster in one list
  // only is data on one side and zero on the other.
  const auto& a = out.source;
  const auto& b = base.entries;
  size_t i = 0, j = 0;
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i].cluster_index < b[j].cluster_index)) {
      mark(a[i++].cluster_index);
    } else if (i == a.size() || b[j].cluster_index < a[i].cluster_index) {
      mark(b[j++].cluster_index);
    } else {
      if (a[i].digest != b[j].digest) mark(a[i].cluster_index);
      ++i;
      ++j;
    }
  }
  return out;
}

Result<BaseDiff> DiffFromBase(Env& env, BlockSource& source, const ChainFolder& base_chain, size_t base_index,
                              const CopyOptions& copy) {
  auto table = LoadPointStrongTable(env, base_chain, base_index, copy);
  if (!table.ok()) return Error(table.error()).Wrap("the base");
  BaseDiff out;
  out.base_computed = table->computed;
  out.base_bytes_read = table->bytes_read;
  auto changes = FindChangedClusters(source, table->table, copy);
  if (!changes.ok()) return Error(changes.error()).Wrap("comparing the source with its base");
  out.changes = std::move(changes).value();
  return out;
}

}  // namespace barge::pipeline
