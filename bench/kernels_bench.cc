// Micro-benchmarks: zero detection, xxh3-128 cluster digests, SHA-512 and
// zstd/deflate cluster compression on 64 KiB clusters of mixed content.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "blockio/buffer.h"
#include "blockio/extent.h"
#include "formats/digest.h"
#include "formats/qcow2_compress.h"
#include "pipeline/stages.h"

namespace {

constexpr uint32_t kCluster = 64 << 10;

// Half random bytes, half repeated text: a typical compressible cluster.
std::vector<std::byte> MixedCluster() {
  std::vector<std::byte> v(kCluster);
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < kCluster / 2; ++i) v[i] = std::byte(rng());
  const char* text = "barge benchmark text line, fairly compressible. ";
  for (size_t i = kCluster / 2; i < kCluster; ++i) v[i] = std::byte(text[i % 48]);
  return v;
}

void BM_ZeroDetect(benchmark::State& state) {
  std::vector<std::byte> zeros(kCluster);
  for (auto _ : state) benchmark::DoNotOptimize(barge::IsAllZero(zeros));
  state.SetBytesProcessed(state.iterations() * kCluster);
}
BENCHMARK(BM_ZeroDetect);

void BM_Xxh3Cluster(benchmark::State& state) {
  auto c = MixedCluster();
  for (auto _ : state) benchmark::DoNotOptimize(barge::formats::HashCluster(c, kCluster));
  state.SetBytesProcessed(state.iterations() * kCluster);
}
BENCHMARK(BM_Xxh3Cluster);

void BM_Sha512(benchmark::State& state) {
  auto c = MixedCluster();
  barge::pipeline::Sha512Stream sha;
  for (auto _ : state) benchmark::DoNotOptimize(sha.Update(c).ok());
  state.SetBytesProcessed(state.iterations() * kCluster);
}
BENCHMARK(BM_Sha512);

void BM_Compress(benchmark::State& state, barge::formats::Compression type, int level) {
  auto c = MixedCluster();
  barge::formats::ClusterCompressor compressor(type, level);
  for (auto _ : state) benchmark::DoNotOptimize(compressor.Compress(c));
  state.SetBytesProcessed(state.iterations() * kCluster);
}
BENCHMARK_CAPTURE(BM_Compress, zstd1, barge::formats::Compression::kZstd, 1);
BENCHMARK_CAPTURE(BM_Compress, zstd3, barge::formats::Compression::kZstd, 3);
BENCHMARK_CAPTURE(BM_Compress, deflate6, barge::formats::Compression::kDeflate, 6);

void BM_NormalizeRanges(benchmark::State& state) {
  std::mt19937_64 rng(7);
  barge::RangeList ranges;
  for (int i = 0; i < 100000; ++i) ranges.push_back({rng() % (1ull << 40), rng() % (1 << 20)});
  for (auto _ : state) benchmark::DoNotOptimize(barge::NormalizeRanges(ranges));
  state.SetItemsProcessed(state.iterations() * 100000);
}
BENCHMARK(BM_NormalizeRanges);

}  // namespace

BENCHMARK_MAIN();
