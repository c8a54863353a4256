// Destinations: the serial, in-order consumers of processed chunks at the end
// of the copy pipeline (a qcow2 image, a raw sink, a digest collector).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/sink.h"
#include "formats/digest.h"
#include "formats/image.h"
#include "formats/qcow2_writer.h"
#include "pipeline/chunk.h"

namespace barge::pipeline {

// Threads: Consume and Finish are called by one thread at a time (the
// destination's serial node), chunks in increasing guest order, each chunk
// exactly once -- unless the destination says concurrent_consume(), then
// Consume may run for several chunks at once, in any order (Finish still
// comes alone, after the last). Chunks are borrowed for the call only; a
// destination must not keep pointers into them.
class Destination {
 public:
  Destination() = default;
  virtual ~Destination() = default;
  Destination(const Destination&) = delete;
  Destination& operator=(const Destination&) = delete;

  // For messages and per-destination status.
  virtual const std::string& name() const = 0;
  // The compression type of the payloads Consume stores (kCompressed
  // clusters); kNone when it stores raw bytes only.
  virtual formats::Compression compression() const { return formats::Compression::kNone; }
  bool wants_compression() const { return compression() != formats::Compression::kNone; }
  // What the qcow2 writer stored so far (clusters, file bytes), for a
  // destination that writes a qcow2 image; nullopt for any other.
  virtual std::optional<formats::Qcow2WriterStats> qcow2_stats() const { return std::nullopt; }
  // Stores the chunk's clusters (all but kSkip). An error fails this
  // destination (and the job, unless the copy isolates destinations).
  virtual Status Consume(const Chunk& chunk) = 0;
  // After the last chunk: metadata, truncation, flush. Not called after an
  // error.
  virtual Status Finish() = 0;
  // Consume is safe for several chunks at once and needs no order (a sink
  // written at the chunks' own offsets). The copy then runs this
  // destination's writes in parallel instead of through one serial node.
  virtual bool concurrent_consume() const { return false; }
};

// What a qcow2 destination does with clusters that read as zero (kZero and
// kHole inside the work set).
enum class ZeroPolicy : uint8_t {
  // Leave them unallocated: full backups, where nothing lies below.
  kOmit,
  // Store zero clusters: incrementals and overlays, where an unallocated
  // cluster would fall through to stale data in the backing file. A hole in
  // the work set (a dirty cluster the guest discarded) is stored as a zero
  // cluster too, for the same reason.
  kZeroCluster,
};

// Writes into a new qcow2 image through formats::Qcow2Writer. Data clusters
// with a payload are stored compressed, others raw.
class Qcow2Destination final : public Destination {
 public:
  // Creates the writer over `sink` (which must outlive the destination).
  static Result<std::unique_ptr<Qcow2Destination>> Create(BlockSink& sink,
                                                         formats::Qcow2WriterOptions options,
                                                         ZeroPolicy zero_policy);
  // Takes an existing writer; `compression` must be the writer's type.
  Qcow2Destination(std::unique_ptr<formats::Qcow2Writer> writer, std::string name,
                   formats::Compression compression, ZeroPolicy zero_policy);

  const std::string& name() const override { return name_; }
  formats::Compression compression() const override { return compression_; }
  std::optional<formats::Qcow2WriterStats> qcow2_stats() const override { return writer_->stats(); }
  Status Consume(const Chunk& chunk) override;
  Status Finish() override;
  formats::Qcow2Writer& writer() { return *writer_; }

