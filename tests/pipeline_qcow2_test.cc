// RunCopy into qcow2 images (Qcow2Destination over a memory sink), checked
// with qemu-img: full backups, incrementals over a backing file, and fan-out
// to qcow2 and raw at once.
#include <gtest/gtest.h>

#include <cstring>

#include "blockio/memory.h"
#include "pipeline/copy.h"
#include "pipeline/destination.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;
// Not a multiple of the cluster size: the last cluster is short.
constexpr uint64_t kSize = 8 * kMiB + 25 * 512;

// Random and compressible data, a hole, a zero extent, zero bytes inside data.
struct Disk {
  std::vector<std::byte> bytes;
  ExtentList extents;
};

Disk MakeDisk(uint64_t seed) {
  Disk d;
  d.bytes = testing::RandomBytes(kSize, seed);
  for (uint64_t i = 3 * kMiB; i < 4 * kMiB; ++i) d.bytes[i] = std::byte((i / 100) % 5);  // compressible
  d.extents = {
      {0, 1 * kMiB, ExtentKind::kData},
      {1 * kMiB, 1 * kMiB, ExtentKind::kHole},
      {2 * kMiB, 2 * kMiB, ExtentKind::kData},
      {4 * kMiB, 512 << 10, ExtentKind::kZero},
      {4608 << 10, kSize - (4608 << 10), ExtentKind::kData},
  };
  for (const Extent& e : d.extents) {
    if (e.kind != ExtentKind::kData) std::memset(d.bytes.data() + e.offset, 0, e.length);
  }
  std::memset(d.bytes.data() + 6 * kMiB, 0, 192 << 10);
  return d;
}

formats::Qcow2WriterOptions WriterOptions() {
  formats::Qcow2WriterOptions o;
  o.virtual_size = kSize;
  o.cluster_bits = 16;
  o.compression = formats::Compression::kZstd;
  return o;
}

CopyOptions Options() {
  CopyOptions o;
  o.memory_bytes = 16 * kMiB;
  o.threads = 2;
  o.sha512 = true;
  return o;
}

void CheckAndCompare(const std::string& image, const std::string& raw) {
  RunOk("qemu-img check -q " + ShellQuote(image));
  RunOk("qemu-img compare -q -f qcow2 -F raw " + ShellQuote(image) + " " + ShellQuote(raw));
}

TEST(PipelineQcow2Test, FullBackupChecksAndCompares) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  Disk disk = MakeDisk(1);
  MemorySource source(disk.bytes, disk.extents, "disk");
  MemorySink sink;
  auto dest = Qcow2Destination::Create(sink, WriterOptions(), ZeroPolicy::kOmit);
  ASSERT_TRUE(dest.ok()) << dest.error().ToString();
  Destination* dests[] = {dest->get()};
  auto r = RunCopy(source, WholeDisk(source), dests, Options());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_GT(r->clusters.compressed, 0u);
  EXPECT_GT(r->clusters.data, 0u);

  testing::WriteFile(dir / "full.qcow2", sink.contents());
  testing::WriteFile(dir / "disk.raw", disk.bytes);
  CheckAndCompare(dir / "full.qcow2", dir / "disk.raw");
  std::string info = RunOk("qemu-img info " + ShellQuote(dir / "full.qcow2"));
  EXPECT_NE(info.find("zstd"), std::string::npos) << info;
  // Holes and zeros are not stored: the image is smaller than the data.
  auto stats = (*dest)->writer().stats();
  EXPECT_EQ(stats.zero_clusters, 0u);
  EXPECT_EQ(stats.data_clusters + stats.compressed_clusters, r->clusters.data + r->clusters.compressed);
  EXPECT_LT(sink.size_bytes(), kSize);
  // The SHA-512 is the one of the raw disk as sha512sum sees it.
  std::string sum = RunOk("sha512sum " + ShellQuote(dir / "disk.raw"));
  EXPECT_EQ(sum.substr(0, 128), r->sha512_hex);
}

