// Tests for per-cluster zstd and raw-deflate compression (QCOW2.md §4).
#include "formats/qcow2_compress.h"

#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>
#include <vector>

#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

// Compressible data: a repeated random 64-byte pattern with a counter.
std::vector<std::byte> Compressible(size_t n, uint64_t seed) {
  std::vector<std::byte> pattern = testing::RandomBytes(64, seed);
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = pattern[i % 64] ^ std::byte(i / 4096);
  return out;
}

class CompressTest : public ::testing::TestWithParam<Compression> {};

TEST_P(CompressTest, RoundTripsEveryClusterSize) {
  for (uint32_t bits = 9; bits <= 21; ++bits) {
    size_t cs = size_t{1} << bits;
    ClusterCompressor compressor(GetParam(), 0);
    std::vector<std::byte> cluster = Compressible(cs, bits);
    auto payload = compressor.Compress(cluster);
    ASSERT_TRUE(payload.ok()) << payload.error().ToString();
    if (bits == 9) {
      // Nothing can save a sector of a 512-byte cluster.
      EXPECT_FALSE(payload->has_value());
      continue;
    }
    ASSERT_TRUE(payload->has_value()) << "cluster bits " << bits;
    ASSERT_LE((*payload)->size(), cs - 512);
    std::vector<std::byte> copy((*payload)->begin(), (*payload)->end());
    std::vector<std::byte> out(cs);
    Status st = DecompressCluster(GetParam(), copy, out);
    ASSERT_TRUE(st.ok()) << st.error().ToString();
    EXPECT_EQ(out, cluster) << "cluster bits " << bits;
  }
}

TEST_P(CompressTest, AllZeroClusterRoundTrips) {
  std::vector<std::byte> cluster(65536);
  ClusterCompressor compressor(GetParam(), 0);
  auto payload = compressor.Compress(cluster);
  ASSERT_TRUE(payload.ok());
  ASSERT_TRUE(payload->has_value());
  EXPECT_LT((*payload)->size(), 1024u);
  std::vector<std::byte> out(65536, std::byte{1});
  ASSERT_TRUE(DecompressCluster(GetParam(), **payload, out).ok());
  EXPECT_EQ(out, cluster);
}

TEST_P(CompressTest, IncompressibleGivesNullopt) {
  for (uint32_t bits : {9u, 12u, 16u, 21u}) {
    ClusterCompressor compressor(GetParam(), 0);
    auto payload = compressor.Compress(testing::RandomBytes(size_t{1} << bits, bits));
    ASSERT_TRUE(payload.ok());
    EXPECT_FALSE(payload->has_value()) << "cluster bits " << bits;
  }
}

TEST_P(CompressTest, CompressorIsReusable) {
  ClusterCompressor compressor(GetParam(), 0);
  for (uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<std::byte> cluster = Compressible(4096, seed);
    auto payload = compressor.Compress(cluster);
    ASSERT_TRUE(payload.ok());
    ASSERT_TRUE(payload->has_value());
    std::vector<std::byte> out(4096);
    ASSERT_TRUE(DecompressCluster(GetParam(), **payload, out).ok());
    EXPECT_EQ(out, cluster);
    // An incompressible cluster in between must not disturb the next one.
    auto raw = compressor.Compress(testing::RandomBytes(4096, seed + 100));
    ASSERT_TRUE(raw.ok());
    EXPECT_FALSE(raw->has_value());
  }
}

TEST_P(CompressTest, TrailingJunkIsIgnored) {
  size_t cs = 65536;
  std::vector<std::byte> cluster = Compressible(cs, 7);
  ClusterCompressor compressor(GetParam(), 0);
  auto payload = compressor.Compress(cluster);
  ASSERT_TRUE(payload.ok());
  ASSERT_TRUE(payload->has_value());
  // Sector-rounded read range: the payload, then bytes of the next payload.
  std::vector<std::byte> range((*payload)->begin(), (*payload)->end());
  std::vector<std::byte> junk = testing::RandomBytes(700, 99);
  range.insert(range.end(), junk.begin(), junk.end());
  std::vector<std::byte> out(cs);
  Status st = DecompressCluster(GetParam(), range, out);
  ASSERT_TRUE(st.ok()) << st.error().ToString();
  EXPECT_EQ(out, cluster);
}

TEST_P(CompressTest, GarbageIsCorruption) {
  std::vector<std::byte> out(65536);
  std::vector<std::byte> garbage = testing::RandomBytes(1000, 5);
  Status st = DecompressCluster(GetParam(), garbage, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kCorruption);
}

TEST_P(CompressTest, TruncatedPayloadIsCorruption) {
  std::vector<std::byte> cluster = Compressible(65536, 3);
  ClusterCompressor compressor(GetParam(), 0);
  auto payload = compressor.Compress(cluster);
  ASSERT_TRUE(payload.ok());
  ASSERT_TRUE(payload->has_value());
  std::vector<std::byte> half((*payload)->begin(), (*payload)->begin() + (*payload)->size() / 2);
  std::vector<std::byte> out(65536);
  Status st = DecompressCluster(GetParam(), half, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kCorruption);
}

TEST_P(CompressTest, ShortStreamIsCorruption) {
  // A payload for a 4 KiB cluster cannot fill a 64 KiB one.
  std::vector<std::byte> cluster = Compressible(4096, 3);
  ClusterCompressor compressor(GetParam(), 0);
  auto payload = compressor.Compress(cluster);
  ASSERT_TRUE(payload.ok());
  ASSERT_TRUE(payload->has_value());
  std::vector<std::byte> out(65536);
  Status st = DecompressCluster(GetParam(), **payload, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kCorruption);
}

