// The copy pipeline's stages as plain classes; see stages.h.
#include "pipeline/stages.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace barge::pipeline {
namespace {

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

constexpr size_t kZeroBlockBytes = 64 << 10;
const std::byte* ZeroBlock() {
  static const std::vector<std::byte> zeros(kZeroBlockBytes);
  return zeros.data();
}

}  // namespace

// ---------------------------------------------------------------- planner

ChunkPlanner::ChunkPlanner(BlockSource& source, const RangeList& work, uint32_t cluster_bytes,
                           uint32_t chunk_bytes, uint64_t extent_query_bytes, bool skip_zero_extents)
    : source_(source),
      size_bytes_(source.size_bytes()),
      cluster_bytes_(cluster_bytes),
      chunk_bytes_(chunk_bytes),
      extent_query_bytes_(std::max<uint64_t>(extent_query_bytes, chunk_bytes)),
      has_extents_(source.capabilities().has_extents),
      skip_zero_extents_(skip_zero_extents && has_extents_),
      work_(AlignRanges(work, cluster_bytes, source.size_bytes())),
      work_bytes_(TotalBytes(work_)) {}

Status ChunkPlanner::Cover(uint64_t offset, uint64_t range_end) {
  if (offset >= cache_begin_ && offset < cache_end_) return OkStatus();
  // Ask for a large span, cluster aligned, clipped to the work range so an
  // incremental never walks the clean parts of the disk.
  uint64_t length = std::min(extent_query_bytes_, range_end - offset);
  length = (length + cluster_bytes_ - 1) / cluster_bytes_ * cluster_bytes_;
  length = std::min(length, size_bytes_ - offset);
  return Query(offset, length);
}

Status ChunkPlanner::Query(uint64_t offset, uint64_t length) {
  auto extents = source_.Extents(offset, length);
  if (!extents.ok()) return std::move(extents).error().Wrap("extents");
  cache_ = std::move(extents).value();
  cache_begin_ = offset;
  cache_end_ = offset + length;
  cache_index_ = 0;
  return OkStatus();
}

Result<uint64_t> ChunkPlanner::ZeroRunEnd(uint64_t offset, uint64_t range_end) {
  // A cursor of its own: Classify's must not pass the clusters a run too
  // short to skip leaves for it.
  size_t i = cache_index_;
  while (offset < range_end) {
    const uint64_t begin = cache_begin_;
    if (offset < cache_begin_ || offset >= cache_end_) {
      // One query to the end of the range: SEEK_DATA in a hole finds the
      // next data however far it is, so queries of a bounded span would
      // each walk the same hole again (quadratic in the hole's size).
      BARGE_RETURN_IF_ERROR(Query(offset, std::min(range_end, size_bytes_) - offset));
    }
    if (cache_begin_ != begin) i = 0;
    while (i < cache_.size() && cache_[i].end() <= offset) ++i;
    if (i >= cache_.size() || cache_[i].offset > offset) break;  // not covered: data
    const Extent& e = cache_[i];
    if (e.kind == ExtentKind::kData) break;
    offset = std::min({e.end(), cache_end_, range_end});
  }
  return offset;
}

Result<ClusterState> ChunkPlanner::Classify(uint64_t cluster_offset, uint64_t cluster_end,
                                            uint64_t range_end) {
  if (!has_extents_) return ClusterState::kData;
  BARGE_RETURN_IF_ERROR(Cover(cluster_offset, range_end));
  while (cache_index_ < cache_.size() && cache_[cache_index_].end() <= cluster_offset) ++cache_index_;
  // Bytes not covered by any extent count as data: the source may be coarse,
  // never wrong in the other direction.
  uint64_t hole_bytes = 0;
  uint64_t zero_bytes = 0;
  for (size_t i = cache_index_; i < cache_.size() && cache_[i].offset < cluster_end; ++i) {
    const Extent& e = cache_[i];
    uint64_t start = std::max(e.offset, cluster_offset);
    uint64_t end = std::min(e.end(), cluster_end);
    if (end <= start) continue;
    switch (e.kind) {
      case ExtentKind::kData: return ClusterState::kData;
      case ExtentKind::kHole: hole_bytes += end - start; break;
      case ExtentKind::kZero: zero_bytes += end - start; break;
    }
  }
  uint64_t length = cluster_end - cluster_offset;
  if (hole_bytes >= length) return ClusterState::kHole;
  if (hole_bytes + zero_bytes >= length) return ClusterState::kZero;
  return ClusterState::kData;
}

