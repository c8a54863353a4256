// A content check of the clusters a change record calls clean: before an
// incremental trusts a dirty bitmap (or extents file) for what changed, a
// sample of the clusters it calls unchanged is read from the source and
// compared with the chain's latest point. A disk file replaced under the
// same path (two disks' files swapped, or one overwritten by a copy of
// another) carries its own bitmaps with it, so its record looks valid; its
// clean clusters do not match the chain (docs/formats/backup.md, "Which
// disk a chain holds").
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "blockio/error.h"
#include "blockio/extent.h"
#include "blockio/source.h"
#include "formats/digest_table.h"

namespace barge::pipeline {

// The clusters sampled by default: enough to see another disk at once,
// few enough that the check costs next to nothing (64 clusters: 4 MiB at
// 64 KiB clusters).
inline constexpr uint32_t kCleanSampleClusters = 64;

// What the sample found.
struct CleanSample {
  uint64_t clusters = 0;    // read and compared
  uint64_t bytes_read = 0;  // of the source
  uint64_t differing = 0;   // of `clusters`, those whose digest differs
  std::optional<uint64_t> first_differing_offset;  // guest offset
};

// Reads up to `max_clusters` clusters of `source`, spread evenly over the
// clusters that `work` (the changes, whole clusters) leaves out and that
// hold data in the point `parent` describes (its effective digests,
// MergeDigestTables: an absent cluster reads as zero) or, with
// `source_extents`, that the source maps as data; and compares each with
// `parent`'s digest of it. Nothing to sample (no such cluster) is no
// error: clusters 0. Errors: reading the source (kIo and the like).
Result<CleanSample> SampleCleanClusters(BlockSource& source, const formats::DigestTable& parent,
                                        const RangeList& work, bool source_extents,
                                        uint32_t max_clusters = kCleanSampleClusters);

// The full backup's reason when a sample differs: the disk was replaced
// under its path (or its change record missed writes), naming the parent
// point `parent_id`, `location` and the sample.
std::string ReplacedDiskReason(const CleanSample& sample, const std::string& parent_id,
                               const std::string& location);

}  // namespace barge::pipeline
