// Tests of the copy pipeline's stages on their own (no TBB).
#include "pipeline/stages.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>

#include "blockio/fault.h"
#include "blockio/memory.h"
#include "pipeline/buffer_pool.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using formats::Compression;
using S = ClusterState;

constexpr uint32_t kCluster = 4096;
constexpr uint32_t kChunk = 4 * kCluster;

// 10 whole clusters and a short one of 1000 bytes:
//   0,1 data | 2,3 hole | 4 zero | 5 hole+zero | 6 hole+data | 7,8,9 hole | 10 data (short)
std::unique_ptr<MemorySource> PlannerSource() {
  const uint64_t size = 10 * kCluster + 1000;
  std::vector<std::byte> bytes = testing::RandomBytes(size, 7);
  ExtentList extents = {
      {0, 8192, ExtentKind::kData},      {8192, 8192, ExtentKind::kHole},
      {16384, 4096, ExtentKind::kZero},  {20480, 2048, ExtentKind::kHole},
      {22528, 2048, ExtentKind::kZero},  {24576, 2048, ExtentKind::kHole},
      {26624, 2048, ExtentKind::kData},  {28672, 12288, ExtentKind::kHole},
      {40960, 1000, ExtentKind::kData},
  };
  // Keep the bytes honest: holes and zeros read as zeros.
  for (const Extent& e : extents) {
    if (e.kind != ExtentKind::kData) std::memset(bytes.data() + e.offset, 0, e.length);
  }
  return std::make_unique<MemorySource>(std::move(bytes), std::move(extents), "planner-src");
}

std::vector<S> States(const Chunk& c) { return c.states; }

TEST(ChunkPlannerTest, ClassifiesHolesZerosAndPartialClusters) {
  auto source = PlannerSource();
  FaultSource counted(*source);
  ChunkPlanner planner(counted, {{0, source->size_bytes()}}, kCluster, kChunk);
  EXPECT_EQ(planner.work_bytes(), source->size_bytes());
  Chunk chunk(kChunk, kCluster, false);

  ASSERT_TRUE(*planner.Next(chunk));
  EXPECT_EQ(chunk.sequence, 0u);
  EXPECT_EQ(chunk.offset_bytes, 0u);
  EXPECT_EQ(chunk.length_bytes, kChunk);
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kData, S::kData, S::kHole, S::kHole}));

  ASSERT_TRUE(*planner.Next(chunk));
  EXPECT_EQ(chunk.sequence, 1u);
  EXPECT_EQ(chunk.offset_bytes, kChunk);
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kZero, S::kZero, S::kData, S::kHole}));

  ASSERT_TRUE(*planner.Next(chunk));
  EXPECT_EQ(chunk.sequence, 2u);
  EXPECT_EQ(chunk.offset_bytes, 2u * kChunk);
  EXPECT_EQ(chunk.length_bytes, 2u * kCluster + 1000);
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kHole, S::kHole, S::kData}));
  EXPECT_EQ(chunk.ClusterLength(2), 1000u);

  ASSERT_FALSE(*planner.Next(chunk));
  // The whole disk's extents in one query.
  EXPECT_EQ(counted.faults().calls(FaultOp::kExtents), 1u);
}

TEST(ChunkPlannerTest, SkipsWholeWindowsOfZerosAsOneRun) {
  // 2 data clusters, then holes and zeros for 32 MiB, data in the middle
  // of a window, then a hole to the end of the disk (not a whole window).
  const uint64_t size = (uint64_t{64} << 20) + 3 * kCluster + 100;
  const uint64_t mid = (uint64_t{32} << 20) + kCluster;  // cluster 1 of a window
  ExtentList extents = {
      {0, 2 * kCluster, ExtentKind::kData},
      {2 * kCluster, 1000 * kCluster, ExtentKind::kHole},
      {1002 * kCluster, mid - 1002 * kCluster, ExtentKind::kZero},
      {mid, kCluster, ExtentKind::kData},
      {mid + kCluster, size - mid - kCluster, ExtentKind::kHole},
  };
  MemorySource source(std::vector<std::byte>(size), std::move(extents), "thin");
  ChunkPlanner planner(source, {{0, size}}, kCluster, kChunk, uint64_t{1} << 30, /*skip_zero_extents=*/true);
  Chunk chunk(kChunk, kCluster, false);
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  uint64_t planned_clusters = 0;
  size_t chunks = 0;
  while (*planner.Next(chunk)) {
    ++chunks;
    if (chunk.zero_run_clusters() > 0) {
      EXPECT_EQ(chunk.length_bytes, 0u);
      runs.push_back({chunk.zero_run_begin, chunk.zero_run_end});
      continue;
    }
    for (S s : chunk.states) planned_clusters += s != S::kSkip;
  }
  const uint64_t clusters = (size + kCluster - 1) / kCluster;
  // Window 0 (data, data, hole, hole) is planned; then one run up to the
  // data cluster `mid` (its window is planned from there); then one run to
  // the end of the disk.
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0], (std::pair<uint64_t, uint64_t>{4, mid / kCluster}));
  EXPECT_EQ(runs[1], (std::pair<uint64_t, uint64_t>{mid / kCluster + 3, clusters}));
  EXPECT_EQ(planned_clusters + (runs[0].second - runs[0].first) + (runs[1].second - runs[1].first), clusters);
  EXPECT_LE(chunks, 5u);
}