Result<bool> ChunkPlanner::Next(Chunk& chunk) {
  while (range_index_ < work_.size() && position_ >= work_[range_index_].end()) ++range_index_;
  if (range_index_ >= work_.size()) return false;
  position_ = std::max(position_, work_[range_index_].offset);

  if (skip_zero_extents_) {
    // A run of whole clusters reading as zeros, at least a window long:
    // one chunk carries it, whatever its length.
    const uint64_t range_end = work_[range_index_].end();
    BARGE_ASSIGN_OR_RETURN(uint64_t run_end, ZeroRunEnd(position_, range_end));
    run_end = run_end >= size_bytes_ ? size_bytes_ : run_end / cluster_bytes_ * cluster_bytes_;
    if (run_end > position_ && (run_end - position_ >= chunk_bytes_ || run_end == range_end)) {
      chunk.Reset(next_sequence_++, run_end, 0);
      chunk.zero_run_begin = position_ / cluster_bytes_;
      chunk.zero_run_end = (run_end + cluster_bytes_ - 1) / cluster_bytes_;
      position_ = run_end;
      return true;
    }
  }

  uint64_t window_start = position_ / chunk_bytes_ * chunk_bytes_;
  uint64_t window_end = std::min(window_start + chunk_bytes_, size_bytes_);
  chunk.Reset(next_sequence_++, window_start, window_end - window_start);

  // Every work range touching the window; the last may continue past it.
  size_t r = range_index_;
  while (r < work_.size() && work_[r].offset < window_end) {
    // position_ may lie inside the window after a skipped zero run.
    uint64_t start = std::max({work_[r].offset, window_start, position_});
    uint64_t end = std::min(work_[r].end(), window_end);
    for (uint64_t c = start; c < end; c += cluster_bytes_) {
      uint64_t c_end = std::min<uint64_t>(c + cluster_bytes_, size_bytes_);
      BARGE_ASSIGN_OR_RETURN(ClusterState state, Classify(c, c_end, work_[r].end()));
      chunk.states[(c - window_start) / cluster_bytes_] = state;
    }
    if (work_[r].end() > window_end) break;
    ++r;
  }
  range_index_ = r;
  position_ = window_end;
  return true;
}

// ---------------------------------------------------------------- reader

Result<uint64_t> Reader::Read(Chunk& chunk) {
  // Reused per thread: no allocation per chunk once warm.
  thread_local std::vector<ReadRequest> requests;
  requests.clear();
  const size_t n = chunk.cluster_count();
  const uint64_t cluster_bytes = chunk.cluster_bytes();
  uint64_t total = 0;
  for (size_t i = 0; i < n;) {
    if (chunk.states[i] != ClusterState::kData) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && chunk.states[j] == ClusterState::kData) ++j;
    uint64_t begin = i * cluster_bytes;
    uint64_t end = std::min<uint64_t>(j * cluster_bytes, chunk.length_bytes);
    requests.push_back({chunk.offset_bytes + begin, chunk.WindowBytes(begin, end - begin), {}});
    total += end - begin;
    i = j;
  }
  if (requests.empty()) return uint64_t{0};
  read_ahead_.Before(source_, requests.back().offset + requests.back().buffer.size());
  Status status = source_.ReadMany(requests);
  if (!status.ok()) {
    for (const ReadRequest& r : requests) {
      if (r.status.ok()) continue;
      Error error = r.status.error();
      if (!error.offset()) error.set_range(r.offset, r.buffer.size());
      if (error.path().empty()) error.set_path(source_.name());
      return error;
    }
    return std::move(status).error();
  }
  return total;
}

// ---------------------------------------------------------------- processor

