// xxh3-128 cluster digests and the image digest fold.
#include "formats/digest.h"

#include <xxhash.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

namespace barge::formats {

std::string Digest128::ToHex() const {
  static const char* kHex = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[i] = kHex[(high >> (60 - 4 * i)) & 0xf];
    out[16 + i] = kHex[(low >> (60 - 4 * i)) & 0xf];
  }
  return out;
}

Result<Digest128> Digest128::FromHex(std::string_view hex) {
  if (hex.size() != 32) return Error::InvalidArgument("digest must be 32 hex digits");
  Digest128 d;
  for (int i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') v = c - 'A' + 10;
    else return Error::InvalidArgument("digest has a non-hex character");
    uint64_t& word = i < 16 ? d.high : d.low;
    word = (word << 4) | v;
  }
  return d;
}

Digest128 HashCluster(std::span<const std::byte> data, uint32_t cluster_bytes) {
  if (data.size() >= cluster_bytes) {
    XXH128_hash_t h = XXH3_128bits(data.data(), cluster_bytes);
    return {h.low64, h.high64};
  }
  // Short last cluster: hash as if zero padded, without copying it.
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  XXH3_128bits_update(st, data.data(), data.size());
  static const std::vector<std::byte> zeros(1 << 16);
  size_t left = cluster_bytes - data.size();
  while (left > 0) {
    size_t n = std::min(left, zeros.size());
    XXH3_128bits_update(st, zeros.data(), n);
    left -= n;
  }
  XXH128_hash_t h = XXH3_128bits_digest(st);
  XXH3_freeState(st);
  return {h.low64, h.high64};
}

Digest128 ZeroClusterDigest(uint32_t cluster_bytes) {
  static std::mutex mu;
  static std::map<uint32_t, Digest128> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(cluster_bytes);
  if (it != cache.end()) return it->second;
  Digest128 d = HashCluster({}, cluster_bytes);
  cache.emplace(cluster_bytes, d);
  return d;
}

std::string_view ImageDigestAlgorithmName(ImageDigestAlgorithm algorithm) {
  return algorithm == ImageDigestAlgorithm::kClusterFold ? "xxh3-128-cluster-fold" : "xxh3-128-zero-run-fold";
}

std::optional<ImageDigestAlgorithm> ImageDigestAlgorithmFromName(std::string_view name) {
  if (name == "xxh3-128-cluster-fold") return ImageDigestAlgorithm::kClusterFold;
  if (name == "xxh3-128-zero-run-fold") return ImageDigestAlgorithm::kZeroRunFold;
  return std::nullopt;
}

ImageDigestBuilder::ImageDigestBuilder() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

ImageDigestBuilder::ImageDigestBuilder(ImageDigestAlgorithm algorithm, uint32_t cluster_bytes)
    : ImageDigestBuilder() {
  algorithm_ = algorithm;
  if (algorithm_ == ImageDigestAlgorithm::kZeroRunFold) zero_ = ZeroClusterDigest(cluster_bytes);
}

ImageDigestBuilder::~ImageDigestBuilder() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

namespace {
void EncodeLe(const Digest128& d, std::byte* out) {
  for (int i = 0; i < 8; ++i) {
    out[i] = std::byte(d.low >> (8 * i));
    out[8 + i] = std::byte(d.high >> (8 * i));
  }
}
}  // namespace

void ImageDigestBuilder::FlushZeroRun() {
  if (zero_run_ == 0) return;
  std::byte buf[9];
  buf[0] = std::byte{0x00};
  for (int i = 0; i < 8; ++i) buf[1 + i] = std::byte(zero_run_ >> (8 * i));
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), buf, sizeof buf);
  zero_run_ = 0;
}

void ImageDigestBuilder::Add(const Digest128& cluster_digest) {
  if (algorithm_ == ImageDigestAlgorithm::kZeroRunFold) {
    if (cluster_digest == zero_) {
      ++zero_run_;
      return;
    }
    FlushZeroRun();
    std::byte buf[17];
    buf[0] = std::byte{0x01};
    EncodeLe(cluster_digest, buf + 1);
    XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), buf, sizeof buf);
    return;
  }
  std::byte buf[16];
  EncodeLe(cluster_digest, buf);
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), buf, sizeof buf);
}

void ImageDigestBuilder::AddRepeated(const Digest128& cluster_digest, uint64_t count) {
  if (algorithm_ == ImageDigestAlgorithm::kZeroRunFold) {
    if (cluster_digest == zero_) {
      zero_run_ += count;
    } else {
      for (uint64_t i = 0; i < count; ++i) Add(cluster_digest);
    }
    return;
  }
  // Batch copies so long zero runs cost one update per 4096 clusters.
  constexpr uint64_t kBatch = 4096;
  std::vector<std::byte> buf(16 * std::min(count, kBatch));
  for (uint64_t i = 0; i < buf.size() / 16; ++i) EncodeLe(cluster_digest, buf.data() + 16 * i);
  while (count > 0) {
    uint64_t n = std::min(count, kBatch);
    XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), buf.data(), 16 * n);
    count -= n;
  }
}

Digest128 ImageDigestBuilder::Finish() {
  FlushZeroRun();
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return {h.low64, h.high64};
}

}  // namespace barge::formats
