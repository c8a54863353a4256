// EncryptingSink and DecryptingSource (docs/formats/encryption.md).
#include "blockio/aead_stream.h"

#include <algorithm>
#include <cstring>

namespace barge {

// ---- EncryptingSink ----

Result<std::unique_ptr<EncryptingSink>> EncryptingSink::Create(BlockSink& target, const EncryptionKey& key,
                                                               std::string identity,
                                                               EncryptingSinkOptions options) {
  const uint32_t seg = options.segment_bytes;
  if ((seg & (seg - 1)) != 0 || seg < kAeadMinSegmentBytes || seg > kAeadMaxSegmentBytes) {
    return Error::InvalidArgument("encryption segment size " + std::to_string(seg) +
                                  " is not a power of two in 4 KiB..16 MiB");
  }
  AeadHeader header;
  header.segment_bytes = seg;
  auto object_key = AeadObjectKey::Create(key, std::move(identity), header);
  if (!object_key.ok()) return std::move(object_key).error().set_path(target.name());
  const uint64_t front = (options.rewritable_front_bytes + seg - 1) / seg;
  return std::unique_ptr<EncryptingSink>(
      new EncryptingSink(target, std::move(header), std::move(object_key).value(), front));
}

EncryptingSink::EncryptingSink(BlockSink& target, AeadHeader header, std::unique_ptr<AeadObjectKey> key,
                               uint64_t front_segments)
    : target_(target),
      header_(std::move(header)),
      layout_{header_.segment_bytes},
      key_(std::move(key)),
      front_segments_(front_segments),
      next_seal_(front_segments) {}

uint64_t EncryptingSink::size_bytes() const {
  std::lock_guard lock(mu_);
  return size_;
}

SinkCapabilities EncryptingSink::capabilities() const {
  SinkCapabilities caps;
  caps.preferred_request_bytes = std::max<uint32_t>(header_.segment_bytes, 256 * 1024);
  caps.zero_initialized = true;  // a segment's unwritten bytes are sealed as zeros
  caps.can_grow = true;
  return caps;
}

Status EncryptingSink::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  if (data.empty()) return OkStatus();
  const uint64_t seg = header_.segment_bytes;
  const uint64_t first = offset / seg, last = (offset + data.size() - 1) / seg;
  std::lock_guard lock(mu_);
  // Refuse before changing anything: no segment touched may be sealed past the front.
  const uint64_t sealed = std::max(first, front_segments_);
  if (sealed <= last && sealed < next_seal_) {
    return Error::NotSupported("encrypted object: segment " + std::to_string(sealed) + " (plaintext offset " +
                               std::to_string(sealed * seg) +
                               ") is already encrypted and written; only the first " +
                               std::to_string(front_segments_ * seg) + " bytes may be written again")
        .set_path(target_.name())
        .set_range(offset, data.size());
  }
  for (uint64_t index = first; index <= last; ++index) {
    std::vector<std::byte>& plain = open_[index];
    if (plain.empty()) {
      // A buffer of a segment sealed before, when there is one: fresh
      // memory costs page faults that take longer than the cipher.
      if (!spare_.empty()) {
        plain.swap(spare_);
        std::memset(plain.data(), 0, plain.size());
      } else {
        plain.resize(seg);
      }
    }
    const uint64_t from = std::max(offset, index * seg), to = std::min(offset + data.size(), (index + 1) * seg);
    std::memcpy(plain.data() + (from - index * seg), data.data() + (from - offset), to - from);
  }
  size_ = std::max(size_, offset + data.size());
  return SealCompleted();
}

Status EncryptingSink::SealCompleted() {
  // Every segment before the one holding the last byte; that one may turn
  // out to be the final segment, sealed as such only at Flush.
  const uint64_t below = size_ == 0 ? 0 : (size_ - 1) / header_.segment_bytes;
  for (; next_seal_ < below; ++next_seal_) {
    BARGE_RETURN_IF_ERROR(SealOut(next_seal_, false, size_));
    if (auto it = open_.find(next_seal_); it != open_.end()) {
      spare_.swap(it->second);
      open_.erase(it);
    }
  }
  return OkStatus();
}

