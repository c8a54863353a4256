// Qcow2Destination, RawDestination and DigestCollector.
#include "pipeline/destination.h"

#include <algorithm>


namespace barge::pipeline {

// ---------------------------------------------------------------- qcow2

Result<std::unique_ptr<Qcow2Destination>> Qcow2Destination::Create(
    BlockSink& sink, formats::Qcow2WriterOptions options, ZeroPolicy zero_policy) {
  formats::Compression compression = options.compression;
  BARGE_ASSIGN_OR_RETURN(auto writer, formats::Qcow2Writer::Create(sink, std::move(options)));
  return std::make_unique<Qcow2Destination>(std::move(writer), sink.name(), compression, zero_policy);
}

Qcow2Destination::Qcow2Destination(std::unique_ptr<formats::Qcow2Writer> writer, std::string name,
                                   formats::Compression compression, ZeroPolicy zero_policy)
    : writer_(std::move(writer)), name_(std::move(name)), compression_(compression), zero_policy_(zero_policy) {}

Status CheckQcow2ClusterSize(const Chunk& chunk, const formats::Qcow2Writer& writer, const std::string& name) {
  if (chunk.cluster_bytes() == writer.cluster_size()) return OkStatus();
  return Error::InvalidArgument("copy cluster size " + std::to_string(chunk.cluster_bytes()) +
                                " differs from the image's " + std::to_string(writer.cluster_size()))
      .set_path(name);
}

std::optional<formats::StoredKind> StoredKindOf(ClusterState state, bool compressed_ok, bool store_zero) {
  switch (state) {
    case ClusterState::kSkip:
      return std::nullopt;
    case ClusterState::kHole:
    case ClusterState::kZero:
      if (!store_zero) return std::nullopt;
      return formats::StoredKind::kZero;
    case ClusterState::kCompressed:
      if (compressed_ok) return formats::StoredKind::kCompressed;
      return formats::StoredKind::kData;
    case ClusterState::kData:
      return formats::StoredKind::kData;
  }
  return std::nullopt;
}

Status StoreQcow2Cluster(formats::Qcow2Writer& writer, const Chunk& chunk, size_t i, bool compressed_ok,
                         bool store_zero, const std::string& name) {
  const uint64_t cluster = chunk.first_cluster() + i;
  std::optional<formats::StoredKind> kind = StoredKindOf(chunk.states[i], compressed_ok, store_zero);
  if (!kind) return OkStatus();
  Status s;
  switch (*kind) {
    case formats::StoredKind::kZero:
      s = writer.WriteZero(cluster);
      break;
    case formats::StoredKind::kCompressed:
      s = writer.WriteCompressed(cluster, chunk.Payload(i));
      break;
    case formats::StoredKind::kData:
      s = writer.WriteData(cluster, chunk.ClusterData(i));
      break;
  }
  if (!s.ok()) {
    Error e = std::move(s).error();
    if (!e.offset()) e.set_range(chunk.ClusterOffset(i), chunk.ClusterLength(i));
    if (e.path().empty()) e.set_path(name);
    return e;
  }
  return OkStatus();
}

Status Qcow2Destination::Consume(const Chunk& chunk) {
  BARGE_RETURN_IF_ERROR(CheckQcow2ClusterSize(chunk, *writer_, name_));
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    BARGE_RETURN_IF_ERROR(
        StoreQcow2Cluster(*writer_, chunk, i, wants_compression(), zero_policy_ == ZeroPolicy::kZeroCluster, name_));
  }
  return OkStatus();
}

Status Qcow2Destination::Finish() { return writer_->Finish(); }

// ---------------------------------------------------------------- raw

RawDestination::RawDestination(BlockSink& sink, RawDestinationOptions options)
    : sink_(sink),
      options_(options),
      skip_zeroes_(options.skip_zeroes_if_zero_initialized && sink.capabilities().zero_initialized) {}