TEST(ChunkPlannerTest, WorkSetSelectsWholeClusters) {
  auto source = PlannerSource();
  // Unaligned dirty ranges widen to clusters 1, 9 and 10.
  ChunkPlanner planner(*source, {{5000, 100}, {36864 + 10, 5000}}, kCluster, kChunk);
  EXPECT_EQ(planner.work_bytes(), kCluster + kCluster + 1000);
  Chunk chunk(kChunk, kCluster, false);
  ASSERT_TRUE(*planner.Next(chunk));
  EXPECT_EQ(chunk.offset_bytes, 0u);
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kSkip, S::kData, S::kSkip, S::kSkip}));
  ASSERT_TRUE(*planner.Next(chunk));
  EXPECT_EQ(chunk.sequence, 1u);  // sequence numbers stay dense
  EXPECT_EQ(chunk.offset_bytes, 2u * kChunk);
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kSkip, S::kHole, S::kData}));
  ASSERT_FALSE(*planner.Next(chunk));
}

TEST(ChunkPlannerTest, SourceWithoutExtentsIsAllData) {
  MemorySource source(std::vector<std::byte>(3 * kCluster + 17));
  ChunkPlanner planner(source, {{0, source.size_bytes()}}, kCluster, kChunk);
  Chunk chunk(kChunk, kCluster, false);
  ASSERT_TRUE(*planner.Next(chunk));
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kData, S::kData, S::kData, S::kData}));
  EXPECT_EQ(chunk.ClusterLength(3), 17u);
  ASSERT_FALSE(*planner.Next(chunk));
}

TEST(ChunkPlannerTest, ExtentsErrorIsReturned) {
  auto source = PlannerSource();
  FaultSource faulty(*source);
  faulty.faults().AddRule(FaultRule::Always(FaultOp::kExtents, EIO));
  ChunkPlanner planner(faulty, {{0, source->size_bytes()}}, kCluster, kChunk);
  Chunk chunk(kChunk, kCluster, false);
  auto r = planner.Next(chunk);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIoError);
  EXPECT_NE(r.error().message().find("extents"), std::string::npos) << r.error().ToString();
}

TEST(ReaderTest, ReadsOnlyDataRunsInOneRequestEach) {
  auto source = PlannerSource();
  FaultSource counted(*source);
  ChunkPlanner planner(*source, {{0, source->size_bytes()}}, kCluster, kChunk);
  Reader reader(counted);
  Chunk chunk(kChunk, kCluster, false);

  ASSERT_TRUE(*planner.Next(chunk));  // D D H H: one run of two clusters
  auto n = reader.Read(chunk);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u * kCluster);
  EXPECT_EQ(counted.faults().calls(FaultOp::kRead), 1u);
  EXPECT_EQ(0, std::memcmp(chunk.ClusterData(0).data(), source->bytes().data(), 2 * kCluster));

  ASSERT_TRUE(*planner.Next(chunk));  // Z Z D H
  ASSERT_TRUE(reader.Read(chunk).ok());
  EXPECT_EQ(counted.faults().calls(FaultOp::kRead), 2u);
  EXPECT_EQ(0, std::memcmp(chunk.ClusterData(2).data(), source->bytes().data() + 6 * kCluster, kCluster));

  ASSERT_TRUE(*planner.Next(chunk));  // H H D(short)
  n = reader.Read(chunk);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1000u);
  EXPECT_EQ(0, std::memcmp(chunk.ClusterData(2).data(), source->bytes().data() + 10 * kCluster, 1000));
}

