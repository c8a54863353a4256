// Checks images from the one-pass qcow2 writer with qemu-img (check, compare,
// info) and qemu-nbd/nbdinfo for bitmaps, across every writer option.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "blockio/file.h"
#include "formats/image.h"
#include "formats/qcow2_compress.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using barge::testing::ReadFile;
using barge::testing::Run;
using barge::testing::RunOk;
using barge::testing::ShellQuote;
using barge::testing::TempDir;
using barge::testing::WriteFile;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum class Kind { kRandom, kCompressible, kZero, kUnallocated, kZeroData };

Kind KindOf(uint64_t cluster, uint64_t seed) {
  // The first clusters cycle through every kind (in a seed-dependent
  // rotation) so that even a 4-cluster disk holds compressed clusters.
  static constexpr Kind kCycle[] = {Kind::kCompressible, Kind::kZero,         Kind::kRandom,
                                    Kind::kUnallocated,  Kind::kCompressible, Kind::kZeroData,
                                    Kind::kCompressible};
  if (cluster < 7) return kCycle[(cluster + seed) % 7];
  switch (Mix(cluster * 31 + seed) % 7) {
    case 0: return Kind::kRandom;
    case 1:
    case 2: return Kind::kCompressible;
    case 3: return Kind::kZero;
    case 4: return Kind::kUnallocated;
    case 5: return Kind::kZeroData;
    default: return Kind::kCompressible;
  }
}

// Guest bytes of one cluster of `kind` (zeros for zero/unallocated).
std::vector<std::byte> ClusterBytes(Kind kind, size_t n, uint64_t cluster, uint64_t seed) {
  if (kind == Kind::kRandom) return barge::testing::RandomBytes(n, Mix(cluster ^ seed));
  std::vector<std::byte> out(n);
  if (kind == Kind::kCompressible) {
    std::vector<std::byte> word = barge::testing::RandomBytes(24, Mix(cluster + seed));
    for (size_t i = 0; i < n; ++i) out[i] = (i % 512 < 40) ? word[i % 24] : std::byte(i / 512);
  }
  return out;
}

// The JSON document a command prints on stdout (its stderr kept apart).
nlohmann::json Json(const std::string& command) {
  auto r = Run(command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return nlohmann::json::parse(r.stdout_text, nullptr, false);
}

// qemu-img check must be clean (exit 0, no leaks, no corruptions).
void ExpectClean(const std::string& image) {
  auto r = Run("qemu-img check -f qcow2 --output=json " + ShellQuote(image));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.stdout_text, nullptr, false);
  EXPECT_EQ(j.value("leaks", 0), 0) << r.output;
  EXPECT_EQ(j.value("corruptions", 0), 0) << r.output;
  EXPECT_EQ(j.value("check-errors", 0), 0) << r.output;
}

void ExpectSameAsRaw(const std::string& image, const std::string& raw) {
  RunOk("qemu-img compare -f qcow2 -F raw " + ShellQuote(image) + " " + ShellQuote(raw));
}

struct WriteCase {
  uint32_t cluster_bits;
  uint32_t refcount_order;
  Compression compression;
  uint64_t virtual_size;
  uint64_t seed;
};

std::string CaseName(const WriteCase& c) {
  std::ostringstream s;
  s << "cs" << (1u << c.cluster_bits) << "_rc" << c.refcount_order << "_"
    << CompressionName(c.compression) << "_" << c.virtual_size;
  return s.str();
}

