// Extents: byte ranges of a disk with what they hold. Shared by every source,
// format and dirty-tracking provider.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace barge {

enum class ExtentKind : uint8_t {
  kData,  // may hold non-zero bytes: must be read
  kZero,  // reads as zeros and is allocated or explicitly zeroed
  kHole,  // not allocated; reads as zeros
};

std::string_view ExtentKindName(ExtentKind kind);

struct Extent {
  uint64_t offset = 0;
  uint64_t length = 0;
  ExtentKind kind = ExtentKind::kData;

  uint64_t end() const { return offset + length; }
  friend bool operator==(const Extent&, const Extent&) = default;
};

using ExtentList = std::vector<Extent>;

// Merges neighbours of the same kind. Input must be sorted and non-overlapping.
ExtentList MergeAdjacent(ExtentList extents);

// A plain byte range (used for dirty sets, which have no kind).
struct Range {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t end() const { return offset + length; }
  friend bool operator==(const Range&, const Range&) = default;
};

using RangeList = std::vector<Range>;

// Sorts, merges overlapping and touching ranges, drops empty ones.
RangeList NormalizeRanges(RangeList ranges);

// Widens every range to `granule` boundaries (a power of two), clips to
// `limit`, and normalizes. Used to turn a dirty set into whole clusters.
RangeList AlignRanges(const RangeList& ranges, uint64_t granule, uint64_t limit);

// Bytes of `a` that `b` does not cover (both normalized: sorted, disjoint).
RangeList SubtractRanges(const RangeList& a, const RangeList& b);
// The union of `a` and `b`, normalized.
RangeList UniteRanges(const RangeList& a, const RangeList& b);

// Total bytes of a normalized range list.
uint64_t TotalBytes(const RangeList& ranges);

}  // namespace barge
