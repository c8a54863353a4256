// MemorySource and MemorySink.
#include "blockio/memory.h"

#include <algorithm>
#include <cstring>

namespace barge {

MemorySource::MemorySource(std::vector<std::byte> bytes, std::string name)
    : name_(std::move(name)), bytes_(std::move(bytes)) {}

MemorySource::MemorySource(std::vector<std::byte> bytes, ExtentList extents, std::string name)
    : name_(std::move(name)), bytes_(std::move(bytes)), extents_(std::move(extents)),
      has_extents_(true) {}

SourceCapabilities MemorySource::capabilities() const {
  SourceCapabilities caps;
  caps.has_extents = has_extents_;
  return caps;
}

Status MemorySource::ReadAt(uint64_t offset, std::span<std::byte> out) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  return OkStatus();
}

Result<ExtentList> MemorySource::Extents(uint64_t offset, uint64_t length) {
  if (!has_extents_) return BlockSource::Extents(offset, length);
  BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
  ExtentList out;
  uint64_t end = offset + length;
  for (const Extent& e : extents_) {
    uint64_t s = std::max(e.offset, offset);
    uint64_t t = std::min(e.end(), end);
    if (s < t) out.push_back({s, t - s, e.kind});
  }
  return out;
}

MemorySink::MemorySink(uint64_t initial_size, std::string name)
    : name_(std::move(name)), bytes_(initial_size), durable_(initial_size) {}

uint64_t MemorySink::size_bytes() const {
  std::lock_guard lock(mu_);
  return bytes_.size();
}

SinkCapabilities MemorySink::capabilities() const {
  SinkCapabilities caps;
  caps.can_zero = true;
  caps.can_trim = true;
  caps.zero_initialized = true;
  caps.can_grow = true;
  return caps;
}

void MemorySink::Log(SinkOp::Kind kind, uint64_t offset, uint64_t length) {
  ops_.push_back({kind, offset, length});
}

Status MemorySink::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  std::lock_guard lock(mu_);
  Log(SinkOp::Kind::kWrite, offset, data.size());
  if (offset + data.size() > bytes_.size()) bytes_.resize(offset + data.size());
  if (!data.empty()) std::memcpy(bytes_.data() + offset, data.data(), data.size());
  return OkStatus();
}

Status MemorySink::WriteZeroes(uint64_t offset, uint64_t length) {
  std::lock_guard lock(mu_);
  Log(SinkOp::Kind::kZero, offset, length);
  if (offset + length > bytes_.size()) bytes_.resize(offset + length);
  std::fill_n(bytes_.begin() + offset, length, std::byte{0});
  return OkStatus();
}

Status MemorySink::Trim(uint64_t offset, uint64_t length) {
  std::lock_guard lock(mu_);
  Log(SinkOp::Kind::kTrim, offset, length);
  uint64_t end = std::min<uint64_t>(offset + length, bytes_.size());
  if (offset < end) std::fill(bytes_.begin() + offset, bytes_.begin() + end, std::byte{0});
  return OkStatus();
}

Status MemorySink::Flush() {
  std::lock_guard lock(mu_);
  Log(SinkOp::Kind::kFlush, 0, 0);
  durable_ = bytes_;
  return OkStatus();
}

Status MemorySink::Truncate(uint64_t size_bytes) {
  std::lock_guard lock(mu_);
  Log(SinkOp::Kind::kTruncate, size_bytes, 0);
  bytes_.resize(size_bytes);
  return OkStatus();
}

std::vector<std::byte> MemorySink::contents() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::vector<SinkOp> MemorySink::ops() const {
  std::lock_guard lock(mu_);
  return ops_;
}

void MemorySink::SimulateCrash() {
  std::lock_guard lock(mu_);
  bytes_ = durable_;
}

std::unique_ptr<MemorySource> MemorySink::ToSource() const {
  return std::make_unique<MemorySource>(contents(), name_);
}

}  // namespace barge