// Writes an image of mixed clusters; writes the expected guest view (padded
// to the 512-rounded size) to `raw_path`. Returns the writer's stats.
Qcow2WriterStats WriteMixedImage(const WriteCase& c, const std::string& image_path,
                                 const std::string& raw_path, Qcow2WriterOptions options = {}) {
  options.virtual_size = c.virtual_size;
  options.cluster_bits = c.cluster_bits;
  options.refcount_order = c.refcount_order;
  options.compression = c.compression;
  auto sink = OpenFileSink(image_path, SinkMode::kCreateNew);
  EXPECT_TRUE(sink.ok());
  if (!sink.ok()) return {};
  auto writer = Qcow2Writer::Create(**sink, options);
  EXPECT_TRUE(writer.ok()) << writer.error().ToString();
  if (!writer.ok()) return {};
  Qcow2Writer& w = **writer;
  uint64_t cs = w.cluster_size();
  uint64_t rounded = (c.virtual_size + 511) / 512 * 512;
  std::vector<std::byte> expected(rounded);
  ClusterCompressor compressor(c.compression, 0);
  for (uint64_t i = 0; i < w.cluster_count(); ++i) {
    uint64_t len = std::min<uint64_t>(cs, rounded - i * cs);
    Kind kind = KindOf(i, c.seed);
    std::vector<std::byte> full = ClusterBytes(kind, cs, i, c.seed);
    std::copy(full.begin(), full.begin() + len, expected.begin() + i * cs);
    std::fill(full.begin() + len, full.end(), std::byte{0});
    Status st;
    if (kind == Kind::kZero) {
      st = w.WriteZero(i);
    } else if (kind == Kind::kUnallocated) {
      std::fill(expected.begin() + i * cs, expected.begin() + i * cs + len, std::byte{0});
      continue;
    } else {
      auto payload = compressor.Compress(full);
      EXPECT_TRUE(payload.ok());
      if (payload.ok() && payload->has_value()) {
        st = w.WriteCompressed(i, **payload);
      } else {
        // The last cluster may be passed short.
        st = w.WriteData(i, std::span<const std::byte>(full.data(), len));
      }
    }
    EXPECT_TRUE(st.ok()) << "cluster " << i << ": " << st.error().ToString();
  }
  Status st = w.Finish();
  EXPECT_TRUE(st.ok()) << st.error().ToString();
  WriteFile(raw_path, expected);
  return w.stats();
}

