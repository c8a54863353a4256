// Unit tests for snapshot metrics on in-memory images: the numbers of a
// fresh snapshot, `used` equals what a delete frees, compressed data gives
// a ratio above 1, and each L2 table is read once however many views share
// it.
#include "formats/qcow2_snapshot_metrics.h"

#include <gtest/gtest.h>

#include <map>

#include "blockio/memory.h"
#include "formats/qcow2_compress.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_refcount_shadow.h"
#include "formats/qcow2_snapshot_edit.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using Bytes = std::vector<std::byte>;
constexpr uint64_t kCs = 65536;

Bytes MakeImage(uint64_t size, uint64_t every, bool compressed = false) {
  Qcow2WriterOptions o;
  o.virtual_size = size;
  o.compression = compressed ? Compression::kZstd : Compression::kNone;
  MemorySink sink;
  auto w = Qcow2Writer::Create(sink, o);
  EXPECT_TRUE(w.ok());
  ClusterCompressor compressor(Compression::kZstd, 0);
  for (uint64_t c = 0; c < (*w)->cluster_count(); c += every) {
    Bytes data = testing::RandomBytes(kCs, c + 1);
    if (compressed) {
      for (uint64_t i = 0; i < kCs; ++i) data[i] = std::byte((c + i / 128) & 0xff);
      auto payload = compressor.Compress(data);
      EXPECT_TRUE(payload.ok() && payload->has_value());
      EXPECT_TRUE((*w)->WriteCompressed(c, **payload).ok());
    } else {
      EXPECT_TRUE((*w)->WriteData(c, data).ok());
    }
  }
  EXPECT_TRUE((*w)->Finish().ok());
  return sink.contents();
}

Bytes Apply(const Bytes& image, const std::function<Status(BlockSource&, BlockSink&)>& edit) {
  MemorySource source(image);
  MemorySink sink;
  EXPECT_TRUE(sink.WriteAt(0, image).ok());
  Status s = edit(source, sink);
  EXPECT_TRUE(s.ok()) << s.error().ToString();
  return sink.contents();
}

Bytes Create(const Bytes& image, const std::string& name) {
  return Apply(image, [&](BlockSource& f, BlockSink& k) -> Status {
    SnapshotCreateSpec spec;
    spec.name = name;
    auto r = CreateSnapshot(f, k, spec);
    return r.ok() ? OkStatus() : Status(r.error());
  });
}

Bytes Delete(const Bytes& image, const std::string& name) {
  return Apply(image, [&](BlockSource& f, BlockSink& k) -> Status {
    auto r = DeleteSnapshot(f, k, name);
    return r.ok() ? OkStatus() : Status(r.error());
  });
}

SnapshotMetricsReport Metrics(const Bytes& image) {
  MemorySource source(image);
  auto r = ComputeSnapshotMetrics(source);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  return r.ok() ? *r : SnapshotMetricsReport{};
}

// Clusters with a refcount above 0.
uint64_t InUse(const Bytes& bytes) {
  MemorySource source(bytes);
  auto h = qcow2::ReadHeader(source);
  qcow2::RefcountShadow rc(source, *h);
  EXPECT_TRUE(rc.Load().ok());
  uint64_t n = 0;
  for (uint64_t c = 0; c < qcow2::SizeToClusters(bytes.size(), h->cluster_bits); ++c) n += *rc.Get(c) > 0;
  return n;
}

TEST(SnapshotMetrics, FreshSnapshot) {
  // 4 MiB, data in every third cluster: 22 clusters, one L2 table.
  const Bytes image = Create(MakeImage(4 << 20, 3), "a");
  const SnapshotMetricsReport r = Metrics(image);
  EXPECT_EQ(r.cluster_size, kCs);
  ASSERT_EQ(r.snapshots.size(), 1u);
  const SnapshotUsage& a = r.snapshots[0].usage;
  EXPECT_EQ(r.snapshots[0].info.name, "a");
  EXPECT_EQ(a.vol_size, 4u << 20);
  EXPECT_EQ(a.logical_referenced, 22 * kCs);
  EXPECT_EQ(a.referenced, (22 + 1 + 1) * kCs);  // data, L2 table, L1 table
  EXPECT_EQ(a.written, 22 * kCs);
  // Its own L1 table and the L2 table it kept (the active image has a copy).
  EXPECT_EQ(a.used, 2 * kCs);
  EXPECT_DOUBLE_EQ(a.compress_ratio, 1.0);
  EXPECT_EQ(r.active.written, 0u);
  EXPECT_EQ(r.active.logical_referenced, 22 * kCs);
  EXPECT_EQ(r.active.used, 2 * kCs);
}

TEST(SnapshotMetrics, UsedIsWhatDeleteFrees) {
  Bytes image = MakeImage(8 << 20, 2);
  for (const char* name : {"a", "b", "c"}) image = Create(image, name);
  const SnapshotMetricsReport r = Metrics(image);
  ASSERT_EQ(r.snapshots.size(), 3u);
  for (const auto& s : r.snapshots) {
    SCOPED_TRACE(s.info.name);
    const Bytes after = Delete(image, s.info.name);
    EXPECT_EQ((InUse(image) - InUse(after)) * kCs, s.usage.used);
  }
  // Later snapshots of unchanged data write nothing new.
  EXPECT_EQ(r.snapshots[1].usage.written, 0u);
  EXPECT_EQ(r.snapshots[2].usage.written, 0u);
}

TEST(SnapshotMetrics, CompressedData) {
  const Bytes image = Create(MakeImage(2 << 20, 1, true), "a");
  const SnapshotMetricsReport r = Metrics(image);
  ASSERT_EQ(r.snapshots.size(), 1u);
  const SnapshotUsage& a = r.snapshots[0].usage;
  EXPECT_EQ(a.logical_referenced, 2u << 20);
  EXPECT_GT(a.compress_ratio, 4.0);
  EXPECT_LT(a.referenced, 1u << 20);
  EXPECT_EQ(a.written + 2 * kCs, a.referenced);  // data + L2 + L1
}

// Counts reads per offset.
class CountingSource final : public BlockSource {
 public:
  explicit CountingSource(BlockSource& target) : target_(target) {}
  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    ++reads[offset];
    return target_.ReadAt(offset, out);
  }
  std::map<uint64_t, int> reads;

 private:
  BlockSource& target_;
};

TEST(SnapshotMetrics, EachTableIsReadOnce) {
  Bytes image = MakeImage(64 << 20, 7);
  for (int i = 0; i < 10; ++i) image = Create(image, "s" + std::to_string(i));
  MemorySource source(image);
  CountingSource counting(source);
  auto r = ComputeSnapshotMetrics(counting);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->snapshots.size(), 10u);
  // The header (offset 0) is read for the magic and then parsed; every
  // table once.
  counting.reads.erase(0);
  for (const auto& [offset, n] : counting.reads) EXPECT_EQ(n, 1) << offset;
}

TEST(SnapshotMetrics, NotQcow2) {
  MemorySource raw(Bytes(1 << 20));
  auto r = ComputeSnapshotMetrics(raw);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotSupported);
}

}  // namespace
}  // namespace barge::formats
