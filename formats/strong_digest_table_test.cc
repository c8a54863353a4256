// Strong digest table: round trip, every validation, entry replacement.
#include "formats/strong_digest_table.h"

#include <gtest/gtest.h>

namespace barge::formats {
namespace {

StrongDigest D(uint8_t fill) {
  StrongDigest d;
  d.fill(fill);
  return d;
}

StrongDigestTable Sample() {
  StrongDigestTable t;
  t.cluster_bytes = 65536;
  t.virtual_size = 10 * 65536 + 512;  // 11 clusters, the last short
  t.image_digest = {0x1122334455667788ull, 0x99aabbccddeeff00ull};
  t.entries = {{0, D(1)}, {3, D(2)}, {10, D(3)}};
  return t;
}

TEST(StrongDigestTableTest, RoundTrip) {
  StrongDigestTable t = Sample();
  std::vector<std::byte> bytes = EncodeStrongDigestTable(t);
  ASSERT_EQ(bytes.size(), kStrongTableHeaderBytes + 3 * kStrongTableEntryBytes + kStrongTableTrailerBytes);
  auto back = DecodeStrongDigestTable(bytes);
  ASSERT_TRUE(back.ok()) << back.error().message();
  EXPECT_EQ(back->cluster_bytes, t.cluster_bytes);
  EXPECT_EQ(back->virtual_size, t.virtual_size);
  EXPECT_EQ(back->image_digest, t.image_digest);
  EXPECT_EQ(back->entries, t.entries);
  EXPECT_EQ(back->Find(3), D(2));
  EXPECT_FALSE(back->Find(4).has_value());
  EXPECT_EQ(StrongDigestHex(D(0xab)).size(), 64u);
  EXPECT_EQ(StrongDigestHex(D(0xab)).substr(0, 4), "abab");
}

TEST(StrongDigestTableTest, EveryByteIsChecked) {
  std::vector<std::byte> good = EncodeStrongDigestTable(Sample());
  // Any flipped byte fails (the trailer covers the rest); none crashes.
  for (size_t i = 0; i < good.size(); ++i) {
    std::vector<std::byte> bad = good;
    bad[i] ^= std::byte{0x40};
    EXPECT_FALSE(DecodeStrongDigestTable(bad).ok()) << "byte " << i;
  }
  for (size_t n = 0; n < good.size(); n += 7) {
    EXPECT_FALSE(DecodeStrongDigestTable(std::span(good).first(n)).ok()) << "length " << n;
  }
}

TEST(StrongDigestTableTest, OrderAndRangeRefused) {
  StrongDigestTable t = Sample();
  t.entries = {{3, D(1)}, {3, D(2)}};
  auto dup = DecodeStrongDigestTable(EncodeStrongDigestTable(t));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().code(), ErrorCode::kCorruption);
  EXPECT_NE(dup.error().message().find("strictly increasing"), std::string::npos);
  t.entries = {{11, D(1)}};  // past the 11 clusters
  auto beyond = DecodeStrongDigestTable(EncodeStrongDigestTable(t));
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.error().message().find("beyond the disk"), std::string::npos);
  t = Sample();
  t.cluster_bytes = 3000;
  EXPECT_FALSE(DecodeStrongDigestTable(EncodeStrongDigestTable(t)).ok());
}

TEST(StrongDigestTableTest, ReplaceEntries) {
  std::vector<StrongDigestEntry> base = {{0, D(1)}, {3, D(2)}, {4, D(3)}, {10, D(4)}};
  // Clusters 3..5 rewritten: 3 became zero, 5 new data; 10 unchanged.
  ClusterSpan spans[] = {{3, 6}};
  auto out = ReplaceStrongEntries(base, spans, {{4, D(9)}, {5, D(8)}});
  ASSERT_TRUE(out.ok());
  std::vector<StrongDigestEntry> want = {{0, D(1)}, {4, D(9)}, {5, D(8)}, {10, D(4)}};
  EXPECT_EQ(*out, want);
  // A new digest outside the replaced clusters is a caller's bug.
  EXPECT_FALSE(ReplaceStrongEntries(base, spans, {{7, D(1)}}).ok());
  EXPECT_FALSE(ReplaceStrongEntries(base, spans, {{1, D(1)}}).ok());
}

}  // namespace
}  // namespace barge::formats
