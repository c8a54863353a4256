// ExtentBuilder and AppendGranularRange: bounded extent gathering.
#include "blockio/extent_builder.h"

#include <algorithm>

namespace barge {

namespace {

// data > zero > hole: the kind a granule holding both takes.
ExtentKind Strongest(ExtentKind a, ExtentKind b) {
  auto rank = [](ExtentKind k) { return k == ExtentKind::kData ? 2 : k == ExtentKind::kZero ? 1 : 0; };
  return rank(a) >= rank(b) ? a : b;
}

}  // namespace

void ExtentBuilder::Append(const Extent& e) {
  if (!out_.empty() && out_.back().kind == e.kind && out_.back().end() == e.offset) {
    out_.back().length += e.length;
  } else {
    out_.push_back(e);
  }
}

void ExtentBuilder::Add(uint64_t offset, uint64_t length, ExtentKind kind) {
  const uint64_t end = offset + length;
  while (offset < end) {
    const uint64_t cell_end = CellEnd(offset);
    if (pending_ || offset != cell_end - granule_ || end < cell_end) {
      // A part of a granule: joins what the granule holds so far, and the
      // granule goes to the list once it is whole.
      const uint64_t part_end = std::min(end, cell_end);
      if (!pending_) {
        pending_ = Extent{offset, part_end - offset, kind};
      } else {
        pending_->length = part_end - pending_->offset;
        pending_->kind = Strongest(pending_->kind, kind);
      }
      offset = part_end;
      if (offset == cell_end) {
        Append(*pending_);
        pending_.reset();
      }
      continue;
    }
    // Whole granules of one kind go in at once.
    const uint64_t whole_end = end & ~(granule_ - 1);
    Append({offset, whole_end - offset, kind});
    offset = whole_end;
  }
}

ExtentList ExtentBuilder::Finish() {
  if (pending_) Append(*pending_);
  pending_.reset();
  ExtentList out = std::move(out_);
  out_.clear();
  return out;
}

void AppendGranularRange(RangeList& ranges, uint64_t offset, uint64_t length, uint64_t lower, uint64_t upper,
                         uint64_t granule_bytes) {
  if (length == 0) return;
  const uint64_t start = std::max(lower, offset & ~(granule_bytes - 1));
  const uint64_t end = std::min(upper, ((offset + length - 1) | (granule_bytes - 1)) + 1);
  if (end <= start) return;
  if (!ranges.empty() && ranges.back().end() >= start) {
    ranges.back().length = std::max(ranges.back().end(), end) - ranges.back().offset;
  } else {
    ranges.push_back({start, end - start});
  }
}

}  // namespace barge
