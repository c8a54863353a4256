// Change detection by strong digest (docs/formats/backup.md, "Strong digest
// table"; threat model in docs/security.md): a point's SHA-256 table, loaded
// or computed from the chain, and the clusters of a source that differ
// from it.
#pragma once

#include <cstdint>
#include <functional>

#include "blockio/env.h"
#include "blockio/extent.h"
#include "blockio/source.h"
#include "formats/strong_digest_table.h"
#include "pipeline/chain.h"
#include "pipeline/copy.h"

namespace barge::pipeline {

struct PointStrongTable {
  formats::StrongDigestTable table;
  // true: the point had no table of its own (an earlier point of a chain
  // that did not detect by digest), so it was computed by reading it.
  bool computed = false;
  uint64_t bytes_read = 0;  // computed: bytes read from the chain
};

// The strong table of point `index`: its own (`strong_digest_table` in the
// manifest), which must describe that point (cluster size, virtual size and
// image digest equal to the manifest's; otherwise kCorruption naming it),
// or, when it has none, computed by reading the point once through its
// chain, every cluster checked against the point's xxh3 digests (a damaged
// chain is kCorruption naming the layer, as verify says). `copy` gives the
// pipeline knobs (threads, memory, cancel, progress); its compression and
// digest fields are ignored.
Result<PointStrongTable> LoadPointStrongTable(Env& env, const ChainFolder& chain, size_t index,
                                              const CopyOptions& copy);

struct DigestChanges {
  // Whole clusters (guest bytes, aligned; the last may end at the disk's
  // end) whose content differs from the table's: new or changed data, and
  // data that became zero (zero or hole extents are not read).
  RangeList changed;
  uint64_t changed_clusters = 0;
  // The source's data clusters (every non-zero cluster), in order.
  std::vector<formats::StrongDigestEntry> source;
  uint64_t bytes_read = 0;
};

// Reads every allocated cluster of `source` (the source's zero and hole
// extents are taken as zero clusters, unread), SHA-256s each, and compares
// it with `base` (a cluster without an entry reads as zero there).
// kInvalidArgument when the table's cluster or virtual size is not the
// source's. `copy` as for LoadPointStrongTable.
Result<DigestChanges> FindChangedClusters(BlockSource& source, const formats::StrongDigestTable& base,
                                          const CopyOptions& copy);

struct BaseDiff {
  DigestChanges changes;  // `source` against the base point
  // The base point had no strong table: it was computed by reading it
  // (bytes), every cluster checked against its chain's xxh3 digests.
  bool base_computed = false;
  uint64_t base_bytes_read = 0;
};

// Which clusters of `source` differ from point `base_index` of another
// chain (`barge backup --base`): the SHA-256 of each source cluster against
// the base point's strong table (LoadPointStrongTable: its own, or computed
// from the base chain, a damaged base being kCorruption naming its layer).
// A cluster that is zero in the source and data in the base differs (it is
// written as a zero cluster). A digest that only xxh3 would call equal is
// never taken for equal bytes (docs/security.md).
Result<BaseDiff> DiffFromBase(Env& env, BlockSource& source, const ChainFolder& base_chain, size_t base_index,
                              const CopyOptions& copy);

}  // namespace barge::pipeline
