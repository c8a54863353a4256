// BlockSink: the write side (files, block devices, NBD exports). Formats
// write their images through it as a byte-addressed target.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "blockio/error.h"

namespace barge {

struct SinkCapabilities {
  // Offsets and lengths of writes must be multiples of this.
  uint32_t alignment_bytes = 1;
  uint32_t preferred_request_bytes = 256 * 1024;
  // WriteZeroes is efficient (fallocate/BLKZEROOUT/NBD_CMD_WRITE_ZEROES)
  // rather than the default loop of zero buffers.
  bool can_zero = false;
  // Trim (discard) is supported.
  bool can_trim = false;
  // Bytes never written read as zeros (a new or truncated file, a fresh
  // memory sink), so zero ranges may be skipped entirely.
  bool zero_initialized = false;
  // Writes past size_bytes() extend the sink (regular files, memory).
  bool can_grow = false;
};

// Thread safety: WriteAt/WriteZeroes/Trim on disjoint ranges may run
// concurrently; Flush and Truncate must not overlap other calls.
class BlockSink {
 public:
  BlockSink() = default;
  virtual ~BlockSink() = default;
  BlockSink(const BlockSink&) = delete;
  BlockSink& operator=(const BlockSink&) = delete;

  virtual const std::string& name() const = 0;
  // Current size in bytes (grows with writes where can_grow).
  virtual uint64_t size_bytes() const = 0;
  virtual SinkCapabilities capabilities() const { return {}; }

  // Writes all of `data` at `offset`; short writes are retried inside.
  // ENOSPC is kNoSpace. May block.
  virtual Status WriteAt(uint64_t offset, std::span<const std::byte> data) = 0;

  // Makes [offset, offset+length) read as zeros. The default writes zero
  // buffers; backends with can_zero override it.
  virtual Status WriteZeroes(uint64_t offset, uint64_t length);

  // Discards the range (contents afterwards unspecified unless the backend
  // says it reads zeros). Default: kNotSupported.
  virtual Status Trim(uint64_t offset, uint64_t length);

  // Everything written so far is durable once this returns ok.
  virtual Status Flush() = 0;

  // Sets the size (files and memory). Default: kNotSupported.
  virtual Status Truncate(uint64_t size_bytes);
};

// Writes `data` at `offset` but leaves every all-zero block unwritten, as
// qemu-img convert does: blocks are `block_bytes` long and aligned to
// multiples of it in the sink (the first and last may be partial), and
// the non-zero blocks between two zero ones go out as one WriteAt. Only
// for a sink whose unwritten bytes read as zeros (zero_initialized) and
// whose range was never written: a skipped block is not zeroed. The test
// stops at the first non-zero byte, so real data costs a few bytes per
// block. Returns the first failed WriteAt's error. May block.
Status WriteSkippingZeroBlocks(BlockSink& sink, uint64_t offset, std::span<const std::byte> data,
                               uint64_t block_bytes = 4096);

}  // namespace barge