TEST(ReaderTest, HintsTheSourceAheadOfThePass) {
  auto source = PlannerSource();
  testing::CallLog hinted(*source);
  ChunkPlanner planner(*source, {{0, source->size_bytes()}}, kCluster, kChunk);
  Reader reader(hinted);
  Chunk chunk(kChunk, kCluster, false);
  ASSERT_TRUE(*planner.Next(chunk));  // D D H H
  ASSERT_TRUE(reader.Read(chunk).ok());
  const auto hints = hinted.hints();
  ASSERT_EQ(hints.size(), 1u);
  EXPECT_EQ(hints[0].first, 2u * kCluster);  // from the end of the first read on
  EXPECT_GT(hints[0].second, hints[0].first);
  EXPECT_TRUE(hinted.calls().front().hint);  // the hint goes out before the read
}

TEST(ReaderTest, ErrorNamesTheOffset) {
  auto source = PlannerSource();
  FaultSource faulty(*source);
  faulty.faults().AddRule(FaultRule::Always(FaultOp::kRead, EIO));
  ChunkPlanner planner(*source, {{0, source->size_bytes()}}, kCluster, kChunk);
  Reader reader(faulty);
  Chunk chunk(kChunk, kCluster, false);
  ASSERT_TRUE(*planner.Next(chunk));
  ASSERT_TRUE(*planner.Next(chunk));
  auto n = reader.Read(chunk);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().errno_value(), EIO);
  ASSERT_TRUE(n.error().offset().has_value());
  EXPECT_EQ(*n.error().offset(), 6u * kCluster);
}

// A chunk of 4 clusters filled by hand: random, zero, compressible, short.
std::unique_ptr<Chunk> MakeProcessChunk(bool scratch) {
  auto owned = std::make_unique<Chunk>(kChunk, kCluster, scratch);
  Chunk& chunk = *owned;
  chunk.Reset(0, 0, 3 * kCluster + 100);
  auto random = testing::RandomBytes(kCluster, 3);
  std::memcpy(chunk.MutableClusterData(0).data(), random.data(), kCluster);
  std::memset(chunk.MutableClusterData(1).data(), 0, kCluster);
  for (size_t i = 0; i < kCluster; ++i) chunk.MutableClusterData(2)[i] = std::byte(i % 7);
  std::memset(chunk.MutableClusterData(3).data(), 0xab, 100);
  // Stale bytes past the end of the short cluster must not leak into it.
  std::memset(chunk.ClusterSlot(3).data() + 100, 0xcd, kCluster - 100);
  for (auto& s : chunk.states) s = S::kData;
  return owned;
}

TEST(ClusterProcessorTest, DetectsZeroAndHashes) {
  auto owned = MakeProcessChunk(false);
  Chunk& chunk = *owned;
  ClusterProcessor processor(kCluster);
  ProcessTimings timings;
  ASSERT_TRUE(processor.Process(chunk, nullptr, &timings).ok());
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kData, S::kZero, S::kData, S::kData}));
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(chunk.digests[i], formats::HashCluster(chunk.ClusterData(i), kCluster)) << i;
  }
  EXPECT_EQ(chunk.digests[1], formats::ZeroClusterDigest(kCluster));
}

TEST(ClusterProcessorTest, HolesAndZerosGetTheZeroDigestAndSkipNone) {
  Chunk chunk(kChunk, kCluster, false);
  chunk.Reset(0, 0, kChunk);
  chunk.states = {S::kSkip, S::kHole, S::kZero, S::kSkip};
  ClusterProcessor processor(kCluster);
  ASSERT_TRUE(processor.Process(chunk, nullptr).ok());
  EXPECT_EQ(chunk.digests[0], formats::Digest128{});
  EXPECT_EQ(chunk.digests[1], formats::ZeroClusterDigest(kCluster));
  EXPECT_EQ(chunk.digests[2], formats::ZeroClusterDigest(kCluster));
}