// One test per cluster size, so ctest can run them side by side.
class Qcow2WriterMatrixTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(Qcow2WriterMatrixTest, EveryRefcountOrderAndCompression) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  const uint32_t bits = GetParam();
  const uint64_t cs = uint64_t{1} << bits;
  const uint64_t clusters = bits == 21 ? 4 : bits == 16 ? 40 : bits == 12 ? 700 : 600;
  // Not a multiple of the cluster size, nor (for most) of 512.
  const uint64_t size = (clusters - 1) * cs + (bits == 9 ? 300 : cs / 3 + 123);
  uint64_t seed = bits * 100;
  for (uint32_t order : {0u, 1u, 3u, 4u, 6u}) {
    for (Compression comp : {Compression::kNone, Compression::kZstd, Compression::kDeflate}) {
      WriteCase c{bits, order, comp, size, ++seed};
      SCOPED_TRACE(CaseName(c));
      std::string image = dir / (CaseName(c) + ".qcow2");
      std::string raw = dir / (CaseName(c) + ".raw");
      Qcow2WriterStats stats = WriteMixedImage(c, image, raw);
      if (HasFailure()) return;
      EXPECT_EQ(stats.file_bytes, ReadFile(image).size());
      if (clusters > 10) {
        EXPECT_GT(stats.zero_clusters, 0u);
      }
      if (comp != Compression::kNone && bits > 9) {
        EXPECT_GT(stats.compressed_clusters, 0u);
      }
      ExpectClean(image);
      ExpectSameAsRaw(image, raw);
      auto info = Json("qemu-img info -f qcow2 --output=json " + ShellQuote(image));
      EXPECT_EQ(info["cluster-size"], cs);
      EXPECT_EQ(info["virtual-size"], (size + 511) / 512 * 512);
      auto spec = info["format-specific"]["data"];
      EXPECT_EQ(spec["refcount-bits"], 1u << order);
      EXPECT_EQ(spec["compat"], "1.1");
      EXPECT_EQ(spec["compression-type"], comp == Compression::kZstd ? "zstd" : "zlib");
      EXPECT_FALSE(info.contains("backing-filename"));
      if (HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ClusterBits, Qcow2WriterMatrixTest, ::testing::Values(9u, 12u, 16u, 21u),
                         [](const auto& info) { return "cs" + std::to_string(1u << info.param); });

TEST(Qcow2WriterOracleTest, QemuConvertRereadsEverything) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  WriteCase c{16, 4, Compression::kZstd, 5 * 65536 + 4097, 77};
  WriteMixedImage(c, dir / "a.qcow2", dir / "a.raw");
  RunOk("qemu-img convert -f qcow2 -O raw " + ShellQuote(dir / "a.qcow2") + " " +
        ShellQuote(dir / "flat.raw"));
  EXPECT_EQ(ReadFile(dir / "flat.raw"), ReadFile(dir / "a.raw"));
}

TEST(Qcow2WriterOracleTest, ZeroClustersHideBackingData) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  const uint32_t bits = 12;
  const uint64_t cs = 4096, clusters = 64, size = clusters * cs;
  std::vector<std::byte> base_data = barge::testing::RandomBytes(size, 5);
  WriteFile(dir / "base.raw", base_data);
  RunOk("qemu-img convert -f raw -O qcow2 " + ShellQuote(dir / "base.raw") + " " +
        ShellQuote(dir / "base.qcow2"));

  Qcow2WriterOptions options;
  options.virtual_size = size;
  options.cluster_bits = bits;
  options.compression = Compression::kDeflate;
  options.backing_file = "base.qcow2";  // relative to the overlay's folder
  options.backing_format = "qcow2";
  auto sink = OpenFileSink(dir / "top.qcow2", SinkMode::kCreateNew);
  ASSERT_TRUE(sink.ok());
  auto writer = Qcow2Writer::Create(**sink, options);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  std::vector<std::byte> expected = base_data;
  ClusterCompressor compressor(Compression::kDeflate, 0);
  for (uint64_t i = 0; i < clusters; ++i) {
    auto at = expected.begin() + i * cs;
    switch (i % 4) {
      case 0: {  // zero: must not show the backing data
        ASSERT_TRUE((*writer)->WriteZero(i).ok());
        std::fill(at, at + cs, std::byte{0});
        break;
      }
      case 1: break;  // unallocated: backing data shows through
      case 2: {
        auto data = ClusterBytes(Kind::kRandom, cs, i, 9);
        ASSERT_TRUE((*writer)->WriteData(i, data).ok());
        std::copy(data.begin(), data.end(), at);
        break;
      }
      case 3: {
        auto data = ClusterBytes(Kind::kCompressible, cs, i, 9);
        auto payload = compressor.Compress(data);
        ASSERT_TRUE(payload.ok() && payload->has_value());
        ASSERT_TRUE((*writer)->WriteCompressed(i, **payload).ok());
        std::copy(data.begin(), data.end(), at);
        break;
      }
    }
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  WriteFile(dir / "expected.raw", expected);
  ExpectClean(dir / "top.qcow2");
  ExpectSameAsRaw(dir / "top.qcow2", dir / "expected.raw");
  auto info = Json("qemu-img info -f qcow2 --output=json " + ShellQuote(dir / "top.qcow2"));
  EXPECT_EQ(info["backing-filename"], "base.qcow2");
  EXPECT_EQ(info["backing-filename-format"], "qcow2");
  EXPECT_EQ(info["format-specific"]["data"]["compression-type"], "zlib");
  // Opened from another working directory, the name still resolves.
  RunOk("cd / && qemu-img compare -f qcow2 -F raw " + ShellQuote(dir / "top.qcow2") + " " +
        ShellQuote(dir / "expected.raw"));
}

TEST(Qcow2WriterOracleTest, EmptyAndTinyDisks) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, uint64_t{512}, uint64_t{70000}}) {
    WriteCase c{16, 4, Compression::kZstd, size, size};
    SCOPED_TRACE(CaseName(c));
    std::string image = dir / (CaseName(c) + ".qcow2");
    WriteMixedImage(c, image, dir / (CaseName(c) + ".raw"));
    ExpectClean(image);
    ExpectSameAsRaw(image, dir / (CaseName(c) + ".raw"));
  }
}