ClusterProcessor::ClusterProcessor(uint32_t cluster_bytes, bool strong, bool weak)
    : cluster_bytes_(cluster_bytes),
      strong_(strong),
      weak_(weak),
      zero_digest_(formats::ZeroClusterDigest(cluster_bytes)) {}

namespace {

// SHA-256 fetched once for the process (EVP_sha256() in EVP_DigestInit
// fetches it again on every call in OpenSSL 3: a lock and a lookup per
// cluster), and one context per thread, reset by each init.
struct Sha256Context {
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Sha256Context() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
};

}  // namespace

formats::StrongDigest StrongHashCluster(std::span<const std::byte> data, uint32_t cluster_bytes) {
  thread_local Sha256Context sha;
  formats::StrongDigest out{};
  unsigned int len = 0;
  EVP_MD_CTX* ctx = sha.ctx;
  EVP_DigestInit_ex(ctx, sha.md != nullptr ? sha.md : EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, data.data(), data.size());
  // A short last cluster hashes as if zero-padded (as the xxh3 digest does).
  static constexpr std::byte kZeros[4096] = {};
  for (uint64_t left = data.size() < cluster_bytes ? cluster_bytes - data.size() : 0; left > 0;) {
    size_t n = std::min<uint64_t>(left, sizeof kZeros);
    EVP_DigestUpdate(ctx, kZeros, n);
    left -= n;
  }
  EVP_DigestFinal_ex(ctx, out.data(), &len);
  return out;
}

Status ClusterProcessor::Process(Chunk& chunk, formats::ClusterCompressor* compressor,
                                 ProcessTimings* timings) const {
  const size_t n = chunk.cluster_count();
  if (strong_) chunk.strong.assign(n, formats::StrongDigest{});
  uint64_t t0 = timings ? NowNs() : 0;
  for (size_t i = 0; i < n; ++i) {
    ClusterState& state = chunk.states[i];
    if (state == ClusterState::kSkip) continue;
    if (state != ClusterState::kData) {
      chunk.digests[i] = zero_digest_;
      continue;
    }
    std::span<const std::byte> data = chunk.ClusterData(i);
    bool zero = IsAllZero(data);
    uint64_t t1 = timings ? NowNs() : 0;
    if (timings) timings->zero_detect_ns += t1 - t0;
    if (zero) {
      state = ClusterState::kZero;
      chunk.digests[i] = zero_digest_;
      t0 = t1;
      continue;
    }
    if (weak_) chunk.digests[i] = formats::HashCluster(data, cluster_bytes_);
    uint64_t t2 = timings ? NowNs() : 0;
    if (timings) timings->hash_ns += t2 - t1;
    if (strong_) {
      chunk.strong[i] = StrongHashCluster(data, cluster_bytes_);
      uint64_t t3 = timings ? NowNs() : 0;
      if (timings) timings->strong_hash_ns += t3 - t2;
      t2 = t3;
    }
    t0 = t2;
    if (compressor == nullptr) continue;

    std::span<const std::byte> whole = data;
    if (data.size() < cluster_bytes_) {
      // Short last cluster: zero pad in its own slot (the chunk's buffer is
      // whole clusters long), so the compressor sees a full cluster.
      std::span<std::byte> slot = chunk.ClusterSlot(i);
      std::memset(slot.data() + data.size(), 0, slot.size() - data.size());
      whole = slot;
    }
    // Straight into the chunk's payload slot: no copy of the payload.
    auto payload = compressor->CompressInto(whole, chunk.PayloadSlot(i));
    if (!payload.ok()) {
      return std::move(payload).error().Wrap("compress").set_range(chunk.ClusterOffset(i), data.size());
    }
    if (*payload > 0) {
      chunk.payload_bytes[i] = static_cast<uint32_t>(*payload);
      state = ClusterState::kCompressed;
      if (timings) ++timings->compressed_clusters;
    }
    uint64_t t3 = timings ? NowNs() : 0;
    if (timings) timings->compress_ns += t3 - t2;
    t0 = t3;
  }
  return OkStatus();
}

