// MapImage (barge map's merged extents) and CompareImages (barge compare's
// first difference) on images built in memory.
#include "pipeline/image_inspect.h"

#include <gtest/gtest.h>

#include <memory>

#include "blockio/memory.h"

namespace barge::pipeline {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// An image whose Map answers from a fixed list (each extent returned by
// the window it starts in), recording the windows asked for.
class FakeImage final : public formats::Image {
 public:
  FakeImage(std::string path, formats::ImageFormat format, uint64_t size, const FakeImage* backing = nullptr)
      : backing_(backing) {
    info_.path = std::move(path);
    info_.format = format;
    info_.virtual_size = size;
  }
  formats::ImageInfo& mutable_info() { return info_; }
  void Add(formats::MappedExtent e) { extents_.push_back(e); }
  const std::vector<std::pair<uint64_t, uint64_t>>& windows() const { return windows_; }

  const std::string& name() const override { return info_.path; }
  uint64_t size_bytes() const override { return info_.virtual_size; }
  Status ReadAt(uint64_t, std::span<std::byte> out) override {
    std::fill(out.begin(), out.end(), std::byte{0});
    return OkStatus();
  }
  const formats::ImageInfo& info() const override { return info_; }
  const Image* backing() const override { return backing_; }
  Result<std::vector<formats::MappedExtent>> Map(uint64_t offset, uint64_t length) override {
    windows_.emplace_back(offset, length);
    std::vector<formats::MappedExtent> out;
    for (const auto& e : extents_) {
      if (e.offset >= offset && e.offset < offset + length) out.push_back(e);
    }
    return out;
  }

