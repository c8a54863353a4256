// The sampled content check of a change record's clean clusters.
#include "pipeline/clean_sample.h"

#include <algorithm>
#include <vector>

#include "formats/digest.h"
#include "formats/units.h"

namespace barge::pipeline {
namespace {

// The clusters of `parent` that hold data (a digest other than the zero
// cluster's), as byte ranges clipped to the disk.
RangeList ChainDataRanges(const formats::DigestTable& parent) {
  const formats::Digest128 zero = formats::ZeroClusterDigest(parent.cluster_bytes);
  RangeList out;
  for (const formats::DigestEntry& e : parent.entries) {
    if (e.digest == zero) continue;
    const uint64_t off = e.cluster_index * parent.cluster_bytes;
    const uint64_t len = std::min<uint64_t>(parent.cluster_bytes, parent.virtual_size - off);
    if (!out.empty() && out.back().end() == off) {
      out.back().length += len;
    } else {
      out.push_back({off, len});
    }
  }
  return out;
}

// The parts of `within` that `source` maps as data, widened to clusters.
Result<RangeList> SourceDataRanges(BlockSource& source, const RangeList& within, uint32_t cluster) {
  constexpr uint64_t kWindow = 1ull << 30;
  RangeList data;
  for (const Range& r : within) {
    for (uint64_t off = r.offset; off < r.end(); off += kWindow) {
      const uint64_t n = std::min(kWindow, r.end() - off);
      BARGE_ASSIGN_OR_RETURN(ExtentList extents, source.Extents(off, n));
      for (const Extent& e : extents) {
        if (e.kind == ExtentKind::kData) data.push_back({e.offset, e.length});
      }
    }
  }
  return AlignRanges(data, cluster, source.size_bytes());
}

formats::Digest128 DigestOf(const formats::DigestTable& parent, uint64_t index) {
  auto it = std::lower_bound(parent.entries.begin(), parent.entries.end(), index,
                             [](const formats::DigestEntry& e, uint64_t i) { return e.cluster_index < i; });
  if (it != parent.entries.end() && it->cluster_index == index) return it->digest;
  return formats::ZeroClusterDigest(parent.cluster_bytes);
}

}  // namespace

Result<CleanSample> SampleCleanClusters(BlockSource& source, const formats::DigestTable& parent,
                                        const RangeList& work, bool source_extents, uint32_t max_clusters) {
  CleanSample sample;
  const uint32_t cluster = parent.cluster_bytes;
  const uint64_t size = std::min(parent.virtual_size, source.size_bytes());
  if (cluster == 0 || size == 0 || max_clusters == 0) return sample;
  const RangeList clean = SubtractRanges({{0, size}}, AlignRanges(work, cluster, size));
  RangeList held = ChainDataRanges(parent);
  if (source_extents) {
    BARGE_ASSIGN_OR_RETURN(RangeList data, SourceDataRanges(source, clean, cluster));
    held = UniteRanges(held, data);
  }
  // clean ∩ held, in whole clusters (both are cluster-aligned).
  const RangeList candidates = SubtractRanges(clean, SubtractRanges(clean, held));
  uint64_t count = 0;
  for (const Range& r : candidates) count += (r.length + cluster - 1) / cluster;
  if (count == 0) return sample;
  const uint64_t picks = std::min<uint64_t>(max_clusters, count);
  std::vector<std::byte> buf(cluster);
  size_t range = 0;
  uint64_t before = 0;  // candidate clusters in ranges before `range`
  for (uint64_t i = 0; i < picks; ++i) {
    // Evenly spread: the middle of each of `picks` equal shares.
    const uint64_t pos = (2 * i + 1) * count / (2 * picks);
    while (pos >= before + (candidates[range].length + cluster - 1) / cluster) {
      before += (candidates[range].length + cluster - 1) / cluster;
      ++range;
    }
    const uint64_t off = candidates[range].offset + (pos - before) * cluster;
    const uint64_t len = std::min<uint64_t>(cluster, size - off);
    std::span<std::byte> bytes(buf.data(), len);
    BARGE_RETURN_IF_ERROR(source.ReadAt(off, bytes));
    ++sample.clusters;
    sample.bytes_read += len;
    if (formats::HashCluster(bytes, cluster) != DigestOf(parent, off / cluster)) {
      if (sample.differing++ == 0) sample.first_differing_offset = off;
    }
  }
  return sample;
}

std::string ReplacedDiskReason(const CleanSample& sample, const std::string& parent_id,
                               const std::string& location) {
  return "disk replaced: " + std::to_string(sample.differing) + " of " + std::to_string(sample.clusters) +
         " sampled clusters that the change record calls unchanged differ from backup " + parent_id +
         " (first at offset " + std::to_string(sample.first_differing_offset.value_or(0)) + "): " + location +
         " is not the disk this chain holds (its file was swapped with, or overwritten by, another disk's, "
         "or its change record missed writes); a full backup starts a new chain";
}

}  // namespace barge::pipeline
