// Every rule type of the fault-injecting wrappers, over memory targets.
#include "blockio/fault.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <thread>

#include "blockio/memory.h"

namespace barge {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t v) { return std::vector<std::byte>(n, std::byte{v}); }

TEST(FaultSinkTest, ForwardsEverythingWithoutRules) {
  MemorySink mem;
  FaultSink sink(mem);
  EXPECT_EQ(sink.name(), mem.name());
  EXPECT_TRUE(sink.capabilities().can_zero);
  ASSERT_TRUE(sink.WriteAt(0, Bytes(100, 1)).ok());
  ASSERT_TRUE(sink.WriteZeroes(10, 10).ok());
  ASSERT_TRUE(sink.Trim(50, 10).ok());
  ASSERT_TRUE(sink.Flush().ok());
  ASSERT_TRUE(sink.Truncate(80).ok());
  EXPECT_EQ(sink.size_bytes(), 80u);
  EXPECT_EQ(mem.ops().size(), 5u);
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kZero, FaultOp::kTrim, FaultOp::kFlush,
                     FaultOp::kTruncate}) {
    EXPECT_EQ(sink.faults().calls(op), 1u) << FaultOpName(op);
  }
}

TEST(FaultSinkTest, FailsTheNthWriteOnly) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule(FaultRule::Nth(FaultOp::kWrite, 3, EIO));
  EXPECT_TRUE(sink.WriteAt(0, Bytes(10, 1)).ok());
  EXPECT_TRUE(sink.WriteAt(10, Bytes(10, 1)).ok());
  Status s = sink.WriteAt(20, Bytes(10, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIoError);
  EXPECT_EQ(s.error().errno_value(), EIO);
  EXPECT_EQ(s.error().offset(), 20u);
  EXPECT_EQ(s.error().length(), 10u);
  EXPECT_TRUE(sink.WriteAt(30, Bytes(10, 1)).ok());
  EXPECT_EQ(sink.faults().calls(FaultOp::kWrite), 4u);
  EXPECT_EQ(mem.ops().size(), 3u);  // the failed write never reached the target
}

TEST(FaultSinkTest, NthAndAfterFailsEveryLaterCall) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule(FaultRule::NthAndAfter(FaultOp::kWrite, 2, ENOSPC));
  EXPECT_TRUE(sink.WriteAt(0, Bytes(10, 1)).ok());
  for (int i = 0; i < 3; ++i) {
    Status s = sink.WriteAt(10, Bytes(10, 1));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kNoSpace);
  }
  // Other kinds are unaffected.
  EXPECT_TRUE(sink.WriteZeroes(0, 10).ok());
  sink.faults().ClearRules();
  EXPECT_TRUE(sink.WriteAt(10, Bytes(10, 1)).ok());
}

TEST(FaultSinkTest, RangeRuleFailsOverlappingCallsOnly) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule(FaultRule::InRange(FaultOp::kWrite, 100, 50));
  EXPECT_TRUE(sink.WriteAt(0, Bytes(100, 1)).ok());    // ends right before
  EXPECT_TRUE(sink.WriteAt(150, Bytes(100, 1)).ok());  // starts right after
  EXPECT_FALSE(sink.WriteAt(90, Bytes(11, 1)).ok());   // touches byte 100
  EXPECT_FALSE(sink.WriteAt(149, Bytes(1, 1)).ok());
  EXPECT_FALSE(sink.WriteAt(0, Bytes(1000, 1)).ok());  // covers it
}

TEST(FaultSinkTest, NthCallInsideRangeCombine) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule({.op = FaultOp::kZero, .error_errno = EIO, .nth_call = 2,
                         .and_after = true, .range = Range{0, 10}});
  EXPECT_TRUE(sink.WriteZeroes(0, 5).ok());   // 1st: count not reached
  EXPECT_TRUE(sink.WriteZeroes(20, 5).ok());  // 2nd: outside the range
  EXPECT_FALSE(sink.WriteZeroes(5, 5).ok());  // 3rd: both
}

