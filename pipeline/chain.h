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
#include "formats/units.h"
// ReadSmallFile, which the folder's manifests are read with.
#include "pipeline/small_file.h"

namespace barge::pipeline {

struct ChainPoint {
  formats::BackupManifest manifest;
  std::string manifest_path;
  // The number the id starts with: the order the backup was taken in in
  // this folder, never reused (a merge keeps the merged point's id). Not
  // the position, which is the point's index in ChainFolder::points.
  uint32_t sequence = 0;
};

// How a user names a point (restore/verify --at, merge --through), parsed
// without looking at a chain folder.
struct PointSelector {
  enum class Kind : uint8_t {
    kLatest,    // "" or "latest"
    kPosition,  // digits only: the index in the folder's current list of
                // points, oldest first (0 = the oldest point: the full, or
                // after a merge the merged full)
    kId,        // "0003-20261122T151533Z": the backup's id, stable
    kTime,      // RFC 3339 ("2026-11-24T01:05:49-05:00", "...Z", a fraction,
                // 'T' or a space): the newest point that started at or
                // before that instant
  };
  Kind kind = Kind::kLatest;
  std::string text;           // as given
  size_t position = 0;        // kPosition
  formats::Timestamp time;    // kTime
};

// Parses a point selector. kInvalidArgument saying what a point may be
// named by (and, for text that looks like a time, what is wrong with it).
Result<PointSelector> ParsePointSelector(std::string_view text);

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

  // Finds a point (its index = its position) named as PointSelector says.
  // Returns: the index; kInvalidArgument for text that names no point in
  // any folder (ParsePointSelector); kNotFound for an empty folder, a
  // position past the last point, an id not in the folder, or a time
  // before every point (saying which point is the oldest).
  Result<size_t> Resolve(std::string_view at) const;
  Result<size_t> Resolve(const PointSelector& at) const;

  // The instant point `index` started (its manifest's started_at, else the
  // time in its id). kCorruption naming the manifest when neither parses.
  Result<formats::Timestamp> StartedAt(size_t index) const;

  // Indexes of the layers of point `index`, oldest (the full) first,
  // following parent links. kCorruption if a link is broken (missing
  // parent, parent digest mismatch, loop), naming the manifest.
  Result<std::vector<size_t>> LayersOf(size_t index) const;
};

// An exclusive lock on DIR/.lock for the life of the object: the writer's
// lock of a chain folder (backup, merge, recovery of an interrupted merge).
// Taken through Env::LockFile, so a lock file removed by its holder (a
// failed first backup cleans up after itself) is never held by two.
class ChainLock {
 public:
  // wait false: fails at once (kBusy, retryable: "another barge job is
  // writing this chain folder now") when another job holds the lock; true:
  // blocks until it is free. A missing folder is kNotFound naming it.
  // `env` must outlive the lock.
  static Result<ChainLock> Acquire(Env& env, const std::string& dir, bool wait = false);
  ChainLock(ChainLock&& o) noexcept = default;
  ChainLock& operator=(ChainLock&&) = delete;
  ChainLock(const ChainLock&) = delete;
  ~ChainLock();

  // Removes DIR/.lock while still holding it (a chain folder this job
  // created and leaves empty), then releases it.
  Status RemoveLockFile();

 private:
  ChainLock(Env& env, std::unique_ptr<EnvLock> lock) : env_(&env), lock_(std::move(lock)) {}
  Env* env_;
  std::unique_ptr<EnvLock> lock_;
};

// Every function below reads through `env`.

// Loads every manifest (*.json) of `dir`. A folder without manifests gives
// an empty chain; a missing folder is kNotFound. Leftover temporaries of a
// killed run (.*.barge-tmp) are ignored.
// First, an interrupted merge (its journal, pipeline/merge_journal.h) is
// completed under the chain lock: `held` is the caller's lock (from
// ChainLock::Acquire), or null to take it here (waiting for a merge still
// running). With `held`, staged files of a merge that stopped before its
// journal are removed too.
Result<ChainFolder> LoadChainFolder(Env& env, const std::string& dir, const ChainLock* held = nullptr);

// Reads and validates one digest table file.
Result<formats::DigestTable> LoadDigestTable(Env& env, const std::string& path);

// The effective digests of point `index` (its layers merged, newest wins),
// checked against the manifest's image digest: kCorruption naming the point
// if they disagree.
Result<formats::DigestTable> EffectiveDigests(Env& env, const ChainFolder& chain, size_t index);

// The base a chain stands on (`barge backup --base`, docs/formats/backup.md
// "Chains over a base"): the other chain's folder, loaded, and the point.
struct BaseLink {
  std::string dir;  // the base chain's folder, as this chain's dir joined
                    // with the manifest's relative path, normalized
  ChainFolder chain;
  size_t index = 0;
  const formats::BackupManifest& manifest() const { return chain.points[index].manifest; }
};

// The base of point `index`'s layers (the base their first layer names),
// or nullopt when it has none. kNotFound naming the expected folder or
// point when the base chain is moved or gone ("base chain ... is missing:
// expected at PATH"); kCorruption naming the manifest when the base point
// there differs (image name, image digest, virtual size or cluster size).
Result<std::optional<BaseLink>> LoadBaseOf(Env& env, const ChainFolder& chain, size_t index);

// The layers of point `index` over every base below it, as image paths,
// oldest (the bottom base's full) first. For structure checks.
Result<std::vector<std::string>> LayerImagePaths(Env& env, const ChainFolder& chain, size_t index);

// Binary search for a cluster's digest in a sorted table.
std::optional<formats::Digest128> FindDigest(const formats::DigestTable& table,
                                             uint64_t cluster_index);
// The first cluster at or after `cluster_index` that `table` lists
// (UINT64_MAX: none). Binary search.
uint64_t NextListed(const formats::DigestTable& table, uint64_t cluster_index);
// The first cluster of [begin_cluster, end_cluster) that `table` lists with
// a digest other than the zero cluster's, or nullopt.
std::optional<uint64_t> FirstListedData(const formats::DigestTable& table, uint64_t begin_cluster,
                                        uint64_t end_cluster);

}  // namespace barge::pipeline

namespace barge::pipeline {

// A point of a chain opened for reading: its image (with the layers below it
// as the qcow2 backing chain), and the digests every cluster must have.
struct OpenedPoint {
  size_t index = 0;
  const ChainPoint* point = nullptr;  // points into the ChainFolder
  std::unique_ptr<formats::Image> image;
  formats::DigestTable digests;  // effective digests (merged layers, bases included)
  // The image paths of the base chains' layers under this point's own
  // (empty without a base), oldest first: structure checks cover them.
  std::vector<std::string> base_images;
  // Expected digest of any cluster (zero-cluster digest where none is listed).
  std::optional<formats::Digest128> Expected(uint64_t cluster_index) const;
};

// Opens point `index`: checks that its layers record one disk
// (CheckOneDisk, pipeline/disk_identity.h), the manifests and digest tables
// (as EffectiveDigests), opens the image confined to the chain folder, and
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
