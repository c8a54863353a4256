// Fault injection for tests: wrappers around any BlockSource or BlockSink
// that forward every call and fail or slow down the ones a rule picks, after
// nbdkit's error filter and rocksdb's FaultInjectionTestFS.
//
// Power loss (forgetting writes since the last flush) is not simulated here:
// use MemorySink::SimulateCrash (blockio/memory.h) as the target.
#pragma once

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

// The operation kinds a rule can target.
enum class FaultOp : uint8_t {
  kRead,      // ReadAt, and each request of ReadMany
  kWrite,     // WriteAt
  kZero,      // WriteZeroes
  kTrim,      // Trim
  kFlush,     // Flush
  kTruncate,  // Truncate
  kExtents,   // Extents
};
inline constexpr size_t kFaultOpCount = 7;

// One way to fail calls of one kind. Triggers combine with AND: a rule with
// both `nth_call` and `range` fails only the counted call if it also touches
// the range. A rule with neither fails every call of its kind.
struct FaultRule {
  FaultOp op = FaultOp::kRead;
  // The errno of the injected Error (EIO -> kIoError, ENOSPC -> kNoSpace...).
  int error_errno = EIO;
  // Fail the Nth call of `op` (1-based, counted per wrapper, failed calls
  // included). 0: not triggered by count.
  uint64_t nth_call = 0;
  // With nth_call: also fail every later call.
  bool and_after = false;
  // Fail calls whose [offset, offset+length) overlaps this range. Flush has
  // no range and never matches; Truncate matches when its new size lies
  // inside the range.
  std::optional<Range> range;

  // Shorthands for the common rules.
  static FaultRule Always(FaultOp op, int err = EIO) { return Make(op, err, 0, false, {}); }
  static FaultRule Nth(FaultOp op, uint64_t n, int err = EIO) { return Make(op, err, n, false, {}); }
  static FaultRule NthAndAfter(FaultOp op, uint64_t n, int err = EIO) {
    return Make(op, err, n, true, {});
  }
  static FaultRule InRange(FaultOp op, uint64_t offset, uint64_t length, int err = EIO) {
    return Make(op, err, 0, false, Range{offset, length});
  }

 private:
  static FaultRule Make(FaultOp op, int err, uint64_t n, bool after, std::optional<Range> r) {
    FaultRule rule;
    rule.op = op;
    rule.error_errno = err;
    rule.nth_call = n;
    rule.and_after = after;
    rule.range = r;
    return rule;
  }
};

// Rules, delays and call counters shared by one wrapper. Thread-safe.
class FaultInjector {
 public:
  void AddRule(const FaultRule& rule);
  void ClearRules();
  // Sleeps this long at the start of every call of `op` (a slow disk or
  // peer). Zero turns it off.
  void SetDelay(FaultOp op, std::chrono::microseconds delay);
  // Calls of `op` seen so far, failed ones included.
  uint64_t calls(FaultOp op) const;

  // Counts the call, sleeps for the delay, then returns the injected error
  // when a rule matches. `has_range` false for calls without one (Flush).
  Status OnCall(FaultOp op, bool has_range, uint64_t offset, uint64_t length,
                const std::string& name);

 private:
  mutable std::mutex mu_;
  std::vector<FaultRule> rules_;                                 // guarded by mu_
  std::array<std::chrono::microseconds, kFaultOpCount> delay_{};  // guarded by mu_
  std::array<uint64_t, kFaultOpCount> calls_{};                  // guarded by mu_
};

// Forwards to `target` and injects faults on the way in. Either owns the
// target or borrows it (the borrowed target must outlive the wrapper).
// Thread safety: as the target's; the injector itself is thread-safe.
class FaultSource final : public BlockSource {
 public:
  explicit FaultSource(std::unique_ptr<BlockSource> target);
  explicit FaultSource(BlockSource& target);

  FaultInjector& faults() { return faults_; }
  BlockSource& target() { return target_; }

  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  SourceCapabilities capabilities() const override { return target_.capabilities(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  // Each request is one kRead call; the ones no rule fails go to the
  // target's ReadMany together, so batching is preserved.
  Status ReadMany(std::span<ReadRequest> requests) override;
  // A hint: passed on, never failed.
  void WillNeed(uint64_t offset, uint64_t length) override { target_.WillNeed(offset, length); }
  void DontNeed(uint64_t offset, uint64_t length) override { target_.DontNeed(offset, length); }
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override;

 private:
  std::unique_ptr<BlockSource> owned_;
  BlockSource& target_;
  FaultInjector faults_;
};

// Sink counterpart of FaultSource; same ownership and thread rules.
class FaultSink final : public BlockSink {
 public:
  explicit FaultSink(std::unique_ptr<BlockSink> target);
  explicit FaultSink(BlockSink& target);

  FaultInjector& faults() { return faults_; }
  BlockSink& target() { return target_; }

  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  SinkCapabilities capabilities() const override { return target_.capabilities(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  Status WriteZeroes(uint64_t offset, uint64_t length) override;
  Status Trim(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Status Truncate(uint64_t size_bytes) override;

 private:
  std::unique_ptr<BlockSink> owned_;
  BlockSink& target_;
  FaultInjector faults_;
};

std::string_view FaultOpName(FaultOp op);

}  // namespace barge
