// Change detection by strong digest over an in-memory source: changed,
// zeroed and new clusters found, unchanged ones not; range arithmetic.
#include "pipeline/digest_changes.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "blockio/memory.h"

namespace barge::pipeline {
namespace {

constexpr uint32_t kCluster = 4096;

std::vector<std::byte> Disk(size_t clusters, uint8_t seed) {
  std::vector<std::byte> d(clusters * kCluster);
  for (size_t i = 0; i < d.size(); ++i) d[i] = std::byte(uint8_t(i * 7 + seed + i / kCluster));
  return d;
}

formats::StrongDigestTable TableOf(const std::vector<std::byte>& disk) {
  formats::StrongDigestTable t;
  t.cluster_bytes = kCluster;
  t.virtual_size = disk.size();
  for (uint64_t c = 0; c * kCluster < disk.size(); ++c) {
    std::span<const std::byte> data(disk.data() + c * kCluster, kCluster);
    bool zero = std::all_of(data.begin(), data.end(), [](std::byte b) { return b == std::byte{0}; });
    if (!zero) t.entries.push_back({c, StrongHashCluster(data, kCluster)});
  }
  return t;
}

TEST(DigestChangesTest, FindsChangedZeroedAndNewClusters) {
  std::vector<std::byte> before = Disk(64, 1);
  std::fill(before.begin() + 40 * kCluster, before.begin() + 41 * kCluster, std::byte{0});  // was zero
  formats::StrongDigestTable table = TableOf(before);
  std::vector<std::byte> after = before;
  after[3 * kCluster + 17] ^= std::byte{1};                                                 // one bit
  std::fill(after.begin() + 10 * kCluster, after.begin() + 12 * kCluster, std::byte{0});    // zeroed
  after[40 * kCluster] = std::byte{9};                                                      // new data
  after[63 * kCluster + kCluster - 1] ^= std::byte{0x80};                                   // the last byte
  MemorySource source(after);
  CopyOptions copy;
  copy.threads = 2;
  auto changes = FindChangedClusters(source, table, copy);
  ASSERT_TRUE(changes.ok()) << changes.error().ToString();
  RangeList want = {{3 * kCluster, kCluster}, {10 * kCluster, 2 * kCluster}, {40 * kCluster, kCluster},
                    {63 * kCluster, kCluster}};
  EXPECT_EQ(changes->changed, want);
  EXPECT_EQ(changes->changed_clusters, 5u);
  EXPECT_EQ(changes->source.size(), 62u);  // 64 less the two zeroed
  // Nothing changed: nothing found.
  MemorySource same(before);
  auto none = FindChangedClusters(same, table, copy);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->changed.empty());
  // Another disk size is refused.
  table.virtual_size += kCluster;
  EXPECT_FALSE(FindChangedClusters(same, table, copy).ok());
}

TEST(DigestChangesTest, StrongHashPadsAShortCluster) {
  std::vector<std::byte> short_data(1000, std::byte{5});
  std::vector<std::byte> padded(kCluster, std::byte{0});
  std::fill(padded.begin(), padded.begin() + 1000, std::byte{5});
  EXPECT_EQ(StrongHashCluster(short_data, kCluster), StrongHashCluster(padded, kCluster));
  EXPECT_NE(StrongHashCluster(padded, kCluster), StrongHashCluster(std::span(padded).first(kCluster - 1), kCluster - 1));
}

}  // namespace
}  // namespace barge::pipeline
