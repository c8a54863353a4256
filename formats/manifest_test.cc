#include "formats/manifest.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "formats/digest_table.h"

namespace barge::formats {
namespace {

BackupManifest Sample() {
  BackupManifest m;
  m.id = "0001-20261122T150102Z";
  m.disk = "vda";
  m.type = BackupType::kIncremental;
  m.reason = "dirty bitmap cbt0";
  m.source = "/dev/vg/vm1";
  m.source_format = "raw";
  m.virtual_size = 1 << 30;
  m.cluster_size = 65536;
  m.compression = "zstd:3";
  m.image = "0001-20261122T150102Z.qcow2";
  m.digest_table = "0001-20261122T150102Z.digests";
  m.parent = ManifestParent{"0000-20261122T140000Z", "0000-20261122T140000Z.qcow2", {1, 2}};
  m.dirty_source = "bitmap:cbt0";
  m.dirty_bytes = 123456;
  m.started_at = "2026-11-22T15:01:02Z";
  m.finished_at = "2026-11-22T15:01:09Z";
  m.tool_version = "0.1.0";
  m.bytes_read = 4096;
  m.image_digest = {0xdeadbeef, 0xfeedface};
  return m;
}

TEST(ManifestTest, RoundTrip) {
  BackupManifest m = Sample();
  auto back = DecodeManifest(EncodeManifest(m).value());
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->id, m.id);
  EXPECT_EQ(back->type, BackupType::kIncremental);
  ASSERT_TRUE(back->parent.has_value());
  EXPECT_EQ(back->parent->image_digest, m.parent->image_digest);
  EXPECT_EQ(back->image_digest, m.image_digest);
  EXPECT_EQ(back->dirty_bytes, 123456u);
  EXPECT_EQ(back->virtual_size, m.virtual_size);
  EXPECT_EQ(back->image_digest_algorithm, ImageDigestAlgorithm::kZeroRunFold);
}

TEST(ManifestTest, ImageDigestAlgorithmVersionsRoundTrip) {
  BackupManifest m = Sample();
  std::string text = EncodeManifest(m).value();
  EXPECT_NE(text.find("\"xxh3-128-zero-run-fold\""), std::string::npos);
  // A point written before version 2 says so and keeps its fold.
  m.image_digest_algorithm = ImageDigestAlgorithm::kClusterFold;
  text = EncodeManifest(m).value();
  ASSERT_NE(text.find("\"xxh3-128-cluster-fold\""), std::string::npos);
  auto back = DecodeManifest(text);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->image_digest_algorithm, ImageDigestAlgorithm::kClusterFold);
  std::string other = text;
  other.replace(other.find("xxh3-128-cluster-fold"), 21, "xxh3-128-other-foldxx");
  EXPECT_EQ(DecodeManifest(other).error().code(), ErrorCode::kCorruption);
}

TEST(ManifestTest, SourceThatIsNotUtf8IsAnErrorNotAnException) {
  BackupManifest m = Sample();
  m.source = "/srv/disk-\xff.raw";
  auto text = EncodeManifest(m);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().code(), ErrorCode::kInvalidArgument);
}