TEST(ClusterProcessorTest, CompressesWhereItPays) {
  auto owned = MakeProcessChunk(true);
  Chunk& chunk = *owned;
  ClusterProcessor processor(kCluster);
  formats::ClusterCompressor compressor(Compression::kZstd, 3);
  ProcessTimings timings;
  ASSERT_TRUE(processor.Process(chunk, &compressor, &timings).ok());
  // Random stays raw, zero is zero, pattern and short-padded compress.
  EXPECT_EQ(States(chunk), (std::vector<S>{S::kData, S::kZero, S::kCompressed, S::kCompressed}));
  EXPECT_EQ(timings.compressed_clusters, 2u);
  for (size_t i : {2u, 3u}) {
    std::vector<std::byte> out(kCluster);
    ASSERT_TRUE(formats::DecompressCluster(Compression::kZstd, chunk.Payload(i), out).ok());
    std::vector<std::byte> want(kCluster);
    std::memcpy(want.data(), chunk.ClusterData(i).data(), chunk.ClusterLength(i));
    EXPECT_EQ(out, want) << i;
    EXPECT_LE(chunk.payload_bytes[i], kCluster - 512);
  }
  // The digest of the short cluster is over its zero-padded bytes.
  EXPECT_EQ(chunk.digests[3], formats::HashCluster(chunk.ClusterData(3), kCluster));
}

TEST(VerifierTest, MismatchNamesTheFirstBadCluster) {
  auto owned = MakeProcessChunk(false);
  Chunk& chunk = *owned;
  chunk.Reset(5, 8 * kCluster, 3 * kCluster + 100);  // guest clusters 8..11
  chunk.states = {S::kData, S::kData, S::kData, S::kData};
  for (size_t i = 0; i < 4; ++i) chunk.digests[i] = formats::Digest128{i, i};
  Verifier ok([](uint64_t c) { return std::optional(formats::Digest128{c - 8, c - 8}); }, "src");
  EXPECT_TRUE(ok.Check(chunk).ok());
  Verifier bad(
      [](uint64_t c) {
        if (c == 9) return std::optional<formats::Digest128>();  // nothing to check
        if (c >= 10) return std::optional(formats::Digest128{99, 99});
        return std::optional(formats::Digest128{c - 8, c - 8});
      },
      "src");
  Status s = bad.Check(chunk);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.error().offset(), std::optional<uint64_t>(10 * kCluster));
  EXPECT_NE(s.error().message().find("0xa000"), std::string::npos) << s.error().ToString();
  EXPECT_EQ(s.error().path(), "src");
}

TEST(Sha512StreamTest, MatchesOneShotOverLogicalBytes) {
  auto owned = MakeProcessChunk(false);
  Chunk& chunk = *owned;
  chunk.states = {S::kData, S::kHole, S::kSkip, S::kData};
  // Hole bytes are stale in the buffer; the stream must use zeros.
  std::memset(chunk.MutableClusterData(1).data(), 0xee, kCluster);
  std::vector<std::byte> logical;
  auto append = [&](std::span<const std::byte> b) { logical.insert(logical.end(), b.begin(), b.end()); };
  append(chunk.ClusterData(0));
  logical.resize(logical.size() + kCluster);
  append(chunk.ClusterData(3));

  Sha512Stream stream;
  ASSERT_TRUE(stream.UpdateChunk(chunk).ok());
  auto hex = stream.FinishHex();
  ASSERT_TRUE(hex.ok());
  unsigned char md[64];
  unsigned int len = 0;
  ASSERT_EQ(1, EVP_Digest(logical.data(), logical.size(), md, &len, EVP_sha512(), nullptr));
  std::string want;
  for (unsigned i = 0; i < len; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", md[i]);
    want += b;
  }
  EXPECT_EQ(*hex, want);
}

TEST(BufferPoolTest, CountsAndReclaims) {
  auto pool = BufferPool::Create({1 << 16, 4096, true, 3});
  ASSERT_TRUE(pool.ok());
  BufferPool& p = **pool;
  EXPECT_EQ(p.capacity(), 3u);
  EXPECT_EQ(p.footprint_bytes(), 3u * 2 * (1 << 16));
  Chunk* a = p.TryAcquire();
  Chunk* b = p.TryAcquire();
  Chunk* c = p.TryAcquire();
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(p.TryAcquire(), nullptr);
  EXPECT_EQ(p.outstanding(), 3u);
  p.Release(b);
  EXPECT_EQ(p.outstanding(), 2u);
  EXPECT_EQ(p.ReclaimAll(), 2u);
  EXPECT_EQ(p.outstanding(), 0u);
  p.Release(a);  // already reclaimed: ignored
  EXPECT_EQ(p.outstanding(), 0u);
  EXPECT_EQ(p.high_water(), 3u);
  EXPECT_FALSE(BufferPool::Create({1000, 4096, false, 3}).ok());
}

}  // namespace
}  // namespace barge::pipeline
