#include "blockio/extent_builder.h"

#include <gtest/gtest.h>

namespace barge {
namespace {

constexpr ExtentKind kD = ExtentKind::kData, kZ = ExtentKind::kZero, kH = ExtentKind::kHole;

TEST(ExtentBuilderTest, WholeGranulesKeepTheirKindsAndMerge) {
  ExtentBuilder b(4096);
  b.Add(0, 8192, kD);
  b.Add(8192, 4096, kD);
  b.Add(12288, 4096, kH);
  b.Add(16384, 8192, kZ);
  EXPECT_EQ(b.Finish(), (ExtentList{{0, 12288, kD}, {12288, 4096, kH}, {16384, 8192, kZ}}));
}

TEST(ExtentBuilderTest, AGranuleOfMixedKindsTakesTheStrongest) {
  ExtentBuilder b(4096);
  b.Add(0, 100, kH);
  b.Add(100, 100, kZ);
  b.Add(200, 3896, kH);  // granule 0: hole + zero -> zero
  b.Add(4096, 1, kH);
  b.Add(4097, 1, kD);
  b.Add(4098, 4094, kH);  // granule 1: any data -> data
  b.Add(8192, 4096, kH);
  EXPECT_EQ(b.Finish(), (ExtentList{{0, 4096, kZ}, {4096, 4096, kD}, {8192, 4096, kH}}));
}

TEST(ExtentBuilderTest, UnalignedEndsAreClippedNotWidened) {
  ExtentBuilder b(4096);
  b.Add(4097, 4095, kH);
  b.Add(8192, 10000, kH);
  EXPECT_EQ(b.Finish(), (ExtentList{{4097, 4095 + 10000, kH}}));
}

// The flood a lying peer sends: one-byte extents, data and hole in turn.
// What is held stays one extent per granule, whatever the count.
TEST(ExtentBuilderTest, OneByteExtentsCostOneExtentPerGranuleAtMost) {
  ExtentBuilder b(4096);
  size_t most = 0;
  for (uint64_t i = 0; i < (1u << 20); ++i) {
    b.Add(i, 1, i % 2 ? kH : kD);
    most = std::max(most, b.size());
  }
  EXPECT_LE(most, 2u);
  EXPECT_EQ(b.Finish(), (ExtentList{{0, 1u << 20, kD}}));
  // Alternating per granule: one extent each, the least any gathering can.
  ExtentBuilder c(4096);
  for (uint64_t g = 0; g < 64; ++g) c.Add(g * 4096, 4096, g % 2 ? kH : kZ);
  EXPECT_EQ(c.Finish().size(), 64u);
}

TEST(AppendGranularRangeTest, WidensClipsAndMerges) {
  RangeList r;
  AppendGranularRange(r, 5000, 1, 4100, 1 << 20, 4096);  // clipped below at the window's start
  AppendGranularRange(r, 8191, 1, 4100, 1 << 20, 4096);  // same granule: merged
  AppendGranularRange(r, 8192, 1, 4100, 1 << 20, 4096);  // touches: merged
  AppendGranularRange(r, 20000, 10, 4100, 1 << 20, 4096);
  AppendGranularRange(r, (1 << 20) - 1, 1, 4100, 1 << 20, 4096);
  EXPECT_EQ(r, (RangeList{{4100, 12288 - 4100}, {16384, 4096}, {(1 << 20) - 4096, 4096}}));
  RangeList flood;
  for (uint64_t i = 0; i < (1u << 20); i += 2) AppendGranularRange(flood, i, 1, 0, 1 << 20, 4096);
  EXPECT_EQ(flood, (RangeList{{0, 1 << 20}}));
}

}  // namespace
}  // namespace barge