 private:
  formats::ImageInfo info_;
  const FakeImage* backing_;
  std::vector<formats::MappedExtent> extents_;
  std::vector<std::pair<uint64_t, uint64_t>> windows_;
};

formats::MappedExtent Mapped(uint64_t offset, uint64_t length, ExtentKind kind, int depth,
                             std::optional<uint64_t> host = std::nullopt, bool compressed = false) {
  formats::MappedExtent e;
  e.offset = offset;
  e.length = length;
  e.kind = kind;
  e.depth = depth;
  e.host_offset = host;
  e.compressed = compressed;
  return e;
}

TEST(MapImageTest, NeighboursThatLookTheSameMergeAcrossWindows) {
  FakeImage base("/d/base.raw", formats::ImageFormat::kRaw, 4ull << 30);
  FakeImage top("/d/top.qcow2", formats::ImageFormat::kQcow2, 4ull << 30, &base);
  ASSERT_EQ(BackingChain(top), (std::vector<const formats::Image*>{&top, &base}));
  // Two data extents with adjacent host offsets, either side of the first
  // 1 GiB window's end: one entry.
  top.Add(Mapped((1ull << 30) - kMiB, kMiB, ExtentKind::kData, 0, 10 * kMiB));
  top.Add(Mapped(1ull << 30, kMiB, ExtentKind::kData, 0, 11 * kMiB));
  // Adjacent guest range but a host gap: a new entry.
  top.Add(Mapped((1ull << 30) + kMiB, kMiB, ExtentKind::kData, 0, 50 * kMiB));
  // The same host run, but compressed: a new entry.
  top.Add(Mapped((1ull << 30) + 2 * kMiB, kMiB, ExtentKind::kData, 0, 51 * kMiB, true));
  // A qcow2 zero cluster, then the raw base's hole (present zeros at their
  // own offset, in base's file), then a hole of the whole chain (depth -1:
  // the bottom layer answers, and for a raw bottom it is present).
  top.Add(Mapped((1ull << 30) + 3 * kMiB, kMiB, ExtentKind::kZero, 0));
  top.Add(Mapped((1ull << 30) + 4 * kMiB, kMiB, ExtentKind::kHole, 1));
  top.Add(Mapped((1ull << 30) + 5 * kMiB, kMiB, ExtentKind::kHole, -1));

  auto map = MapImage(top);
  ASSERT_TRUE(map.ok()) << map.error().ToString();
  EXPECT_EQ(top.windows().size(), 4u);
  ASSERT_EQ(map->size(), 5u);
  const MapEntry& data = (*map)[0];
  EXPECT_EQ(data.start, (1ull << 30) - kMiB);
  EXPECT_EQ(data.length, 2 * kMiB);
  EXPECT_TRUE(data.data && data.present && !data.zero && !data.compressed);
  EXPECT_EQ(data.offset, 10 * kMiB);
  EXPECT_EQ(data.file, "/d/top.qcow2");
  EXPECT_EQ((*map)[1].offset, 50 * kMiB);
  EXPECT_EQ((*map)[1].length, kMiB);
  EXPECT_TRUE((*map)[2].compressed);
  const MapEntry& zero = (*map)[3];
  EXPECT_TRUE(zero.present && zero.zero && !zero.data);
  EXPECT_FALSE(zero.offset);
  EXPECT_EQ(zero.file, "");
  const MapEntry& raw_hole = (*map)[4];
  EXPECT_EQ(raw_hole.depth, 1);
  EXPECT_EQ(raw_hole.start, (1ull << 30) + 4 * kMiB);
  EXPECT_EQ(raw_hole.length, 2 * kMiB);  // depth 1 and depth -1 are both base
  EXPECT_TRUE(raw_hole.present && raw_hole.zero);
  EXPECT_EQ(raw_hole.offset, (1ull << 30) + 4 * kMiB);
  EXPECT_EQ(raw_hole.file, "/d/base.raw");
}

TEST(MapImageTest, AQcow2HoleIsNotPresentAndADataFileIsNamed) {
  FakeImage top("/d/top.qcow2", formats::ImageFormat::kQcow2, 8 * kMiB);
  top.mutable_info().data_file = "top.data";
  top.mutable_info().data_file_path = "/d/top.data";
  top.Add(Mapped(0, kMiB, ExtentKind::kData, 0, 0));
  top.Add(Mapped(kMiB, 7 * kMiB, ExtentKind::kHole, -1));
  auto map = MapImage(top);
  ASSERT_TRUE(map.ok()) << map.error().ToString();
  ASSERT_EQ(map->size(), 2u);
  EXPECT_EQ((*map)[0].file, "/d/top.data");
  EXPECT_EQ((*map)[0].offset, 0u);
  EXPECT_FALSE((*map)[1].present);
  EXPECT_TRUE((*map)[1].zero);
  EXPECT_EQ((*map)[1].depth, 0);
}

TEST(MapImageTest, AHugeClaimedSizeIsMappedInAtMost4096Windows) {
  FakeImage top("/d/huge.qcow2", formats::ImageFormat::kQcow2, 16ull << 40);
  auto map = MapImage(top);
  ASSERT_TRUE(map.ok()) << map.error().ToString();
  EXPECT_EQ(top.windows().size(), 4096u);
  EXPECT_EQ(top.windows().front(), (std::pair<uint64_t, uint64_t>{0, 4ull << 30}));
  EXPECT_EQ(top.windows().back().first + top.windows().back().second, 16ull << 40);
}

TEST(AppendMergedTest, OnlyWhatContinuesTheLastEntryMerges) {
  std::vector<MapEntry> map;
  MapEntry a;
  a.length = 4096;
  a.present = true;
  a.data = true;
  AppendMerged(map, a);
  MapEntry b = a;
  b.start = 4096;
  AppendMerged(map, b);
  ASSERT_EQ(map.size(), 1u);
  EXPECT_EQ(map[0].length, 8192u);
  MapEntry gap = a;
  gap.start = 3 * 4096;  // not adjacent in the guest
  AppendMerged(map, gap);
  MapEntry other_layer = a;
  other_layer.start = 4 * 4096;
  other_layer.depth = 1;
  AppendMerged(map, other_layer);
  MapEntry one_host = other_layer;
  one_host.start = 5 * 4096;
  one_host.offset = 0;  // an offset where the last had none
  AppendMerged(map, one_host);
  EXPECT_EQ(map.size(), 4u);
}

std::vector<std::byte> Bytes(size_t n, uint8_t fill = 0) { return std::vector<std::byte>(n, std::byte{fill}); }

TEST(CompareImagesTest, IdenticalDifferentAndTheFirstDifferingByte) {
  auto a_bytes = Bytes(9 * kMiB, 0x5a);
  auto b_bytes = a_bytes;
  b_bytes[5 * kMiB + 3] = std::byte{0};
  b_bytes[8 * kMiB] = std::byte{0};
  MemorySource a(a_bytes, "a"), same(a_bytes, "same"), b(b_bytes, "b");
  auto c = CompareImages(a, same, /*strict_size=*/true);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_TRUE(c->identical);
  EXPECT_FALSE(c->first_difference);
  c = CompareImages(a, b, true);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_FALSE(c->identical);
  EXPECT_EQ(c->first_difference, 5 * kMiB + 3);
  auto d = FirstDifference(a, b, 6 * kMiB, 3 * kMiB);
  ASSERT_TRUE(d.ok()) << d.error().ToString();
  EXPECT_EQ(*d, 8 * kMiB);
}

TEST(CompareImagesTest, DifferentSizesStrictOrByTheLargerTail) {
  auto small = Bytes(kMiB, 1);
  auto zero_tail = small;
  zero_tail.resize(6 * kMiB);
  auto data_tail = zero_tail;
  data_tail[5 * kMiB + 7] = std::byte{9};
  MemorySource s(small, "s"), z(zero_tail, "z"), d(data_tail, "d");

  auto c = CompareImages(s, z, /*strict_size=*/true);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_FALSE(c->identical);
  EXPECT_FALSE(c->first_difference);  // refused unread
  EXPECT_TRUE(c->sizes_differ());
  EXPECT_EQ(c->a_size, kMiB);
  EXPECT_EQ(c->b_size, 6 * kMiB);

  c = CompareImages(z, s, false);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_TRUE(c->identical);
  EXPECT_TRUE(c->sizes_differ());

  c = CompareImages(s, d, false);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_FALSE(c->identical);
  EXPECT_EQ(c->first_difference, 5 * kMiB + 7);
}

TEST(CompareImagesTest, RangesBothSidesReportAsZeroAreNotRead) {
  // Extents that claim zeros over bytes that are not: trusted, so unread.
  auto a_bytes = Bytes(8 * kMiB, 1);
  auto b_bytes = Bytes(8 * kMiB, 2);
  MemorySource a(a_bytes, ExtentList{{0, 8 * kMiB, ExtentKind::kZero}}, "a");
  MemorySource b(b_bytes, ExtentList{{0, 4 * kMiB, ExtentKind::kHole}, {4 * kMiB, 4 * kMiB, ExtentKind::kData}}, "b");
  auto c = CompareImages(a, b, true);
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->first_difference, 4 * kMiB);
  auto nz = FirstNonZero(a, 0, 8 * kMiB);
  ASSERT_TRUE(nz.ok()) << nz.error().ToString();
  EXPECT_FALSE(*nz);
}

}  // namespace
}  // namespace barge::pipeline
