#include "blockio/extent.h"

#include <gtest/gtest.h>

#include "blockio/buffer.h"
#include "blockio/error.h"

namespace barge {
namespace {

TEST(RangesTest, NormalizeMergesOverlapsAndTouching) {
  RangeList r = NormalizeRanges({{100, 10}, {0, 50}, {50, 10}, {105, 20}, {200, 0}});
  EXPECT_EQ(r, (RangeList{{0, 60}, {100, 25}}));
}

TEST(RangesTest, RangeArithmetic) {
  RangeList a = {{0, 100}, {200, 100}, {400, 50}};
  RangeList b = {{50, 200}, {420, 10}};
  RangeList want = {{0, 50}, {250, 50}, {400, 20}, {430, 20}};
  EXPECT_EQ(SubtractRanges(a, b), want);
  EXPECT_EQ(SubtractRanges(a, {}), a);
  EXPECT_TRUE(SubtractRanges(a, {{0, 1000}}).empty());
  RangeList united = {{0, 300}, {400, 50}};
  EXPECT_EQ(UniteRanges(a, b), united);
}

TEST(RangesTest, AlignWidensToGranuleAndClips) {
  RangeList r = AlignRanges({{1, 1}, {140000, 10}, {250000, 100000}}, 65536, 300000);
  // 250000 widens down to 196608, which touches [131072, 196608): merged.
  EXPECT_EQ(r, (RangeList{{0, 65536}, {131072, 300000 - 131072}}));
  EXPECT_EQ(TotalBytes(r), 65536u + 300000u - 131072u);
}

TEST(ExtentsTest, MergeAdjacentSameKind) {
  ExtentList e = MergeAdjacent({{0, 10, ExtentKind::kData},
                                {10, 10, ExtentKind::kData},
                                {20, 5, ExtentKind::kHole},
                                {25, 0, ExtentKind::kZero},
                                {25, 5, ExtentKind::kHole}});
  EXPECT_EQ(e, (ExtentList{{0, 20, ExtentKind::kData}, {20, 10, ExtentKind::kHole}}));
}

TEST(BufferTest, AlignedAndZeroDetection) {
  AlignedBuffer b(10000, 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
  b.Zero();
  EXPECT_TRUE(IsAllZero(b.span()));
  b.data()[9999] = std::byte{1};
  EXPECT_FALSE(IsAllZero(b.span()));
  EXPECT_TRUE(IsAllZero(b.span().subspan(3, 9990)));
  AlignedBuffer moved = std::move(b);
  EXPECT_EQ(moved.size(), 10000u);
  EXPECT_EQ(b.data(), nullptr);
}

TEST(ErrorTest, FromErrnoKeepsContext) {
  Error e = Error::FromErrno(28 /* ENOSPC */, "pwrite", "/tmp/x", 4096, 512);
  EXPECT_EQ(e.code(), ErrorCode::kNoSpace);
  EXPECT_EQ(e.errno_value(), 28);
  std::string s = e.ToString();
  EXPECT_NE(s.find("NoSpace: /tmp/x: pwrite failed"), std::string::npos) << s;
  EXPECT_NE(s.find("offset 0x1000"), std::string::npos) << s;
  EXPECT_NE(s.find("length 512"), std::string::npos) << s;
}

TEST(ErrorTest, WrapSaysAnOperationOnce) {
  Error e = Error::IoError("short read");
  e.Wrap("read").Wrap("backup").Wrap("backup");
  EXPECT_EQ(e.message(), "backup: read: short read");
  e.Wrap("vm backup");
  EXPECT_EQ(e.message(), "vm backup: backup: read: short read");
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Error::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  BARGE_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(ErrorTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace barge
