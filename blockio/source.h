// BlockSource: the read side of every disk barge moves data from (files,
// block devices, NBD exports, images seen through a format).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/extent.h"

namespace barge {

struct SourceCapabilities {
  // Offsets and lengths of ReadAt must be multiples of this, except a read
  // that ends exactly at size_bytes().
  uint32_t alignment_bytes = 1;
  // Request size that this backend serves best (nbdcopy's ~256 KiB for NBD).
  uint32_t preferred_request_bytes = 256 * 1024;
  // Extents() reports real allocation (holes/zeroes) rather than "all data".
  bool has_extents = false;
  // Concurrent ReadAt calls proceed in parallel (several rings/connections).
  bool parallel_reads = true;
  // Reads that wait on a peer rather than on a core, each on its own
  // stream (an NBD export's connections over a network): a copy with the
  // default worker count keeps this many reads blocked at once besides the
  // cores' work. 1 for local files and devices.
  uint32_t blocking_read_streams = 1;
};

// One read of a batch. `status` is filled in by ReadMany.
struct ReadRequest {
  uint64_t offset = 0;
  std::span<std::byte> buffer;
  Status status;
};

// Thread safety: every method may be called from several threads at once.
class BlockSource {
 public:
  BlockSource() = default;
  virtual ~BlockSource() = default;
  BlockSource(const BlockSource&) = delete;
  BlockSource& operator=(const BlockSource&) = delete;

  // Path, device or URI, for messages.
  virtual const std::string& name() const = 0;
  // Logical size in bytes. Fixed for the life of the object.
  virtual uint64_t size_bytes() const = 0;
  virtual SourceCapabilities capabilities() const { return {}; }

  // Reads exactly out.size() bytes at `offset`. The range must lie inside
  // [0, size_bytes()): otherwise kInvalidArgument. Short reads and EINTR are
  // retried inside; an unexpected end of file is kIoError. May block.
  virtual Status ReadAt(uint64_t offset, std::span<std::byte> out) = 0;

  // Reads every request; returns the first failure (each request's own status
  // says which failed). The default issues ReadAt one by one; io_uring
  // backends submit the whole batch at once.
  virtual Status ReadMany(std::span<ReadRequest> requests);

  // A hint that [offset, offset + length) will be read soon: a file starts
  // reading it into the page cache and returns without waiting. Never
  // fails; the default does nothing.
  virtual void WillNeed(uint64_t /*offset*/, uint64_t /*length*/) {}

  // A hint that [offset, offset + length) will not be read again soon: a
  // file writes back and drops its cached pages, so the next read comes
  // from the disk (bench --cold). Never fails; the default does nothing.
  virtual void DontNeed(uint64_t /*offset*/, uint64_t /*length*/) {}

  // Extents covering exactly [offset, offset + length), sorted, contiguous.
  // May return coarser answers (kData where unsure) but never claims
  // kZero/kHole for bytes that are not zero. The default says "all data".
  virtual Result<ExtentList> Extents(uint64_t offset, uint64_t length);

 protected:
  // kInvalidArgument unless [offset, offset+length) is inside the source.
  Status CheckRange(uint64_t offset, uint64_t length) const;
};

// Read-ahead for a forward pass over a source whose reads have gaps (skipped
// holes, clusters a newer layer replaced), which the kernel's own read-ahead
// takes for random reads: hints the next `ahead_bytes` once a read comes
// within half of that of what was hinted. A read far past the mark (a
// reader jumping about) only moves it. Thread-safe.
class ReadAheadMark {
 public:
  explicit ReadAheadMark(uint64_t ahead_bytes = 8 << 20) : ahead_bytes_(ahead_bytes) {}
  // Call before a read of `source` that ends at `end`.
  void Before(BlockSource& source, uint64_t end);

 private:
  const uint64_t ahead_bytes_;
  std::atomic<uint64_t> until_{0};  // hinted up to here
};

// ReadMany through a gate (fault-injecting wrappers): each request is
// first `admit`ted; a refused one gets the refusal as its status, the
// admitted ones reach `target.ReadMany` together (batching kept). Returns
// the first failure, refusals first.
Status ReadManyAdmitted(BlockSource& target, std::span<ReadRequest> requests,
                        const std::function<Status(const ReadRequest&)>& admit);

}  // namespace barge
