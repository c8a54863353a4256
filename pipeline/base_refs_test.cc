// Chains over a base: the difference from a base point (digests chosen,
// bytes compared, so a digest collision is still stored), reference files,
// and relative folder paths.
#include "pipeline/base_refs.h"

#include <gtest/gtest.h>

#include <cstring>

#include "blockio/memory.h"
#include "formats/digest.h"

namespace barge::pipeline {
namespace {

constexpr uint32_t kCluster = 4096;

std::vector<std::byte> Filled(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::byte(static_cast<uint8_t>((i * 131 + seed * 7) % 251 + 1));
  return v;
}

formats::DigestTable TableOf(const std::vector<std::byte>& bytes) {
  formats::DigestTable t;
  t.cluster_bytes = kCluster;
  t.virtual_size = bytes.size();
  const formats::Digest128 zero = formats::ZeroClusterDigest(kCluster);
  for (size_t off = 0; off < bytes.size(); off += kCluster) {
    formats::Digest128 d = formats::HashCluster(std::span(bytes.data() + off, kCluster), kCluster);
    if (d != zero) t.entries.push_back({off / kCluster, d});
  }
  return t;
}

TEST(DiffFromBaseTest, StoresChangedAndZeroedClustersOnly) {
  std::vector<std::byte> base = Filled(16 * kCluster, 1);
  std::fill(base.begin() + 9 * kCluster, base.begin() + 10 * kCluster, std::byte{0});  // zero in the base
  std::vector<std::byte> clone = base;
  clone[2 * kCluster + 5] = std::byte{0xEE};                                           // changed
  std::fill(clone.begin() + 4 * kCluster, clone.begin() + 5 * kCluster, std::byte{0});  // zeroed
  clone[9 * kCluster] = std::byte{1};                                                  // data over zero
  MemorySource src(clone), old(base);
  uint64_t compared = 0;
  auto diff = DiffFromBase(src, old, TableOf(base), kCluster, nullptr, &compared);
  ASSERT_TRUE(diff.ok()) << diff.error().ToString();
  RangeList want = {{2 * kCluster, kCluster}, {4 * kCluster, kCluster}, {9 * kCluster, kCluster}};
  EXPECT_EQ(*diff, want);
  EXPECT_GT(compared, 0u);  // matching clusters were compared byte for byte
}

TEST(DiffFromBaseTest, ACollidingDigestIsStillStored) {
  std::vector<std::byte> base = Filled(8 * kCluster, 2);
  std::vector<std::byte> clone = base;
  clone[3 * kCluster + 7] = std::byte{0x42};
  // A table that claims the clone's bytes for cluster 3: as if the guest had
  // crafted a cluster whose digest collides with the base's.
  formats::DigestTable lying = TableOf(base);
  lying.entries[3].digest = formats::HashCluster(std::span(clone.data() + 3 * kCluster, kCluster), kCluster);
  MemorySource src(clone), old(base);
  auto diff = DiffFromBase(src, old, lying, kCluster);
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(*diff, (RangeList{{3 * kCluster, kCluster}}));
}

TEST(BaseRefTest, RoundTripAndRefusals) {
  BaseRef ref{"../clone1", "0123456789abcdef", "0000-20261127T063000Z"};
  auto back = DecodeBaseRef(EncodeBaseRef(ref));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dependent, ref.dependent);
  EXPECT_EQ(back->chain_id, ref.chain_id);
  EXPECT_EQ(back->base_id, ref.base_id);
  for (const char* bad : {"", "[]", "{\"format\":\"barge-base-ref\",\"version\":2}",
                          R"({"format":"barge-base-ref","version":1,"dependent":"/etc","chain_id":"ab","base_id":"x"})",
                          R"({"format":"barge-base-ref","version":1,"dependent":"../a","chain_id":"../x","base_id":"x"})",
                          R"({"format":"barge-base-ref","version":1,"dependent":"../a","chain_id":"ab","base_id":".x"})"}) {
    auto r = DecodeBaseRef(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << bad;
  }
}

TEST(BaseRefTest, RelativeFolderPath) {
  EXPECT_EQ(RelativeFolderPath("/t/clone", "/t/golden"), "../golden");
  EXPECT_EQ(RelativeFolderPath("/t/p/d/vda", "/t/golden"), "../../../golden");
  EXPECT_EQ(RelativeFolderPath("/a/b/", "/a/b/c"), "c");
}

}  // namespace
}  // namespace barge::pipeline
