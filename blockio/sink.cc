// Default implementations of BlockSink's optional operations.
#include "blockio/sink.h"

#include <algorithm>
#include <vector>

namespace barge {

Status BlockSink::WriteZeroes(uint64_t offset, uint64_t length) {
  // Fallback: stream one reusable zero buffer.
  constexpr uint64_t kChunk = 1 << 20;
  static const std::vector<std::byte> zeros(kChunk);
  while (length > 0) {
    uint64_t n = std::min(length, kChunk);
    BARGE_RETURN_IF_ERROR(WriteAt(offset, std::span(zeros.data(), n)));
    offset += n;
    length -= n;
  }
  return OkStatus();
}

Status BlockSink::Trim(uint64_t offset, uint64_t length) {
  return Error::NotSupported("trim not supported").set_path(name()).set_range(offset, length);
}

Status BlockSink::Truncate(uint64_t size_bytes) {
  return Error::NotSupported("truncate not supported").set_path(name()).set_offset(size_bytes);
}

}  // namespace barge