TEST(PipelineQcow2Test, IncrementalMasksZeroedClustersOverBacking) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  Disk before = MakeDisk(1);
  // The full backup of `before`.
  {
    MemorySource source(before.bytes, before.extents, "disk");
    MemorySink sink;
    auto dest = Qcow2Destination::Create(sink, WriterOptions(), ZeroPolicy::kOmit);
    ASSERT_TRUE(dest.ok());
    Destination* dests[] = {dest->get()};
    ASSERT_TRUE(RunCopy(source, WholeDisk(source), dests, Options()).ok());
    testing::WriteFile(dir / "full.qcow2", sink.contents());
  }
  // The guest then rewrites [512K, 640K), zeroes [2M, 2M+128K) (a zero
  // extent) and discards [3M, 3M+64K) (a hole).
  Disk after = before;
  auto fresh = testing::RandomBytes(128 << 10, 77);
  std::memcpy(after.bytes.data() + (512 << 10), fresh.data(), fresh.size());
  std::memset(after.bytes.data() + 2 * kMiB, 0, 128 << 10);
  std::memset(after.bytes.data() + 3 * kMiB, 0, 64 << 10);
  after.extents = {
      {0, 1 * kMiB, ExtentKind::kData},
      {1 * kMiB, 1 * kMiB, ExtentKind::kHole},
      {2 * kMiB, 128 << 10, ExtentKind::kZero},
      {(2 * kMiB) + (128 << 10), kMiB - (128 << 10), ExtentKind::kData},
      {3 * kMiB, 64 << 10, ExtentKind::kHole},
      {(3 * kMiB) + (64 << 10), kMiB - (64 << 10), ExtentKind::kData},
      {4 * kMiB, 512 << 10, ExtentKind::kZero},
      {4608 << 10, kSize - (4608 << 10), ExtentKind::kData},
  };
  RangeList dirty = {{512 << 10, 128 << 10}, {2 * kMiB, 128 << 10}, {3 * kMiB, 64 << 10}};

  MemorySource source(after.bytes, after.extents, "disk");
  MemorySink sink;
  formats::Qcow2WriterOptions wo = WriterOptions();
  wo.backing_file = "full.qcow2";
  wo.backing_format = "qcow2";
  auto dest = Qcow2Destination::Create(sink, wo, ZeroPolicy::kZeroCluster);
  ASSERT_TRUE(dest.ok()) << dest.error().ToString();
  Destination* dests[] = {dest->get()};
  CopyOptions o = Options();
  o.record_zero_digests = true;
  auto r = RunCopy(source, dirty, dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->clusters.data + r->clusters.compressed, 2u);
  EXPECT_EQ(r->clusters.zero, 2u);
  EXPECT_EQ(r->clusters.hole, 1u);
  EXPECT_EQ((*dest)->writer().stats().zero_clusters, 3u);
  EXPECT_EQ(r->cluster_digests.size(), 5u);

  testing::WriteFile(dir / "inc.qcow2", sink.contents());
  testing::WriteFile(dir / "after.raw", after.bytes);
  CheckAndCompare(dir / "inc.qcow2", dir / "after.raw");
}

TEST(PipelineQcow2Test, FanOutToQcow2AndRaw) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  Disk disk = MakeDisk(3);
  MemorySource source(disk.bytes, disk.extents, "disk");
  MemorySink qsink, rsink;
  auto q = Qcow2Destination::Create(qsink, WriterOptions(), ZeroPolicy::kOmit);
  ASSERT_TRUE(q.ok());
  RawDestination raw(rsink, {kSize});
  Destination* dests[] = {q->get(), &raw};
  auto r = RunCopy(source, WholeDisk(source), dests, Options());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(rsink.contents(), disk.bytes);
  testing::WriteFile(dir / "copy.qcow2", qsink.contents());
  testing::WriteFile(dir / "copy.raw", rsink.contents());
  CheckAndCompare(dir / "copy.qcow2", dir / "copy.raw");
}

}  // namespace
}  // namespace barge::pipeline
