// Tests for the writer's refcount runs and refcount area sizing.
#include "formats/qcow2_refcount_builder.h"

#include <gtest/gtest.h>

#include "blockio/memory.h"
#include "formats/qcow2_format.h"

namespace barge::formats::qcow2 {
namespace {

uint64_t DivRoundUp(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

TEST(PlanRefcountAreaTest, SmallImageNeedsOneTableClusterAndOneBlock) {
  RefcountLayout l = PlanRefcountArea(5, 16, 4);
  EXPECT_EQ(l.table_offset, 5u << 16);
  EXPECT_EQ(l.table_clusters, 1u);
  EXPECT_EQ(l.block_count, 1u);
  EXPECT_EQ(l.end_offset, 7u << 16);
}

TEST(PlanRefcountAreaTest, BlockBoundaryEdges) {
  // 512-byte clusters with 64-bit refcounts: 64 refcounts per block.
  EXPECT_EQ(PlanRefcountArea(62, 9, 6).block_count, 1u);  // 62 + T + R = 64 exactly
  RefcountLayout l = PlanRefcountArea(63, 9, 6);          // 65 would not fit one block
  EXPECT_EQ(l.block_count, 2u);
  EXPECT_EQ(l.table_clusters, 1u);
  // Table overflow: 64 table entries per 512-byte cluster.
  RefcountLayout big = PlanRefcountArea(64 * 64, 9, 6);
  EXPECT_EQ(big.table_clusters, 2u);
}

// The least fixed point: enough blocks for every cluster including the
// area itself, and one block fewer would not be enough.
TEST(PlanRefcountAreaTest, SweepIsSufficientAndMinimal) {
  for (uint32_t bits : {9u, 12u, 16u, 21u}) {
    for (uint32_t order = 0; order <= 6; ++order) {
      uint64_t cs = uint64_t{1} << bits;
      uint64_t per_block = RefcountsPerBlock(bits, order);
      for (uint64_t base : {uint64_t{1}, uint64_t{2}, per_block - 3, per_block - 2, per_block - 1,
                            per_block, per_block + 1, 3 * per_block - 2, 100 * per_block + 7}) {
        RefcountLayout l = PlanRefcountArea(base, bits, order);
        uint64_t total = base + l.table_clusters + l.block_count;
        SCOPED_TRACE(::testing::Message() << "bits " << bits << " order " << order << " base " << base);
        EXPECT_GE(l.block_count * per_block, total);
        EXPECT_GE(l.table_clusters * cs, l.block_count * 8);
        EXPECT_EQ(l.table_clusters, DivRoundUp(l.block_count * 8, cs));
        EXPECT_LT((l.block_count - 1) * per_block, total);
        EXPECT_EQ(l.end_offset, total << bits);
      }
    }
  }
}

TEST(RefcountBuilderTest, ContiguousClustersStayOneRun) {
  RefcountBuilder b(16, 4);
  for (uint64_t c = 0; c < 1000000; ++c) ASSERT_TRUE(b.AddReference(c).ok());
  EXPECT_EQ(b.run_count(), 1u);
  EXPECT_EQ(b.end_cluster(), 1000000u);
  EXPECT_EQ(b.RefcountOf(999999), 1u);
  EXPECT_EQ(b.RefcountOf(1000000), 0u);
}

TEST(RefcountBuilderTest, SharedLastClusterCounts) {
  RefcountBuilder b(12, 4);
  ASSERT_TRUE(b.AddReference(0, 3).ok());
  ASSERT_TRUE(b.AddReference(2).ok());     // packed payload in cluster 2
  ASSERT_TRUE(b.AddReference(2, 2).ok());  // another spanning 2..3
  EXPECT_EQ(b.RefcountOf(0), 1u);
  EXPECT_EQ(b.RefcountOf(1), 1u);
  EXPECT_EQ(b.RefcountOf(2), 3u);
  EXPECT_EQ(b.RefcountOf(3), 1u);
  ASSERT_TRUE(b.AddReference(4, 2).ok());
  EXPECT_EQ(b.run_count(), 3u);  // [0,2)=1, [2]=3, [3,6)=1
  // Gaps are holes with refcount 0.
  ASSERT_TRUE(b.AddReference(10).ok());
  EXPECT_EQ(b.RefcountOf(8), 0u);
  EXPECT_EQ(b.RefcountOf(10), 1u);
}

TEST(RefcountBuilderTest, RejectsOutOfOrderAndOverflow) {
  RefcountBuilder b(12, 0);
  ASSERT_TRUE(b.AddReference(0, 4).ok());
  EXPECT_EQ(b.AddReference(1).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(b.AddReference(3).error().code(), ErrorCode::kInvalidArgument);  // 1-bit max
  RefcountBuilder two(12, 1);
  ASSERT_TRUE(two.AddReference(0).ok());
  ASSERT_TRUE(two.AddReference(0).ok());
  ASSERT_TRUE(two.AddReference(0).ok());
  EXPECT_EQ(two.max_refcount(), 3u);
  EXPECT_FALSE(two.AddReference(0).ok());
  EXPECT_EQ(RefcountBuilder(9, 6).max_refcount(), ~uint64_t{0});
}

// Reads refcount `index` back from an encoded block.
uint64_t LoadRefcount(const std::byte* block, uint64_t index, uint32_t order) {
  if (order < 3) {
    uint32_t bits = 1u << order;
    uint64_t bit = index * bits;
    return (uint8_t(block[bit / 8]) >> (bit % 8)) & ((1u << bits) - 1);
  }
  uint64_t v = 0;
  uint32_t width = (1u << order) / 8;
  for (uint32_t i = 0; i < width; ++i) v = (v << 8) | uint8_t(block[index * width + i]);
  return v;
}

TEST(RefcountBuilderTest, WriteAreaEncodesEveryOrder) {
  for (uint32_t order = 0; order <= 6; ++order) {
    SCOPED_TRACE(order);
    const uint32_t bits = 9;
    RefcountBuilder b(bits, order);
    ASSERT_TRUE(b.AddReference(0, 5).ok());
    if (order > 0) {
      ASSERT_TRUE(b.AddReference(4).ok());  // cluster 4: refcount 2
    }
    ASSERT_TRUE(b.AddReference(7, 2).ok());             // hole at 5..6
    RefcountLayout l = PlanRefcountArea(9, bits, order);
    MemorySink sink;
    ASSERT_TRUE(b.WriteArea(sink, l).ok());
    auto bytes = sink.contents();
    ASSERT_EQ(bytes.size(), l.end_offset);
    uint64_t per_block = RefcountsPerBlock(bits, order);
    auto refcount = [&](uint64_t cluster) {
      uint64_t entry = LoadBe64(bytes.data() + l.table_offset + (cluster / per_block) * 8);
      return LoadRefcount(bytes.data() + entry, cluster % per_block, order);
    };
    uint64_t total = 9 + l.table_clusters + l.block_count;
    for (uint64_t c = 0; c < total + 3; ++c) {
      uint64_t want = (c < 5 || (c >= 7 && c < total)) ? 1 : 0;
      if (c == 4 && order > 0) want = 2;
      if (c / per_block < l.block_count) {
        EXPECT_EQ(refcount(c), want) << "cluster " << c;
      }
    }
  }
}

}  // namespace
}  // namespace barge::formats::qcow2