Status EncryptingSink::SealOut(uint64_t index, bool final, uint64_t plaintext_bytes) {
  const uint32_t n = layout_.SegmentPlainBytes(index, plaintext_bytes);
  auto it = open_.find(index);
  if (it == open_.end()) {  // never written: zeros, in the spare buffer
    spare_.resize(header_.segment_bytes);
    std::memset(spare_.data(), 0, n);
  }
  const std::span<const std::byte> plain = std::span<const std::byte>(it != open_.end() ? it->second : spare_).first(n);
  sealed_.resize(n + kAeadSegmentOverhead);
  BARGE_RETURN_IF_ERROR(key_->Seal(index, final, plain, sealed_));
  Status st = target_.WriteAt(layout_.SegmentOffset(index), sealed_);
  if (!st.ok()) return std::move(st).error().Wrap("encrypted object: writing segment " + std::to_string(index));
  return OkStatus();
}

Status EncryptingSink::Flush() {
  std::lock_guard lock(mu_);
  const uint64_t count = layout_.SegmentCount(size_);
  for (uint64_t index = 0; index < count; ++index) {
    if (index >= front_segments_ && index < next_seal_) continue;  // sealed for good
    BARGE_RETURN_IF_ERROR(SealOut(index, index + 1 == count, size_));
  }
  header_.plaintext_bytes = size_;
  const auto header = EncodeAeadHeader(header_);
  Status st = target_.WriteAt(0, header);
  if (!st.ok()) return std::move(st).error().Wrap("encrypted object: writing the header");
  return target_.Flush();
}

// ---- DecryptingSource ----

Result<std::unique_ptr<DecryptingSource>> DecryptingSource::Open(std::unique_ptr<BlockSource> object,
                                                                 const EncryptionKey& key, std::string identity) {
  const std::string name = object->name();
  auto named = [&](Error e) { return e.set_path(name); };
  std::array<std::byte, kAeadHeaderBytes> bytes{};
  if (object->size_bytes() < kAeadHeaderBytes) return named(Error::Corruption("not a barge encrypted object"));
  BARGE_RETURN_IF_ERROR(object->ReadAt(0, bytes));
  auto header = ParseAeadHeader(bytes);
  if (!header.ok()) return named(std::move(header).error());
  auto object_key = AeadObjectKey::Open(key, std::move(identity), *header);
  if (!object_key.ok()) return named(std::move(object_key).error());
  const AeadLayout layout{header->segment_bytes};
  auto plain_bytes = layout.PlaintextBytes(object->size_bytes());
  if (!plain_bytes.ok()) return named(std::move(plain_bytes).error());
  if (*plain_bytes != header->plaintext_bytes) {
    return named(Error::Corruption("the header names " + std::to_string(header->plaintext_bytes) +
                                   " plaintext bytes but the object holds " + std::to_string(*plain_bytes) +
                                   ": truncated or extended"));
  }
  std::unique_ptr<DecryptingSource> source(
      new DecryptingSource(std::move(object), std::move(header).value(), std::move(object_key).value()));
  // The final segment's tag says it is the last one: a cut or grown
  // object fails here even if its header was edited to match.
  const uint64_t last = layout.SegmentCount(source->header_.plaintext_bytes) - 1;
  const uint32_t n = layout.SegmentPlainBytes(last, source->header_.plaintext_bytes);
  std::vector<std::byte> sealed(n + kAeadSegmentOverhead), plain(n);
  BARGE_RETURN_IF_ERROR(source->object_->ReadAt(layout.SegmentOffset(last), sealed));
  BARGE_RETURN_IF_ERROR(source->OpenSegment(last, sealed, plain));
  return source;
}

