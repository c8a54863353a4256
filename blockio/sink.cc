// Default implementations of BlockSink's optional operations.
#include "blockio/sink.h"

#include <algorithm>
#include <vector>

#include "blockio/buffer.h"

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

Status WriteSkippingZeroBlocks(BlockSink& sink, uint64_t offset, std::span<const std::byte> data,
                               uint64_t block_bytes) {
  uint64_t run = 0, pos = 0;  // run: start of the pending non-zero blocks
  auto flush = [&](uint64_t upto) -> Status {
    if (upto > run) BARGE_RETURN_IF_ERROR(sink.WriteAt(offset + run, data.subspan(run, upto - run)));
    return OkStatus();
  };
  while (pos < data.size()) {
    const uint64_t n = std::min<uint64_t>(block_bytes - (offset + pos) % block_bytes, data.size() - pos);
    if (IsAllZero(data.subspan(pos, n))) {
      BARGE_RETURN_IF_ERROR(flush(pos));
      run = pos + n;
    }
    pos += n;
  }
  return flush(data.size());
}

}  // namespace barge