// Dirty ranges as qemu-nbd exports them: "offset length type description".
RangeList NbdDirtyRanges(const std::string& image, const std::string& bitmap) {
  std::string out = RunOk("nbdinfo --map=qemu:dirty-bitmap:" + bitmap + " -- [ qemu-nbd -r -f qcow2 -B " +
                          bitmap + " " + ShellQuote(image) + " ]");
  RangeList ranges;
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    uint64_t offset = 0, length = 0, type = 0;
    if (f >> offset >> length >> type && (type & 1)) ranges.push_back({offset, length});
  }
  return NormalizeRanges(ranges);
}

nlohmann::json FindBitmap(const nlohmann::json& info, const std::string& name) {
  for (const auto& b : info["format-specific"]["data"]["bitmaps"]) {
    if (b["name"] == name) return b;
  }
  return {};
}

TEST(Qcow2WriterOracleTest, BitmapsMatchQemuNbd) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-nbd");
  BARGE_REQUIRE_TOOL("nbdinfo");
  TempDir dir;
  // 512-byte clusters: one bitmap cluster holds 4096 bits, so a 512-byte
  // granularity bitmap of this 9 MiB disk spans several chunks.
  WriteCase c{9, 4, Compression::kNone, 9 * 1048576 + 1536, 3};
  Qcow2WriterOptions options;
  BitmapSpec fine{"fine", 512, true,
                  {{0, 1}, {4096, 8192}, {5 * 1048576 + 100, 300}, {9 * 1048576, 1 << 20}}};
  BitmapSpec coarse{"coarse-disabled", 65536, false, {{70000, 1}, {2 * 1048576, 3 * 1048576}}};
  BitmapSpec empty{"cbt0", 1 << 20, true, {}};
  options.bitmaps = {fine, coarse, empty};
  std::string image = dir / "bm.qcow2";
  WriteMixedImage(c, image, dir / "bm.raw", options);
  ExpectClean(image);
  ExpectSameAsRaw(image, dir / "bm.raw");

  auto info = Json("qemu-img info -f qcow2 --output=json " + ShellQuote(image));
  auto f = FindBitmap(info, "fine");
  EXPECT_EQ(f["granularity"], 512);
  EXPECT_EQ(f["flags"], nlohmann::json::array({"auto"}));
  auto d = FindBitmap(info, "coarse-disabled");
  EXPECT_EQ(d["granularity"], 65536);
  EXPECT_EQ(d["flags"], nlohmann::json::array());
  EXPECT_EQ(FindBitmap(info, "cbt0")["granularity"], 1 << 20);

  uint64_t size = (c.virtual_size + 511) / 512 * 512;
  for (const BitmapSpec& b : options.bitmaps) {
    SCOPED_TRACE(b.name);
    EXPECT_EQ(NbdDirtyRanges(image, b.name), AlignRanges(b.dirty, b.granularity_bytes, size));
  }
}

TEST(Qcow2WriterOracleTest, DataFileOverlayOverRawDisk) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  for (uint32_t bits : {9u, 12u, 16u}) {
    SCOPED_TRACE(bits);
    std::string raw = dir / ("disk" + std::to_string(bits) + ".raw");
    std::string overlay = dir / ("overlay" + std::to_string(bits) + ".qcow2");
    uint64_t size = 3 * 1048576 + 1536;  // not a cluster multiple
    std::vector<std::byte> data = barge::testing::RandomBytes(size, bits);
    std::fill(data.begin() + 65536, data.begin() + 3 * 65536, std::byte{0});
    WriteFile(raw, data);

    OverlayOptions options;
    options.virtual_size = size;
    options.data_file_path = raw;
    options.cluster_bits = bits;
    options.bitmaps = {BitmapSpec{"cbt0", 65536, true, {}}};
    auto sink = OpenFileSink(overlay, SinkMode::kCreateNew);
    ASSERT_TRUE(sink.ok());
    Status st = WriteDataFileOverlay(**sink, options);
    ASSERT_TRUE(st.ok()) << st.error().ToString();
    sink->reset();

    ExpectClean(overlay);
    ExpectSameAsRaw(overlay, raw);
    EXPECT_EQ(ReadFile(raw), data);  // never touched
    auto info = Json("qemu-img info -f qcow2 --output=json " + ShellQuote(overlay));
    auto spec = info["format-specific"]["data"];
    EXPECT_EQ(spec["data-file"], raw);
    EXPECT_EQ(spec["data-file-raw"], true);
    EXPECT_EQ(FindBitmap(info, "cbt0")["flags"], nlohmann::json::array({"auto"}));
    EXPECT_EQ(info["virtual-size"], size);
  }
}

