// SampleCleanClusters: which clusters it reads, what it finds.
#include "pipeline/clean_sample.h"

#include <gtest/gtest.h>

#include <vector>

#include "blockio/memory.h"
#include "formats/digest.h"

namespace barge::pipeline {
namespace {

constexpr uint32_t kCluster = 4096;

// A disk of `clusters` clusters, cluster i filled with byte `fill[i]`.
std::vector<std::byte> Disk(const std::vector<uint8_t>& fill) {
  std::vector<std::byte> bytes(fill.size() * kCluster);
  for (size_t i = 0; i < fill.size(); ++i) {
    std::fill_n(bytes.begin() + i * kCluster, kCluster, std::byte{fill[i]});
  }
  return bytes;
}

// The chain's effective digests of a disk: its non-zero clusters (a full
// omits zero ones).
formats::DigestTable TableOf(const std::vector<uint8_t>& fill) {
  formats::DigestTable t;
  t.cluster_bytes = kCluster;
  t.virtual_size = fill.size() * kCluster;
  std::vector<std::byte> c(kCluster);
  for (size_t i = 0; i < fill.size(); ++i) {
    if (fill[i] == 0) continue;
    std::fill(c.begin(), c.end(), std::byte{fill[i]});
    t.entries.push_back({i, formats::HashCluster(c, kCluster)});
  }
  return t;
}

TEST(CleanSampleTest, TheChainsOwnDiskMatches) {
  std::vector<uint8_t> fill(1000, 0);
  for (size_t i = 0; i < fill.size(); i += 3) fill[i] = static_cast<uint8_t>(1 + i % 200);
  MemorySource src(Disk(fill));
  auto s = SampleCleanClusters(src, TableOf(fill), {}, false);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_EQ(s->clusters, kCleanSampleClusters);
  EXPECT_EQ(s->bytes_read, uint64_t{kCleanSampleClusters} * kCluster);
  EXPECT_EQ(s->differing, 0u);
}

TEST(CleanSampleTest, AnotherDiskDiffersAndDirtyClustersAreNotRead) {
  std::vector<uint8_t> chain(100, 7), now(100, 7);
  for (size_t i = 0; i < 50; ++i) now[i] = 9;  // changed, and recorded dirty
  MemorySource same(Disk(now));
  auto s = SampleCleanClusters(same, TableOf(chain), {{0, 50 * kCluster}}, false, 10);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->clusters, 10u);
  EXPECT_EQ(s->differing, 0u);  // only the clean half was read
  std::vector<uint8_t> other(100, 8);
  MemorySource replaced(Disk(other));
  s = SampleCleanClusters(replaced, TableOf(chain), {{0, 50 * kCluster}}, false, 10);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->differing, 10u);
  ASSERT_TRUE(s->first_differing_offset);
  EXPECT_GE(*s->first_differing_offset, 50u * kCluster);
  EXPECT_NE(ReplacedDiskReason(*s, "P1", "/d.qcow2").find("/d.qcow2 is not the disk this chain holds"),
            std::string::npos);
}

// Where the chain holds zeros, the source's data extents are sampled (a
// disk with data where the chain's has none is another disk).
TEST(CleanSampleTest, SourceDataWhereTheChainHasNone) {
  std::vector<uint8_t> chain(64, 0), now(64, 0);
  now[40] = 5;
  ExtentList extents = {{0, 40 * kCluster, ExtentKind::kHole},
                        {40 * kCluster, kCluster, ExtentKind::kData},
                        {41 * kCluster, 23 * kCluster, ExtentKind::kHole}};
  MemorySource src(Disk(now), extents);
  auto without = SampleCleanClusters(src, TableOf(chain), {}, false);
  ASSERT_TRUE(without.ok());
  EXPECT_EQ(without->clusters, 0u);  // nothing to compare: no data anywhere in the chain
  auto with = SampleCleanClusters(src, TableOf(chain), {}, true);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->clusters, 1u);
  EXPECT_EQ(with->differing, 1u);
  EXPECT_EQ(with->first_differing_offset, 40u * kCluster);
}

}  // namespace
}  // namespace barge::pipeline
