// Default implementations of BlockSource's optional operations.
#include "blockio/source.h"

#include <algorithm>

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

void ReadAheadMark::Before(BlockSource& source, uint64_t end) {
  uint64_t until = until_.load(std::memory_order_relaxed);
  if (end + ahead_bytes_ / 2 <= until) return;
  const bool onward = until == 0 || end <= until + ahead_bytes_;
  const uint64_t next = onward ? end + ahead_bytes_ : end;
  // One thread of several racing past the same mark hints; the others go on.
  if (!until_.compare_exchange_strong(until, next, std::memory_order_relaxed)) return;
  const uint64_t from = std::max(until, end);
  if (onward) source.WillNeed(from, next - from);
}

Status ReadManyAdmitted(BlockSource& target, std::span<ReadRequest> requests,
                        const std::function<Status(const ReadRequest&)>& admit) {
  std::vector<ReadRequest> pass;
  std::vector<size_t> pass_index;
  Status first;
  for (size_t i = 0; i < requests.size(); ++i) {
    ReadRequest& r = requests[i];
    r.status = admit(r);
    if (r.status.ok()) {
      pass.push_back({r.offset, r.buffer, {}});
      pass_index.push_back(i);
    } else if (first.ok()) {
      first = r.status;
    }
  }
  if (!pass.empty()) {
    Status s = target.ReadMany(pass);
    for (size_t j = 0; j < pass.size(); ++j) requests[pass_index[j]].status = pass[j].status;
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace barge