TEST(FaultSinkTest, EveryKindCanFail) {
  MemorySink mem;
  FaultSink sink(mem);
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kZero, FaultOp::kTrim, FaultOp::kFlush,
                     FaultOp::kTruncate}) {
    sink.faults().AddRule(FaultRule::Always(op, EROFS));
  }
  EXPECT_EQ(sink.WriteAt(0, Bytes(1, 1)).error().errno_value(), EROFS);
  EXPECT_EQ(sink.WriteZeroes(0, 1).error().errno_value(), EROFS);
  EXPECT_EQ(sink.Trim(0, 1).error().errno_value(), EROFS);
  Status flush = sink.Flush();
  ASSERT_FALSE(flush.ok());
  EXPECT_FALSE(flush.error().offset().has_value());
  EXPECT_EQ(sink.Truncate(10).error().errno_value(), EROFS);
  EXPECT_TRUE(mem.ops().empty());
}

TEST(FaultSinkTest, TruncateRangeMatchesTheNewSize) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule(FaultRule::InRange(FaultOp::kTruncate, 1000, 1000));
  EXPECT_TRUE(sink.Truncate(10).ok());
  EXPECT_FALSE(sink.Truncate(1500).ok());
  // Flush has no range, so a range rule never fails it.
  sink.faults().AddRule(FaultRule::InRange(FaultOp::kFlush, 0, 1u << 30));
  EXPECT_TRUE(sink.Flush().ok());
}

TEST(FaultSinkTest, DelaySlowsCalls) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().SetDelay(FaultOp::kWrite, std::chrono::milliseconds(20));
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sink.WriteAt(0, Bytes(1, 1)).ok());
  ASSERT_TRUE(sink.WriteAt(1, Bytes(1, 1)).ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(40));
  start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sink.Flush().ok());  // no delay on other kinds
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(20));
}

TEST(FaultSinkTest, OwnsItsTarget) {
  auto mem = std::make_unique<MemorySink>(0, "owned");
  MemorySink* raw = mem.get();
  FaultSink sink(std::move(mem));
  EXPECT_EQ(&sink.target(), raw);
  EXPECT_EQ(sink.name(), "owned");
  ASSERT_TRUE(sink.WriteAt(0, Bytes(3, 7)).ok());
  EXPECT_EQ(raw->contents(), Bytes(3, 7));
}

TEST(FaultSinkTest, CountsAreExactUnderConcurrency) {
  MemorySink mem;
  FaultSink sink(mem);
  sink.faults().AddRule(FaultRule::Nth(FaultOp::kWrite, 100));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        if (!sink.WriteAt(static_cast<uint64_t>(t) * 1000 + i, Bytes(1, 1)).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(sink.faults().calls(FaultOp::kWrite), 200u);
  EXPECT_EQ(failures.load(), 1);
}

TEST(FaultSourceTest, ReadAndExtentsRules) {
  std::vector<std::byte> bytes(4096, std::byte{9});
  MemorySource mem(bytes, ExtentList{{0, 4096, ExtentKind::kData}});
  FaultSource source(mem);
  EXPECT_EQ(source.size_bytes(), 4096u);
  EXPECT_TRUE(source.capabilities().has_extents);
  source.faults().AddRule(FaultRule::InRange(FaultOp::kRead, 1024, 1));
  source.faults().AddRule(FaultRule::Nth(FaultOp::kExtents, 2));
  std::vector<std::byte> out(512);
  EXPECT_TRUE(source.ReadAt(0, out).ok());
  Status s = source.ReadAt(1000, out);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().path(), "memory");
  EXPECT_TRUE(source.Extents(0, 4096).ok());
  EXPECT_FALSE(source.Extents(0, 4096).ok());
  EXPECT_TRUE(source.Extents(0, 4096).ok());
  EXPECT_EQ(source.faults().calls(FaultOp::kRead), 2u);
  EXPECT_EQ(source.faults().calls(FaultOp::kExtents), 3u);
}

TEST(FaultSourceTest, ReadManyFailsOnlyMatchingRequests) {
  std::vector<std::byte> bytes(4096);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i);
  MemorySource mem(bytes);
  FaultSource source(mem);
  source.faults().AddRule(FaultRule::Nth(FaultOp::kRead, 2));
  std::vector<std::byte> a(10), b(10), c(10);
  std::vector<ReadRequest> reqs = {{0, a, {}}, {100, b, {}}, {200, c, {}}};
  Status s = source.ReadMany(reqs);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().offset(), 100u);
  EXPECT_TRUE(reqs[0].status.ok());
  EXPECT_FALSE(reqs[1].status.ok());
  EXPECT_TRUE(reqs[2].status.ok());
  EXPECT_EQ(c[0], std::byte(200));
  EXPECT_EQ(source.faults().calls(FaultOp::kRead), 3u);
}

}  // namespace
}  // namespace barge
