// FaultInjector and the FaultSource/FaultSink wrappers.
#include "blockio/fault.h"

#include <algorithm>
#include <thread>

namespace barge {

std::string_view FaultOpName(FaultOp op) {
  switch (op) {
    case FaultOp::kRead: return "read";
    case FaultOp::kWrite: return "write";
    case FaultOp::kZero: return "zero";
    case FaultOp::kTrim: return "trim";
    case FaultOp::kFlush: return "flush";
    case FaultOp::kTruncate: return "truncate";
    case FaultOp::kExtents: return "extents";
  }
  return "unknown";
}

void FaultInjector::AddRule(const FaultRule& rule) {
  std::lock_guard lock(mu_);
  rules_.push_back(rule);
}

void FaultInjector::ClearRules() {
  std::lock_guard lock(mu_);
  rules_.clear();
}

void FaultInjector::SetDelay(FaultOp op, std::chrono::microseconds delay) {
  std::lock_guard lock(mu_);
  delay_[static_cast<size_t>(op)] = delay;
}

uint64_t FaultInjector::calls(FaultOp op) const {
  std::lock_guard lock(mu_);
  return calls_[static_cast<size_t>(op)];
}

Status FaultInjector::OnCall(FaultOp op, bool has_range, uint64_t offset, uint64_t length,
                             const std::string& name) {
  std::chrono::microseconds delay;
  int fail_errno = 0;
  {
    std::lock_guard lock(mu_);
    size_t i = static_cast<size_t>(op);
    uint64_t n = ++calls_[i];
    delay = delay_[i];
    for (const FaultRule& rule : rules_) {
      if (rule.op != op) continue;
      if (rule.nth_call != 0) {
        bool hit = rule.and_after ? n >= rule.nth_call : n == rule.nth_call;
        if (!hit) continue;
      }
      if (rule.range) {
        if (!has_range) continue;
        // A zero-length call (a truncate to a size) touches its offset only.
        uint64_t end = offset + std::max<uint64_t>(length, 1);
        if (offset >= rule.range->end() || end <= rule.range->offset) continue;
      }
      fail_errno = rule.error_errno;
      break;
    }
  }
  // Sleep outside the lock so that a slow call does not stall other threads.
  if (delay.count() > 0) std::this_thread::sleep_for(delay);
  if (fail_errno == 0) return OkStatus();
  std::string operation = "injected " + std::string(FaultOpName(op));
  if (!has_range) return Error::FromErrno(fail_errno, operation, name);
  return Error::FromErrno(fail_errno, operation, name, offset, length);
}

FaultSource::FaultSource(std::unique_ptr<BlockSource> target)
    : owned_(std::move(target)), target_(*owned_) {}

FaultSource::FaultSource(BlockSource& target) : target_(target) {}

Status FaultSource::ReadAt(uint64_t offset, std::span<std::byte> out) {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kRead, true, offset, out.size(), name()));
  return target_.ReadAt(offset, out);
}

Status FaultSource::ReadMany(std::span<ReadRequest> requests) {
  return ReadManyAdmitted(target_, requests, [this](const ReadRequest& r) {
    return faults_.OnCall(FaultOp::kRead, true, r.offset, r.buffer.size(), name());
  });
}

Result<ExtentList> FaultSource::Extents(uint64_t offset, uint64_t length) {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kExtents, true, offset, length, name()));
  return target_.Extents(offset, length);
}

FaultSink::FaultSink(std::unique_ptr<BlockSink> target)
    : owned_(std::move(target)), target_(*owned_) {}

FaultSink::FaultSink(BlockSink& target) : target_(target) {}

Status FaultSink::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kWrite, true, offset, data.size(), name()));
  return target_.WriteAt(offset, data);
}

Status FaultSink::WriteZeroes(uint64_t offset, uint64_t length) {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kZero, true, offset, length, name()));
  return target_.WriteZeroes(offset, length);
}

Status FaultSink::Trim(uint64_t offset, uint64_t length) {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kTrim, true, offset, length, name()));
  return target_.Trim(offset, length);
}

Status FaultSink::Flush() {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kFlush, false, 0, 0, name()));
  return target_.Flush();
}

Status FaultSink::Truncate(uint64_t size_bytes) {
  BARGE_RETURN_IF_ERROR(faults_.OnCall(FaultOp::kTruncate, true, size_bytes, 0, name()));
  return target_.Truncate(size_bytes);
}

}  // namespace barge
