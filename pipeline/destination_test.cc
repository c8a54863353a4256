// Tests of the destinations alone: which calls each makes for each cluster
// state (a fake qcow2 writer logs them), raw coalescing, digest folding.
#include "pipeline/destination.h"

#include <gtest/gtest.h>

#include <cstring>

#include "blockio/memory.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using S = ClusterState;
constexpr uint32_t kCluster = 4096;
constexpr uint32_t kChunk = 8 * kCluster;

class FakeWriter final : public formats::Qcow2Writer {
 public:
  uint32_t cluster_size() const override { return kCluster; }
  uint64_t cluster_count() const override { return 100; }
  Status WriteData(uint64_t c, std::span<const std::byte> d) override {
    log.push_back("data " + std::to_string(c) + " " + std::to_string(d.size()));
    return OkStatus();
  }
  Status WriteCompressed(uint64_t c, std::span<const std::byte> p) override {
    log.push_back("compressed " + std::to_string(c) + " " + std::to_string(p.size()));
    return OkStatus();
  }
  Status WriteZero(uint64_t c) override {
    log.push_back("zero " + std::to_string(c));
    return OkStatus();
  }
  Status Finish() override {
    log.push_back("finish");
    return OkStatus();
  }
  formats::Qcow2WriterStats stats() const override { return {}; }
  std::vector<std::string> log;
};

// Guest clusters 8..15: skip hole zero data compressed data(short) ...
std::unique_ptr<Chunk> MixedChunk() {
  auto c = std::make_unique<Chunk>(kChunk, kCluster, true);
  c->Reset(3, kChunk, 5 * kCluster + 100);
  c->states = {S::kSkip, S::kHole, S::kZero, S::kData, S::kCompressed, S::kData};
  c->payload_bytes[4] = 77;
  auto bytes = testing::RandomBytes(kChunk, 1);
  std::memcpy(c->WindowBytes(0, kChunk).data(), bytes.data(), kChunk);
  for (size_t i = 0; i < c->cluster_count(); ++i) c->digests[i] = formats::Digest128{i + 1, 0};
  return c;
}

TEST(Qcow2DestinationTest, OmitPolicyStoresDataAndPayloads) {
  auto writer = std::make_unique<FakeWriter>();
  FakeWriter* w = writer.get();
  Qcow2Destination dest(std::move(writer), "img", formats::Compression::kZstd, ZeroPolicy::kOmit);
  EXPECT_TRUE(dest.wants_compression());
  auto chunk = MixedChunk();
  ASSERT_TRUE(dest.Consume(*chunk).ok());
  EXPECT_EQ(w->log, (std::vector<std::string>{"data 11 4096", "compressed 12 77", "data 13 100"}));
}

TEST(Qcow2DestinationTest, ZeroClusterPolicyMasksHolesAndZeros) {
  auto writer = std::make_unique<FakeWriter>();
  FakeWriter* w = writer.get();
  Qcow2Destination dest(std::move(writer), "img", formats::Compression::kNone, ZeroPolicy::kZeroCluster);
  EXPECT_FALSE(dest.wants_compression());
  auto chunk = MixedChunk();
  ASSERT_TRUE(dest.Consume(*chunk).ok());
  // Without compression a payload is ignored and the cluster stored raw.
  EXPECT_EQ(w->log, (std::vector<std::string>{"zero 9", "zero 10", "data 11 4096", "data 12 4096",
                                              "data 13 100"}));
  ASSERT_TRUE(dest.Finish().ok());
  EXPECT_EQ(w->log.back(), "finish");
}

TEST(RawDestinationTest, CoalescesDataRunsAndSkipsZeroes) {
  MemorySink sink;
  RawDestination dest(sink, {2 * kChunk});
  auto chunk = MixedChunk();
  ASSERT_TRUE(dest.Consume(*chunk).ok());
  ASSERT_TRUE(dest.Finish().ok());
  // Clusters 11..13 (data, compressed, short data) in one write.
  EXPECT_EQ(sink.ops(), (std::vector<SinkOp>{{SinkOp::Kind::kWrite, kChunk + 3 * kCluster, 2 * kCluster + 100},
                                             {SinkOp::Kind::kTruncate, 2 * kChunk, 0},
                                             {SinkOp::Kind::kFlush, 0, 0}}));
}