// ---------------------------------------------------------------- verifier

Status Verifier::Check(const Chunk& chunk) const {
  if (!expected_) return OkStatus();
  const uint64_t first = chunk.first_cluster();
  for (size_t i = 0; i < chunk.cluster_count(); ++i) {
    if (chunk.states[i] == ClusterState::kSkip) continue;
    std::optional<formats::Digest128> want = expected_(first + i);
    if (!want || *want == chunk.digests[i]) continue;
    std::string holder = holder_ ? holder_(chunk.ClusterOffset(i)) : std::string();
    return Error::Corruption("cluster " + std::to_string(first + i) + " at guest offset " +
                             Hex(chunk.ClusterOffset(i)) + " does not match its expected digest (expected " +
                             want->ToHex() + ", got " + chunk.digests[i].ToHex() + ")")
        .set_path(holder.empty() ? source_name_ : holder)
        .set_range(chunk.ClusterOffset(i), chunk.ClusterLength(i));
  }
  return OkStatus();
}

// ---------------------------------------------------------------- sha-512

struct Sha512Stream::Impl {
  EVP_MD_CTX* ctx = nullptr;
  bool ok = false;
  bool finished = false;
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Sha512Stream::Sha512Stream() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  impl_->ok = impl_->ctx != nullptr && EVP_DigestInit_ex(impl_->ctx, EVP_sha512(), nullptr) == 1;
}

Sha512Stream::~Sha512Stream() = default;

void Sha512Stream::Reset() {
  impl_->finished = false;
  impl_->ok = impl_->ctx != nullptr && EVP_DigestInit_ex(impl_->ctx, EVP_sha512(), nullptr) == 1;
}

Status Sha512Stream::Update(std::span<const std::byte> data) {
  if (!impl_->ok || impl_->finished) return Error::InvalidArgument("sha512: stream not usable");
  if (data.empty()) return OkStatus();
  if (EVP_DigestUpdate(impl_->ctx, data.data(), data.size()) != 1) {
    impl_->ok = false;
    return Error::IoError("sha512: EVP_DigestUpdate failed");
  }
  return OkStatus();
}

Status Sha512Stream::UpdateZeros(uint64_t count) {
  while (count > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(count, kZeroBlockBytes));
    BARGE_RETURN_IF_ERROR(Update({ZeroBlock(), n}));
    count -= n;
  }
  return OkStatus();
}

Status Sha512Stream::UpdateChunk(const Chunk& chunk) {
  const size_t n = chunk.cluster_count();
  const uint64_t cluster_bytes = chunk.cluster_bytes();
  for (size_t i = 0; i < n;) {
    ClusterState s = chunk.states[i];
    if (s == ClusterState::kSkip) {
      ++i;
      continue;
    }
    bool read = s == ClusterState::kData || s == ClusterState::kCompressed;
    // Detected-zero clusters were read and hold zeros; the buffer is as good
    // as the zero block, but unread zero/hole clusters hold stale bytes.
    size_t j = i + 1;
    while (j < n && chunk.states[j] != ClusterState::kSkip &&
           (chunk.states[j] == ClusterState::kData || chunk.states[j] == ClusterState::kCompressed) == read) {
      ++j;
    }
    uint64_t begin = i * cluster_bytes;
    uint64_t end = std::min<uint64_t>(j * cluster_bytes, chunk.length_bytes);
    if (read) {
      BARGE_RETURN_IF_ERROR(Update(chunk.WindowBytes(begin, end - begin)));
    } else {
      BARGE_RETURN_IF_ERROR(UpdateZeros(end - begin));
    }
    i = j;
  }
  return OkStatus();
}

Result<std::string> Sha512Stream::FinishHex() {
  if (!impl_->ok || impl_->finished) return Error::InvalidArgument("sha512: stream not usable");
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  impl_->finished = true;
  if (EVP_DigestFinal_ex(impl_->ctx, md, &len) != 1) return Error::IoError("sha512: EVP_DigestFinal_ex failed");
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(len * 2);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 0xf]);
  }
  return out;
}

}  // namespace barge::pipeline