 private:
  std::unique_ptr<formats::Qcow2Writer> writer_;
  std::string name_;
  formats::Compression compression_;
  ZeroPolicy zero_policy_;
};

// What StoreQcow2Cluster stores for a cluster in `state` (nullopt: nothing).
std::optional<formats::StoredKind> StoredKindOf(ClusterState state, bool compressed_ok, bool store_zero);

// The cluster-writing steps Qcow2Destination shares with other qcow2
// destinations (pipeline/overlay_destination.h).
// kInvalidArgument unless the chunk's cluster size is the image's.
Status CheckQcow2ClusterSize(const Chunk& chunk, const formats::Qcow2Writer& writer, const std::string& name);
// Stores cluster `i` of `chunk` as its state says: data (the compressed
// payload when `compressed_ok`), zero and hole clusters as qcow2 zero
// clusters when `store_zero` (else nothing), kSkip never. An error carries
// the cluster's guest range and `name`.
Status StoreQcow2Cluster(formats::Qcow2Writer& writer, const Chunk& chunk, size_t i, bool compressed_ok,
                         bool store_zero, const std::string& name);

struct RawDestinationOptions {
  // Guest size; Finish truncates a growable sink to it.
  uint64_t virtual_size = 0;
  // Skip zero and hole clusters when the sink reads unwritten bytes as zeros
  // (SinkCapabilities::zero_initialized). false: always WriteZeroes them
  // (e.g. restoring over an existing disk that claims zero_initialized).
  bool skip_zeroes_if_zero_initialized = true;
};

// Writes the guest bytes into a BlockSink at their guest offsets. Adjacent
// data clusters of a chunk go out as one WriteAt; zero/hole runs are skipped
// on a zero-initialized sink, else one WriteZeroes per run. On a
// zero-initialized sink, all-zero 4 KiB blocks inside data clusters are
// skipped too (as qemu-img convert leaves them sparse).
class RawDestination final : public Destination {
 public:
  // `sink` must outlive the destination.
  RawDestination(BlockSink& sink, RawDestinationOptions options);

  const std::string& name() const override { return sink_.name(); }
  Status Consume(const Chunk& chunk) override;
  // Truncates to virtual_size where the sink can grow, then flushes.
  Status Finish() override;
  // Every chunk goes to its own guest range, and BlockSink allows writes
  // to disjoint ranges at once.
  bool concurrent_consume() const override { return true; }

 private:
  BlockSink& sink_;
  RawDestinationOptions options_;
  bool skip_zeroes_;
};

// One cluster's digest, as recorded for the manifest.
struct ClusterDigest {
  uint64_t cluster_index = 0;
  formats::Digest128 digest;
  friend bool operator==(const ClusterDigest&, const ClusterDigest&) = default;
};

// Digest of a cluster outside the work set (an incremental's parent), or
// nullopt when it reads as zero.
using BaseDigestLookup = std::function<std::optional<formats::Digest128>(uint64_t cluster_index)>;
// The first cluster at or after cluster_index that a BaseDigestLookup may
// list (UINT64_MAX when none): clusters before it fold as zero clusters.
using BaseNextLookup = std::function<uint64_t(uint64_t cluster_index)>;

struct DigestCollectorOptions {
  uint64_t virtual_size = 0;
  uint32_t cluster_bytes = 64 << 10;
  // Also record zero clusters of the work set (an incremental needs them:
  // they mask the parent's digest). Data clusters are always recorded.
  bool record_zero_clusters = false;
  // Clusters outside the work set. Empty: they count as zero.
  BaseDigestLookup base;
  // Optional: lets the fold of clusters outside the work set jump to the
  // ones `base` lists.
  BaseNextLookup base_next;
  formats::ImageDigestAlgorithm algorithm = formats::kCurrentImageDigestAlgorithm;
};

// Records (cluster_index, digest) for the stored clusters and folds the image
// digest over the whole disk in order (formats::ImageDigestBuilder). Memory
// grows with the clusters recorded, not with the disk size. Never fails.
class DigestCollector final : public Destination {
 public:
  explicit DigestCollector(DigestCollectorOptions options);
  ~DigestCollector() override;

  const std::string& name() const override { return name_; }
  Status Consume(const Chunk& chunk) override;
  // Folds the clusters after the last chunk.
  Status Finish() override;

  // Valid after Finish.
  const formats::Digest128& image_digest() const { return image_digest_; }
  const std::vector<ClusterDigest>& cluster_digests() const { return digests_; }
  std::vector<ClusterDigest> TakeClusterDigests() { return std::move(digests_); }

 private:
  // Folds clusters [next_cluster_, end) that are outside the work set.
  void FoldOutside(uint64_t end);

  std::string name_ = "digests";
  DigestCollectorOptions options_;
  uint64_t cluster_count_;
  formats::Digest128 zero_digest_;
  std::unique_ptr<formats::ImageDigestBuilder> builder_;
  uint64_t next_cluster_ = 0;
  std::vector<ClusterDigest> digests_;
  formats::Digest128 image_digest_;
};

}  // namespace barge::pipeline