Status RawDestination::Consume(const Chunk& chunk) {
  const size_t n = chunk.cluster_count();
  const uint64_t cluster_bytes = chunk.cluster_bytes();
  auto is_data = [](ClusterState s) { return s == ClusterState::kData || s == ClusterState::kCompressed; };
  for (size_t i = 0; i < n;) {
    ClusterState s = chunk.states[i];
    if (s == ClusterState::kSkip || (!is_data(s) && skip_zeroes_)) {
      ++i;
      continue;
    }
    // A run of clusters of the same kind (data vs. zero), coalesced.
    const bool data = is_data(s);
    size_t j = i + 1;
    while (j < n && chunk.states[j] != ClusterState::kSkip && is_data(chunk.states[j]) == data) ++j;
    uint64_t begin = i * cluster_bytes;
    uint64_t end = std::min<uint64_t>(j * cluster_bytes, chunk.length_bytes);
    uint64_t offset = chunk.offset_bytes + begin;
    Status st = !data            ? sink_.WriteZeroes(offset, end - begin)
                : skip_zeroes_ ? WriteSkippingZeroBlocks(sink_, offset, chunk.WindowBytes(begin, end - begin))
                               : sink_.WriteAt(offset, chunk.WindowBytes(begin, end - begin));
    if (!st.ok()) {
      Error e = std::move(st).error();
      if (!e.offset()) e.set_range(offset, end - begin);
      if (e.path().empty()) e.set_path(sink_.name());
      return e;
    }
    i = j;
  }
  return OkStatus();
}

Status RawDestination::Finish() {
  SinkCapabilities caps = sink_.capabilities();
  // A hole at the end of the disk was never written: extend to the size.
  if (caps.can_grow && sink_.size_bytes() != options_.virtual_size) {
    BARGE_RETURN_IF_ERROR(sink_.Truncate(options_.virtual_size));
  }
  return sink_.Flush();
}

// ---------------------------------------------------------------- digests

DigestCollector::DigestCollector(DigestCollectorOptions options)
    : options_(std::move(options)),
      cluster_count_((options_.virtual_size + options_.cluster_bytes - 1) / options_.cluster_bytes),
      zero_digest_(formats::ZeroClusterDigest(options_.cluster_bytes)),
      builder_(std::make_unique<formats::ImageDigestBuilder>(options_.algorithm, options_.cluster_bytes)) {}

DigestCollector::~DigestCollector() = default;

void DigestCollector::FoldOutside(uint64_t end) {
  end = std::min(end, cluster_count_);
  if (next_cluster_ >= end) return;
  if (!options_.base) {
    builder_->AddRepeated(zero_digest_, end - next_cluster_);
    next_cluster_ = end;
    return;
  }
  while (next_cluster_ < end) {
    if (options_.base_next) {
      uint64_t listed = std::min(options_.base_next(next_cluster_), end);
      builder_->AddRepeated(zero_digest_, listed - next_cluster_);
      next_cluster_ = listed;
      if (next_cluster_ >= end) break;
    }
    std::optional<formats::Digest128> d = options_.base(next_cluster_);
    builder_->Add(d ? *d : zero_digest_);
    ++next_cluster_;
  }
}

Status DigestCollector::Consume(const Chunk& chunk) {
  if (chunk.zero_run_clusters() > 0) {
    // A skipped run reads as zeros: it masks any base digest.
    FoldOutside(chunk.zero_run_begin);
    uint64_t end = std::min(chunk.zero_run_end, cluster_count_);
    if (next_cluster_ < end) builder_->AddRepeated(zero_digest_, end - next_cluster_);
    next_cluster_ = std::max(next_cluster_, end);
  }
  const uint64_t first = chunk.first_cluster();
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    ClusterState s = chunk.states[i];
    if (s == ClusterState::kSkip) continue;
    uint64_t cluster = first + i;
    FoldOutside(cluster);
    if (next_cluster_ != cluster) continue;  // beyond the disk; cannot happen for valid chunks
    builder_->Add(chunk.digests[i]);
    ++next_cluster_;
    bool data = s == ClusterState::kData || s == ClusterState::kCompressed;
    if (data || options_.record_zero_clusters) digests_.push_back({cluster, chunk.digests[i]});
  }
  return OkStatus();
}

Status DigestCollector::Finish() {
  FoldOutside(cluster_count_);
  image_digest_ = builder_->Finish();
  return OkStatus();
}

}  // namespace barge::pipeline