TEST(ManifestTest, RejectsBadInput) {
  EXPECT_EQ(DecodeManifest("not json").error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(DecodeManifest("[]").error().code(), ErrorCode::kCorruption);
  std::string good = EncodeManifest(Sample()).value();
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  EXPECT_FALSE(DecodeManifest(replace("0001-20261122T150102Z.qcow2", "../etc/passwd")).ok());
  EXPECT_FALSE(DecodeManifest(replace("\"cluster_size\": 65536", "\"cluster_size\": 3000")).ok());
  EXPECT_FALSE(DecodeManifest(replace("\"virtual_size\": 1073741824", "\"virtual_size\": -1")).ok());
  EXPECT_EQ(DecodeManifest(replace("\"format_version\": 1", "\"format_version\": 9")).error().code(),
            ErrorCode::kNotSupported);
  EXPECT_FALSE(DecodeManifest(replace("\"type\": \"incremental\"", "\"type\": \"weird\"")).ok());
}

// Every file a manifest names is its own point's, of its kind (issue 35):
// a digest table named like another point's image would have verify pass
// and forget --keep-last 1 delete the kept point's image.
TEST(ManifestTest, FileNamesMustBeThePointsOwnOfTheirKind) {
  BackupManifest good = Sample();
  good.strong_digest_table = good.id + ".sha256";
  ASSERT_TRUE(DecodeManifest(EncodeManifest(good).value()).ok());
  auto refused = [](const BackupManifest& m) {
    auto back = DecodeManifest(EncodeManifest(m).value());
    return !back.ok() && back.error().code() == ErrorCode::kCorruption;
  };
  BackupManifest m = good;
  m.strong_digest_table = "0002-20261122T160000Z.qcow2";  // another point's image
  EXPECT_TRUE(refused(m));
  m = good;
  m.strong_digest_table = m.image;  // its own image, as a digest table
  EXPECT_TRUE(refused(m));
  m = good;
  m.digest_table = "0000-20261122T140000Z.digests";  // the parent's table
  EXPECT_TRUE(refused(m));
  m = good;
  m.image = "0000-20261122T140000Z.qcow2";  // the parent's image
  EXPECT_TRUE(refused(m));
  m = good;
  m.image = m.id + ".json";  // its own manifest
  EXPECT_TRUE(refused(m));
  m = good;
  m.parent->image = "0002-20261122T160000Z.qcow2";  // not the parent's
  EXPECT_TRUE(refused(m));
  m = good;
  m.parent.reset();
  m.type = BackupType::kFull;
  m.base = ManifestBase{"../golden", "0000-x", "0001-x.qcow2", {1, 2}, ""};
  EXPECT_TRUE(refused(m));
  m.base->image = "0000-x.qcow2";
  EXPECT_FALSE(refused(m));
}

TEST(ManifestTest, DiskIdentityAndChainIdRoundTrip) {
  BackupManifest m = Sample();
  m.disk_identity = DiskIdentity{.kind = "domain", .location = "vm1", .target = "vda", .virtual_size = 1 << 30};
  m.chain_id = "0123456789abcdef0123456789abcdef";
  std::string text = EncodeManifest(m).value();
  EXPECT_NE(text.find("\"disk_identity\""), std::string::npos) << text;
  auto back = DecodeManifest(text);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  ASSERT_TRUE(back->disk_identity.has_value());
  EXPECT_EQ(*back->disk_identity, *m.disk_identity);
  EXPECT_EQ(back->chain_id, m.chain_id);

  m.disk_identity = DiskIdentity{.kind = "file", .location = "/srv/a.qcow2", .virtual_size = 4096};
  back = DecodeManifest(EncodeManifest(m).value());
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(*back->disk_identity, *m.disk_identity);
  // How pipeline describes it is DiskIdentityTest.DescribeDiskNamesKindLocationAndSize.
}

// A chain's first point over another chain's point (issue 23): the base
// round-trips, its folder path must be relative and plain, and only a
// point without a parent may have one.
TEST(ManifestTest, BaseRoundTripsAndIsChecked) {
  BackupManifest m = Sample();
  m.parent.reset();
  m.type = BackupType::kFull;
  ManifestBase b;
  b.chain = "../golden";
  b.id = "0000-20261127T063000Z";
  b.image = "0000-20261127T063000Z.qcow2";
  b.image_digest = Digest128{1, 2};
  b.chain_id = "00ff";
  m.base = b;
  auto back = DecodeManifest(EncodeManifest(m).value());
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  ASSERT_TRUE(back->base.has_value());
  EXPECT_EQ(back->base->chain, "../golden");
  EXPECT_EQ(back->base->BackingName(), "../golden/0000-20261127T063000Z.qcow2");
  EXPECT_EQ(back->base->image_digest, b.image_digest);
  EXPECT_EQ(back->base->chain_id, "00ff");
  EXPECT_FALSE(DecodeManifest(EncodeManifest(Sample()).value())->base.has_value());
  for (const char* chain : {"/abs/golden", "../.hidden", "..//x", "a/./b", "", "x/"}) {
    m.base->chain = chain;
    auto bad = DecodeManifest(EncodeManifest(m).value());
    EXPECT_FALSE(bad.ok()) << chain;
  }
  m.base->chain = "../../t2/golden";
  EXPECT_TRUE(DecodeManifest(EncodeManifest(m).value()).ok());
  m.parent = ManifestParent{"0000-x", "0000-x.qcow2", Digest128{3, 4}};
  m.type = BackupType::kIncremental;
  EXPECT_FALSE(DecodeManifest(EncodeManifest(m).value()).ok());
}

// A domain disk's identity records the file behind its target (issue 25:
// disks that swapped files); a manifest without it decodes with none (how
// pipeline compares the two is
// DiskIdentityTest.DomainDiskSourceIsComparedWhereBothRecordOne).
TEST(ManifestTest, DomainDiskSourceRoundTripsAndComparesWhenBothHaveIt) {
  BackupManifest m = Sample();
  m.disk_identity = DiskIdentity{
      .kind = "domain", .location = "vm1", .target = "vdb", .virtual_size = 1 << 20, .source = "/srv/a.qcow2"};
  std::string text = EncodeManifest(m).value();
  EXPECT_NE(text.find("\"source\": \"/srv/a.qcow2\""), std::string::npos) << text;
  auto back = DecodeManifest(text);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(*back->disk_identity, *m.disk_identity);
  EXPECT_EQ(back->disk_identity->source, "/srv/a.qcow2");

  // An older manifest's identity has no source: it decodes with "" (which
  // pipeline does not compare), every other field as recorded.
  m.disk_identity = DiskIdentity{.kind = "domain", .location = "vm1", .target = "vdb", .virtual_size = 1 << 20};
  back = DecodeManifest(EncodeManifest(m).value());
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(*back->disk_identity, *m.disk_identity);
  EXPECT_TRUE(back->disk_identity->source.empty());
}

TEST(ManifestTest, WithoutDiskIdentityDecodesAsBefore) {
  // A manifest written before barge recorded identities has neither field.
  std::string text = EncodeManifest(Sample()).value();
  EXPECT_EQ(text.find("disk_identity"), std::string::npos);
  EXPECT_EQ(text.find("chain_id"), std::string::npos);
  auto back = DecodeManifest(text);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_FALSE(back->disk_identity.has_value());
  EXPECT_TRUE(back->chain_id.empty());
}

TEST(ManifestTest, MalformedDiskIdentityIsCorruptionNotAnException) {
  BackupManifest m = Sample();
  m.disk_identity = DiskIdentity{.kind = "file", .location = "/srv/a.qcow2", .virtual_size = 4096};
  m.chain_id = "abc";
  const std::string good = EncodeManifest(m).value();
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  for (const std::string& bad : {
           replace("\"location\": \"/srv/a.qcow2\"", "\"location\": 7"),
           replace("\"location\": \"/srv/a.qcow2\"", "\"location\": \"\""),
           replace("\"kind\": \"file\"", "\"kind\": [1]"),
           replace("\"kind\": \"file\"", "\"kind\": \"domain\""),  // a domain needs a target
           replace("\"virtual_size\": 4096", "\"virtual_size\": -4096"),
           replace("\"chain_id\": \"abc\"", "\"chain_id\": {}"),
       }) {
    auto r = DecodeManifest(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << bad;
  }
  auto r = DecodeManifest(replace("\"disk_identity\": {", "\"disk_identity\": 5, \"x\": {"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption);
  // null is as absent.
  r = DecodeManifest(replace("\"chain_id\": \"abc\"", "\"chain_id\": null"));
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_TRUE(r->chain_id.empty());
}

TEST(DigestTableTest, EncodeDecodeAndCorruption) {
  DigestTable t{65536, 10 * 65536 + 100, {{0, {1, 2}}, {3, {3, 4}}, {10, {5, 6}}}};
  std::vector<std::byte> bytes = EncodeDigestTable(t);
  auto back = DecodeDigestTable(bytes);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->entries, t.entries);
  // Any flipped byte is caught (by a field check or the trailer).
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<std::byte> bad = bytes;
    bad[i] ^= std::byte{0x40};
    EXPECT_FALSE(DecodeDigestTable(bad).ok()) << "byte " << i;
  }
  bytes.pop_back();
  EXPECT_FALSE(DecodeDigestTable(bytes).ok());
}

TEST(DigestTableTest, MergeNewestWinsAndImageDigest) {
  DigestTable full{512, 8 * 512, {{0, {1, 1}}, {2, {2, 2}}, {5, {5, 5}}}};
  DigestTable inc{512, 8 * 512, {{2, {9, 9}}, {3, {3, 3}}}};
  const DigestTable* layers[] = {&full, &inc};
  auto merged = MergeDigestTables(layers);
  ASSERT_TRUE(merged.ok());
  EXPECT_EQ(merged->entries,
            (std::vector<DigestEntry>{{0, {1, 1}}, {2, {9, 9}}, {3, {3, 3}}, {5, {5, 5}}}));
  // The image digest equals a direct fold over all 8 clusters.
  ImageDigestBuilder direct;
  Digest128 z = ZeroClusterDigest(512);
  for (Digest128 d : {Digest128{1, 1}, z, Digest128{9, 9}, Digest128{3, 3}, z, Digest128{5, 5}, z, z}) {
    direct.Add(d);
  }
  EXPECT_EQ(ImageDigestOf(*merged, ImageDigestAlgorithm::kClusterFold), direct.Finish());
}

// The zero-run fold (version 2) by its definition: one record per maximal
// run of zero-cluster digests, one per other cluster. Slow on purpose.
Digest128 SlowZeroRunFold(const std::vector<Digest128>& clusters, uint32_t cluster_bytes) {
  const Digest128 z = ZeroClusterDigest(cluster_bytes);
  std::vector<std::byte> bytes;
  auto put_le = [&bytes](uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes.push_back(std::byte(v >> (8 * i)));
  };
  for (size_t i = 0; i < clusters.size();) {
    if (clusters[i] == z) {
      size_t j = i;
      while (j < clusters.size() && clusters[j] == z) ++j;
      bytes.push_back(std::byte{0});
      put_le(j - i);
      i = j;
    } else {
      bytes.push_back(std::byte{1});
      put_le(clusters[i].low);
      put_le(clusters[i].high);
      ++i;
    }
  }
  // HashCluster of a whole "cluster" is plain XXH3-128 of its bytes.
  return HashCluster(bytes, static_cast<uint32_t>(bytes.size()));
}

TEST(DigestTest, ZeroRunFoldEqualsItsDefinition) {
  const uint32_t cb = 512;
  const Digest128 z = ZeroClusterDigest(cb);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<Digest128> clusters(rng() % 40);
    for (auto& d : clusters) d = (rng() % 3 == 0) ? Digest128{rng(), rng()} : z;
    const Digest128 want = SlowZeroRunFold(clusters, cb);
    // Cluster by cluster.
    ImageDigestBuilder one(ImageDigestAlgorithm::kZeroRunFold, cb);
    for (const auto& d : clusters) one.Add(d);
    EXPECT_EQ(one.Finish(), want) << "round " << round;
    // Zero runs as AddRepeated (split at random), data by Add.
    ImageDigestBuilder runs(ImageDigestAlgorithm::kZeroRunFold, cb);
    for (size_t i = 0; i < clusters.size();) {
      size_t j = i;
      while (j < clusters.size() && clusters[j] == clusters[i]) ++j;
      size_t split = i + rng() % (j - i + 1);
      runs.AddRepeated(clusters[i], split - i);
      runs.AddRepeated(clusters[i], j - split);
      i = j;
    }
    EXPECT_EQ(runs.Finish(), want) << "round " << round;
    // From a sparse table: entries for data clusters, and some listed zero ones.
    DigestTable t{cb, clusters.size() * uint64_t{cb}, {}};
    for (size_t i = 0; i < clusters.size(); ++i) {
      if (clusters[i] != z || rng() % 4 == 0) t.entries.push_back({i, clusters[i]});
    }
    EXPECT_EQ(ImageDigestOf(t, ImageDigestAlgorithm::kZeroRunFold), want) << "round " << round;
    // Version 1 is unchanged: the 16-byte fold of every cluster.
    ImageDigestBuilder v1;
    for (const auto& d : clusters) v1.Add(d);
    EXPECT_EQ(ImageDigestOf(t, ImageDigestAlgorithm::kClusterFold), v1.Finish()) << "round " << round;
  }
}