// Our own reader (formats/image.h) must agree with qemu on our images.
std::vector<std::byte> ReadWithBarge(const std::string& path, ImageInfo* info = nullptr) {
  auto opener = [](const std::string& p) -> Result<std::unique_ptr<BlockSource>> {
    return OpenFileSource(p);
  };
  auto image = OpenImage(path, opener);
  EXPECT_TRUE(image.ok()) << (image.ok() ? "" : image.error().ToString());
  if (!image.ok()) return {};
  if (info) *info = (*image)->info();
  std::vector<std::byte> out((*image)->size_bytes());
  Status st = (*image)->ReadAt(0, out);
  EXPECT_TRUE(st.ok()) << (st.ok() ? "" : st.error().ToString());
  return out;
}

TEST(Qcow2WriterOracleTest, BargeReaderReadsWriterImages) {
  TempDir dir;
  uint64_t seed = 900;
  for (uint32_t bits : {9u, 12u, 16u, 21u}) {
    uint64_t cs = uint64_t{1} << bits;
    uint64_t size = (bits == 21 ? 3 : 30) * cs - 1000;
    for (uint32_t order : {0u, 4u}) {
      for (Compression comp : {Compression::kNone, Compression::kZstd, Compression::kDeflate}) {
        WriteCase c{bits, order, comp, size, ++seed};
        SCOPED_TRACE(CaseName(c));
        Qcow2WriterOptions options;
        options.bitmaps = {BitmapSpec{"b", 4096, order == 0, {{cs, 3 * cs}}}};
        std::string image = dir / (CaseName(c) + ".qcow2");
        WriteMixedImage(c, image, dir / "expected.raw", options);
        ImageInfo info;
        EXPECT_EQ(ReadWithBarge(image, &info), ReadFile(dir / "expected.raw"));
        EXPECT_EQ(info.cluster_bits, bits);
        EXPECT_EQ(info.refcount_bits, 1u << order);
        EXPECT_EQ(info.compression, comp == Compression::kZstd ? Compression::kZstd
                                                               : Compression::kDeflate);
        ASSERT_EQ(info.bitmaps.size(), 1u);
        EXPECT_EQ(info.bitmaps[0].name, "b");
        EXPECT_EQ(info.bitmaps[0].granularity_bytes, 4096u);
        EXPECT_EQ(info.bitmaps[0].enabled, order == 0);
        EXPECT_FALSE(info.bitmaps[0].in_use);
        if (HasFailure()) return;
      }
    }
  }
}

TEST(Qcow2WriterOracleTest, BargeReaderReadsOverlay) {
  TempDir dir;
  std::string raw = dir / "disk.raw";
  std::vector<std::byte> data = barge::testing::RandomBytes(1 << 20, 4);
  WriteFile(raw, data);
  OverlayOptions options;
  options.virtual_size = data.size();
  options.data_file_path = raw;
  options.cluster_bits = 12;
  auto sink = OpenFileSink(dir / "o.qcow2", SinkMode::kCreateNew);
  ASSERT_TRUE(sink.ok());
  ASSERT_TRUE(WriteDataFileOverlay(**sink, options).ok());
  sink->reset();
  ImageInfo info;
  EXPECT_EQ(ReadWithBarge(dir / "o.qcow2", &info), data);
  EXPECT_EQ(info.data_file, raw);
  EXPECT_TRUE(info.data_file_raw);
}

}  // namespace
}  // namespace barge::formats