TEST_P(CompressTest, EmptyPayloadIsCorruption) {
  std::vector<std::byte> out(4096);
  Status st = DecompressCluster(GetParam(), {}, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kCorruption);
}

// CompressInto writes the same payload as Compress straight into the
// caller's buffer; a buffer too small for it means "store raw" (0), and one
// context compresses many clusters in a row with the same result each time.
TEST_P(CompressTest, CompressIntoMatchesCompressAndRespectsTheBuffer) {
  ClusterCompressor a(GetParam(), 0);
  ClusterCompressor b(GetParam(), 0);
  for (uint64_t seed = 0; seed < 6; ++seed) {
    std::vector<std::byte> cluster =
        seed % 3 == 2 ? testing::RandomBytes(65536, seed) : Compressible(65536, seed);
    auto want = a.Compress(cluster);
    ASSERT_TRUE(want.ok());
    std::vector<std::byte> slot(65536, std::byte{0xee});
    auto n = b.CompressInto(cluster, slot);
    ASSERT_TRUE(n.ok()) << n.error().ToString();
    if (!want->has_value()) {
      EXPECT_EQ(*n, 0u) << "seed " << seed;
      continue;
    }
    ASSERT_EQ(*n, (*want)->size()) << "seed " << seed;
    EXPECT_EQ(0, std::memcmp(slot.data(), (*want)->data(), *n));
    std::vector<std::byte> out(65536);
    ASSERT_TRUE(DecompressCluster(GetParam(), std::span<const std::byte>(slot.data(), *n), out).ok());
    EXPECT_EQ(out, cluster);
    // One byte short of the payload: refused, not truncated.
    std::vector<std::byte> tight(*n - 1);
    auto none = b.CompressInto(cluster, tight);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(*none, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CompressTest,
                         ::testing::Values(Compression::kZstd, Compression::kDeflate),
                         [](const auto& info) {
                           return info.param == Compression::kZstd ? "Zstd" : "Deflate";
                         });

TEST(CompressFormatTest, ZstdPayloadIsOneFrameWithContentSize) {
  std::vector<std::byte> cluster = Compressible(65536, 1);
  ClusterCompressor compressor(Compression::kZstd, 3);
  auto payload = compressor.Compress(cluster);
  ASSERT_TRUE(payload.ok());
  ASSERT_TRUE(payload->has_value());
  const std::byte* p = (*payload)->data();
  EXPECT_EQ(p[0], std::byte{0x28});
  EXPECT_EQ(p[1], std::byte{0xb5});
  EXPECT_EQ(p[2], std::byte{0x2f});
  EXPECT_EQ(p[3], std::byte{0xfd});
  // Frame header descriptor: no checksum (bit 2), content size present
  // (bits 6-7 non-zero, or single-segment with bit 5).
  uint8_t fhd = uint8_t(p[4]);
  EXPECT_EQ(fhd & 0x04, 0);
  EXPECT_TRUE((fhd & 0xc0) != 0 || (fhd & 0x20) != 0);
}

// A frame that declares a 32 MiB window and no content size (a crafted
// image's payload) is refused instead of making the decoder allocate it.
TEST(CompressFormatTest, ZstdFrameWithHugeWindowIsCorruption) {
  std::vector<std::byte> cluster = Compressible(65536, 4);
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ASSERT_NE(c, nullptr);
  ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, 25);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 0);
  std::vector<std::byte> frame(ZSTD_compressBound(cluster.size()));
  ZSTD_outBuffer o{frame.data(), frame.size(), 0};
  ZSTD_inBuffer in{cluster.data(), cluster.size(), 0};
  // Streaming in two steps: the size is not known when the header is made.
  ASSERT_FALSE(ZSTD_isError(ZSTD_compressStream2(c, &o, &in, ZSTD_e_continue)));
  size_t left = 0;
  do {
    left = ZSTD_compressStream2(c, &o, &in, ZSTD_e_end);
    ASSERT_FALSE(ZSTD_isError(left));
  } while (left != 0);
  ZSTD_freeCCtx(c);
  frame.resize(o.pos);
  // The same bytes decode with a window zstd allows by default.
  std::vector<std::byte> check(65536);
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ZSTD_inBuffer din{frame.data(), frame.size(), 0};
  ZSTD_outBuffer dout{check.data(), check.size(), 0};
  EXPECT_FALSE(ZSTD_isError(ZSTD_decompressStream(d, &dout, &din)));
  ZSTD_freeDCtx(d);
  EXPECT_EQ(check, cluster);

  std::vector<std::byte> out(65536);
  Status st = DecompressCluster(Compression::kZstd, frame, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kCorruption);
}

TEST(CompressFormatTest, DeflateHasNoZlibHeader) {
  std::vector<std::byte> cluster = Compressible(65536, 1);
  ClusterCompressor compressor(Compression::kDeflate, 6);
  auto payload = compressor.Compress(cluster);
  ASSERT_TRUE(payload.ok());
  ASSERT_TRUE(payload->has_value());
  // A zlib stream would start with 0x78; raw deflate here does not decode as
  // zstd and does decode as raw deflate.
  std::vector<std::byte> out(65536);
  EXPECT_FALSE(DecompressCluster(Compression::kZstd, **payload, out).ok());
  EXPECT_TRUE(DecompressCluster(Compression::kDeflate, **payload, out).ok());
}

TEST(CompressFormatTest, NoneNeverCompresses) {
  ClusterCompressor compressor(Compression::kNone, 0);
  auto payload = compressor.Compress(std::vector<std::byte>(65536));
  ASSERT_TRUE(payload.ok());
  EXPECT_FALSE(payload->has_value());
  std::vector<std::byte> out(16);
  EXPECT_FALSE(DecompressCluster(Compression::kNone, {}, out).ok());
}

}  // namespace
}  // namespace barge::formats
