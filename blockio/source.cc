// Default implementations of BlockSource's optional operations.
#include "blockio/source.h"

namespace barge {

Status BlockSource::ReadMany(std::span<ReadRequest> requests) {
  Status first;
  for (ReadRequest& r : requests) {
    r.status = ReadAt(r.offset, r.buffer);
    if (!r.status.ok() && first.ok()) first = r.status;
  }
  return first;
}

Result<ExtentList> BlockSource::Extents(uint64_t offset, uint64_t length) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
  if (length == 0) return ExtentList{};
  return ExtentList{{offset, length, ExtentKind::kData}};
}

Status BlockSource::CheckRange(uint64_t offset, uint64_t length) const {
  uint64_t size = size_bytes();
  if (offset > size || length > size - offset) {
    return Error::InvalidArgument("range beyond end of source (size " + std::to_string(size) + ")")
        .set_path(name())
        .set_range(offset, length);
  }
  return OkStatus();
}

}  // namespace barge
