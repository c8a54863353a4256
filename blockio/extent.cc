// Extent and range list helpers.
#include "blockio/extent.h"

#include <algorithm>

namespace barge {

std::string_view ExtentKindName(ExtentKind kind) {
  switch (kind) {
    case ExtentKind::kData: return "data";
    case ExtentKind::kZero: return "zero";
    case ExtentKind::kHole: return "hole";
  }
  return "unknown";
}

ExtentList MergeAdjacent(ExtentList extents) {
  ExtentList out;
  out.reserve(extents.size());
  for (const Extent& e : extents) {
    if (e.length == 0) continue;
    if (!out.empty() && out.back().kind == e.kind && out.back().end() == e.offset) {
      out.back().length += e.length;
    } else {
      out.push_back(e);
    }
  }
  return out;
}

RangeList NormalizeRanges(RangeList ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.offset < b.offset; });
  RangeList out;
  for (const Range& r : ranges) {
    if (r.length == 0) continue;
    if (!out.empty() && r.offset <= out.back().end()) {
      out.back().length = std::max(out.back().end(), r.end()) - out.back().offset;
    } else {
      out.push_back(r);
    }
  }
  return out;
}

RangeList AlignRanges(const RangeList& ranges, uint64_t granule, uint64_t limit) {
  RangeList out;
  out.reserve(ranges.size());
  for (const Range& r : ranges) {
    if (r.length == 0 || r.offset >= limit) continue;
    uint64_t start = r.offset & ~(granule - 1);
    uint64_t end = std::min(r.end(), limit);
    uint64_t aligned_end = std::min((end + granule - 1) & ~(granule - 1), limit);
    out.push_back({start, aligned_end - start});
  }
  return NormalizeRanges(std::move(out));
}

RangeList SubtractRanges(const RangeList& a, const RangeList& b) {
  RangeList out;
  size_t j = 0;
  for (const Range& r : a) {
    uint64_t pos = r.offset;
    while (j < b.size() && b[j].end() <= pos) ++j;
    size_t k = j;
    while (pos < r.end()) {
      if (k == b.size() || b[k].offset >= r.end()) {
        out.push_back({pos, r.end() - pos});
        break;
      }
      if (b[k].offset > pos) out.push_back({pos, b[k].offset - pos});
      pos = std::max(pos, b[k].end());
      ++k;
    }
  }
  return out;
}

RangeList UniteRanges(const RangeList& a, const RangeList& b) {
  RangeList all = a;
  all.insert(all.end(), b.begin(), b.end());
  return NormalizeRanges(std::move(all));
}

uint64_t TotalBytes(const RangeList& ranges) {
  uint64_t total = 0;
  for (const Range& r : ranges) total += r.length;
  return total;
}

}  // namespace barge
