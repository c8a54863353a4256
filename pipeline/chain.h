// A disk's chain folder (docs/formats/backup.md): the manifests in it, how
// they link, and the effective per-cluster digests at any point in time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <memory>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/digest_table.h"
#include "formats/image.h"
#include "formats/manifest.h"

namespace barge::pipeline {

struct ChainPoint {
  formats::BackupManifest manifest;
  std::string manifest_path;
  uint32_t sequence = 0;  // the position prefix of the id (0000 = first full)
};

// Every backup point of a chain folder, ordered by sequence. A folder may
// hold several chains (a forced full starts a new one); each point's parent
// link says which.
struct ChainFolder {
  std::string dir;
  std::vector<ChainPoint> points;

  bool empty() const { return points.empty(); }
  const ChainPoint& latest() const { return points.back(); }
  uint32_t next_sequence() const { return points.empty() ? 0 : points.back().sequence + 1; }
  std::string PathOf(const std::string& file_name) const { return dir + "/" + file_name; }

  // Finds a point: "latest" (or empty), a sequence number ("0", "3"), an id
  // ("0003-20261122T151533Z"), or a time (RFC 3339 or compact): the newest
  // point that started not after it. kNotFound otherwise.
  Result<size_t> Resolve(std::string_view at) const;

  // Indexes of the layers of point `index`, oldest (the full) first,
  // following parent links. kCorruption if a link is broken (missing
  // parent, parent digest mismatch, loop), naming the manifest.
  Result<std::vector<size_t>> LayersOf(size_t index) const;
};

// The writer's lock of a chain folder (backup, merge, recovery of an
// interrupted merge): Env::LockFile on DIR/.lock, held while the returned
// lock lives. wait false: fails at once (kBusy, retryable: "another barge
// job is writing this chain folder now") when another job holds it; true:
// blocks until it is free.
Result<std::unique_ptr<EnvLock>> LockChainFolder(Env& env, const std::string& dir, bool wait = false);

// Every function below reads through `env`.

// Loads every manifest (*.json) of `dir`. A folder without manifests gives
// an empty chain; a missing folder is kNotFound. Leftover temporaries of a
// killed run (.*.barge-tmp) are ignored.
// First, an interrupted merge (its journal, pipeline/merge_journal.h) is
// completed under the chain lock: `held` is the caller's lock (from
// LockChainFolder), or null to take it here (waiting for a merge still
// running). With `held`, staged files of a merge that stopped before its
// journal are removed too.
Result<ChainFolder> LoadChainFolder(Env& env, const std::string& dir, const EnvLock* held = nullptr);

// Reads and validates one digest table file.
Result<formats::DigestTable> LoadDigestTable(Env& env, const std::string& path);

// The effective digests of point `index` (its layers merged, newest wins),
// checked against the manifest's image digest: kCorruption naming the point
// if they disagree.
Result<formats::DigestTable> EffectiveDigests(Env& env, const ChainFolder& chain, size_t index);

// Reads a small whole file (manifests, journals); kNotFound / kIoError, and
// kCorruption when it is larger than `max_bytes`.
Result<std::string> ReadSmallFile(Env& env, const std::string& path, uint64_t max_bytes = 16 << 20);

// Binary search for a cluster's digest in a sorted table.
std::optional<formats::Digest128> FindDigest(const formats::DigestTable& table,
                                             uint64_t cluster_index);

}  // namespace barge::pipeline

namespace barge::pipeline {

// A point of a chain opened for reading: its image (with the layers below it
// as the qcow2 backing chain), and the digests every cluster must have.
struct OpenedPoint {
  size_t index = 0;
  const ChainPoint* point = nullptr;  // points into the ChainFolder
  std::unique_ptr<formats::Image> image;
  formats::DigestTable digests;  // effective digests (merged layers)
  // Expected digest of any cluster (zero-cluster digest where none is listed).
  std::optional<formats::Digest128> Expected(uint64_t cluster_index) const;
};

// Opens point `index`: checks the manifests and digest tables (as
// EffectiveDigests), opens the image confined to the chain folder, and
// checks that its qcow2 backing chain is exactly the layers the manifests
// name (kCorruption otherwise, naming the layer).
// `env` must outlive the opened point.
Result<OpenedPoint> OpenPoint(Env& env, const ChainFolder& chain, size_t index);

// The chain folder and point a user path names: a chain folder (with `at`),
// a manifest file, or an image file with its manifest beside it.
struct PointLocation {
  std::string chain_dir;
  std::string at;
};
Result<PointLocation> LocatePoint(Env& env, const std::string& path, const std::string& at);

}  // namespace barge::pipeline