DecryptingSource::DecryptingSource(std::unique_ptr<BlockSource> object, AeadHeader header,
                                   std::unique_ptr<AeadObjectKey> key)
    : object_(std::move(object)), header_(std::move(header)), layout_{header_.segment_bytes}, key_(std::move(key)) {}

SourceCapabilities DecryptingSource::capabilities() const {
  const SourceCapabilities inner = object_->capabilities();
  SourceCapabilities caps;
  caps.preferred_request_bytes = std::max<uint32_t>(header_.segment_bytes, inner.preferred_request_bytes);
  caps.parallel_reads = inner.parallel_reads;
  caps.blocking_read_streams = inner.blocking_read_streams;
  return caps;
}

Status DecryptingSource::OpenSegment(uint64_t index, std::span<const std::byte> sealed,
                                     std::span<std::byte> plain) const {
  const uint64_t count = layout_.SegmentCount(header_.plaintext_bytes);
  if (key_->Open(index, index + 1 == count, sealed, plain).ok()) return OkStatus();
  return Error::Corruption("segment " + std::to_string(index) + " at plaintext offset " +
                           std::to_string(index * header_.segment_bytes) +
                           " fails authentication: the object was tampered with, cut, or its segments moved")
      .set_path(name())
      .set_range(index * header_.segment_bytes, plain.size());
}

Status DecryptingSource::ReadAt(uint64_t offset, std::span<std::byte> out) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  if (out.empty()) return OkStatus();
  const uint64_t seg = header_.segment_bytes, size = header_.plaintext_bytes;
  uint64_t first = offset / seg;
  {
    std::lock_guard lock(cache_mu_);
    if (cached_index_ == first) {
      const uint64_t n = std::min<uint64_t>(out.size(), std::min(size, (first + 1) * seg) - offset);
      std::memcpy(out.data(), cached_.data() + (offset - first * seg), n);
      if (n == out.size()) return OkStatus();
      offset += n;
      out = out.subspan(n);
      ++first;
    }
  }
  const uint64_t last = (offset + out.size() - 1) / seg;
  // The covering segments lie side by side in the object: one read.
  const uint64_t begin = layout_.SegmentOffset(first);
  const uint64_t end = layout_.SegmentOffset(last) + layout_.SegmentPlainBytes(last, size) + kAeadSegmentOverhead;
  // Per-thread scratch kept between calls, up to 4 MiB: fresh memory for
  // each read costs page faults that take longer than the cipher.
  constexpr uint64_t kMaxScratch = 4 << 20;
  thread_local std::vector<std::byte> scratch, plain;
  std::vector<std::byte> large;
  std::vector<std::byte>& buffer = end - begin <= kMaxScratch ? scratch : large;
  if (buffer.size() < end - begin) buffer.resize(end - begin);
  const std::span<std::byte> sealed = std::span(buffer).first(end - begin);
  BARGE_RETURN_IF_ERROR(object_->ReadAt(begin, sealed));
  for (uint64_t index = first; index <= last; ++index) {
    const uint32_t n = layout_.SegmentPlainBytes(index, size);
    const auto in = std::span<const std::byte>(sealed).subspan(layout_.SegmentOffset(index) - begin,
                                                               n + kAeadSegmentOverhead);
    const uint64_t from = std::max(offset, index * seg), to = std::min(offset + out.size(), index * seg + n);
    std::span<std::byte> dest = out.subspan(from - offset, to - from);
    if (dest.size() == n) {  // the whole segment is wanted: open it in place
      BARGE_RETURN_IF_ERROR(OpenSegment(index, in, dest));
      continue;
    }
    if (plain.size() < n) plain.resize(n);
    BARGE_RETURN_IF_ERROR(OpenSegment(index, in, std::span(plain).first(n)));
    std::memcpy(dest.data(), plain.data() + (from - index * seg), dest.size());
    if (index == last) {
      std::lock_guard lock(cache_mu_);
      cached_.assign(plain.begin(), plain.begin() + n);
      cached_index_ = index;
    }
  }
  return OkStatus();
}

}  // namespace barge
