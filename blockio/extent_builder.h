// Extent and range lists built from pieces a server reports in order,
// holding at most one entry per granule whatever the pieces' sizes: a peer
// that answers block status in one-byte extents costs no more memory than
// one that answers in granules (issue 35).
#pragma once

#include <cstdint>
#include <optional>

#include "blockio/extent.h"

namespace barge {

// The granule NBD block status is gathered in: a cluster of the smallest
// size barge writes by default divides into it (64 KiB), and no real
// server's allocation is finer than a 4 KiB page.
inline constexpr uint64_t kExtentGranuleBytes = 4096;

// Builds an ExtentList from contiguous pieces given in order. Pieces are
// merged with neighbours of the same kind as they arrive, and every
// granule (an aligned `granule_bytes` block) that holds pieces of several
// kinds becomes one extent of the strongest kind among them (data over
// zero over hole): a reader then reads what may hold data, and a zero
// granule stays zero only if all of it reads as zeros. So the list holds
// at most one extent per granule of the range (plus the partial ones at
// its ends), however the pieces come. One thread at a time.
class ExtentBuilder {
 public:
  // `granule_bytes`: a power of two.
  explicit ExtentBuilder(uint64_t granule_bytes = kExtentGranuleBytes) : granule_(granule_bytes) {}

  // Adds [offset, offset + length) of `kind`. `offset` must be where the
  // previous piece ended (any offset for the first). Empty pieces are
  // ignored.
  void Add(uint64_t offset, uint64_t length, ExtentKind kind);
  // The extents so far, sorted, contiguous, merged; the builder is empty
  // afterwards.
  ExtentList Finish();
  // Extents held (for tests and bounds).
  size_t size() const { return out_.size() + (pending_ ? 1 : 0); }

 private:
  void Append(const Extent& e);
  uint64_t CellEnd(uint64_t offset) const { return (offset | (granule_ - 1)) + 1; }

  uint64_t granule_;
  ExtentList out_;
  // The part of the current granule seen so far, its kind the strongest.
  std::optional<Extent> pending_;
};

// Appends [offset, offset + length) to `ranges` (sorted, disjoint, each
// after the last), widened to whole granules of `granule_bytes` clipped
// to [lower, upper), merged with the last range when they touch. Dirty
// ranges gathered so hold at most one range per two granules.
void AppendGranularRange(RangeList& ranges, uint64_t offset, uint64_t length, uint64_t lower, uint64_t upper,
                         uint64_t granule_bytes = kExtentGranuleBytes);

}  // namespace barge