TEST(DigestTest, ZeroRunFoldOfAHugeThinDiskIsImmediate) {
  // 16 TiB of 64 KiB clusters (2^28) with two data clusters: folded from the
  // table in microseconds (the version 1 fold hashes 4 GiB for it).
  const uint32_t cb = 64 << 10;
  DigestTable t{cb, uint64_t{16} << 40, {{5, {1, 2}}, {(uint64_t{1} << 28) - 1, {3, 4}}}};
  auto start = std::chrono::steady_clock::now();
  Digest128 d = ImageDigestOf(t, ImageDigestAlgorithm::kZeroRunFold);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  ImageDigestBuilder b(ImageDigestAlgorithm::kZeroRunFold, cb);
  b.AddRepeated(ZeroClusterDigest(cb), 5);
  b.Add({1, 2});
  b.AddRepeated(ZeroClusterDigest(cb), (uint64_t{1} << 28) - 7);
  b.Add({3, 4});
  EXPECT_EQ(d, b.Finish());
  // A different run length is a different digest.
  t.virtual_size += cb;
  EXPECT_NE(ImageDigestOf(t, ImageDigestAlgorithm::kZeroRunFold), d);
}

TEST(DigestTest, HashClusterPadsShortCluster) {
  std::vector<std::byte> full(4096), short_one(1000);
  full[5] = short_one[5] = std::byte{7};
  EXPECT_EQ(HashCluster(short_one, 4096), HashCluster(full, 4096));
  EXPECT_EQ(HashCluster({}, 4096), ZeroClusterDigest(4096));
  EXPECT_NE(HashCluster(full, 4096), ZeroClusterDigest(4096));
  auto hex = HashCluster(full, 4096).ToHex();
  EXPECT_EQ(*Digest128::FromHex(hex), HashCluster(full, 4096));
}

}  // namespace
}  // namespace barge::formats