TEST(RawDestinationTest, WritesZeroesWhenAsked) {
  MemorySink sink;
  RawDestination dest(sink, {2 * kChunk, false});
  auto chunk = MixedChunk();
  ASSERT_TRUE(dest.Consume(*chunk).ok());
  EXPECT_EQ(sink.ops(), (std::vector<SinkOp>{{SinkOp::Kind::kZero, kChunk + kCluster, 2 * kCluster},
                                             {SinkOp::Kind::kWrite, kChunk + 3 * kCluster, 2 * kCluster + 100}}));
}

TEST(DigestCollectorTest, FoldsWholeDiskInOrder) {
  // Disk of 14 clusters (the chunk covers 8..13); others from the base.
  DigestCollectorOptions o;
  o.virtual_size = 13 * kCluster + 100;
  o.cluster_bytes = kCluster;
  o.algorithm = formats::ImageDigestAlgorithm::kClusterFold;
  o.base = [](uint64_t c) -> std::optional<formats::Digest128> {
    if (c % 2) return formats::Digest128{100 + c, 7};
    return std::nullopt;  // zero
  };
  DigestCollector collector(o);
  auto chunk = MixedChunk();
  ASSERT_TRUE(collector.Consume(*chunk).ok());
  ASSERT_TRUE(collector.Finish().ok());

  formats::ImageDigestBuilder want;
  formats::Digest128 zero = formats::ZeroClusterDigest(kCluster);
  for (uint64_t c = 0; c < 14; ++c) {
    if (c >= 9 && c <= 13) want.Add(chunk->digests[c - 8]);
    else want.Add(c % 2 ? formats::Digest128{100 + c, 7} : zero);
  }
  EXPECT_EQ(collector.image_digest(), want.Finish());
  EXPECT_EQ(collector.cluster_digests(),
            (std::vector<ClusterDigest>{{11, chunk->digests[3]}, {12, chunk->digests[4]}, {13, chunk->digests[5]}}));
}

TEST(DigestCollectorTest, ZeroRunFoldJumpsBetweenBaseEntriesAndFoldsSkippedRuns) {
  // 2^30 clusters: base entries at 3 and 2^29; a skipped zero run over
  // [10, 2^29 + 5) masks the base's entry there; the chunk covers 8..13 of
  // a window placed at the end. Constant time in the disk's size.
  const uint64_t clusters = uint64_t{1} << 30;
  DigestCollectorOptions o;
  o.virtual_size = clusters * kCluster;
  o.cluster_bytes = kCluster;
  o.algorithm = formats::ImageDigestAlgorithm::kZeroRunFold;
  const uint64_t far = uint64_t{1} << 29;
  uint64_t lookups = 0;
  o.base = [&](uint64_t c) -> std::optional<formats::Digest128> {
    ++lookups;
    if (c == 3 || c == far) return formats::Digest128{c, 9};
    return std::nullopt;
  };
  o.base_next = [&](uint64_t c) -> uint64_t { return c <= 3 ? 3 : c <= far ? far : UINT64_MAX; };
  DigestCollector collector(o);
  Chunk run(kChunk, kCluster, false);
  run.Reset(0, (far + 5) * kCluster, 0);
  run.zero_run_begin = 10;
  run.zero_run_end = far + 5;
  ASSERT_TRUE(collector.Consume(run).ok());
  ASSERT_TRUE(collector.Finish().ok());
  EXPECT_LE(lookups, 4u);

  formats::Digest128 zero = formats::ZeroClusterDigest(kCluster);
  formats::ImageDigestBuilder want(formats::ImageDigestAlgorithm::kZeroRunFold, kCluster);
  want.AddRepeated(zero, 3);
  want.Add({3, 9});
  want.AddRepeated(zero, clusters - 4);
  EXPECT_EQ(collector.image_digest(), want.Finish());
}

}  // namespace
}  // namespace barge::pipeline
