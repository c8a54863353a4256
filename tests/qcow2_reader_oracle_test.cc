// Oracle tests for the qcow2 reader: images made by qemu-img/qemu-io are read
// by barge and compared with `qemu-img convert -O raw`, `qemu-img map` and
// the dirty bitmaps qemu-nbd exports.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <random>
#include <tuple>

#include "blockio/file.h"
#include "formats/image.h"
#include "formats/qcow2_bitmap.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

Result<std::unique_ptr<BlockSource>> OpenFile(const std::string& path) {
  return OpenFileSource(path);
}

std::unique_ptr<Image> MustOpen(const std::string& path) {
  auto image = OpenImage(path, OpenFile);
  EXPECT_TRUE(image.ok()) << (image.ok() ? "" : image.error().ToString());
  return image.ok() ? std::move(image).value() : nullptr;
}

// Per byte range: data?, zero?, present?, depth.
struct Span {
  uint64_t start, length;
  bool data, zero, present;
  int depth;
  auto key() const { return std::tie(data, zero, present, depth); }
};

std::vector<Span> Merge(std::vector<Span> in) {
  std::vector<Span> out;
  for (const Span& s : in) {
    if (s.length == 0) continue;
    if (!out.empty() && out.back().key() == s.key() && out.back().start + out.back().length == s.start) {
      out.back().length += s.length;
    } else {
      out.push_back(s);
    }
  }
  return out;
}

std::string Describe(const std::vector<Span>& spans) {
  std::string s;
  for (const Span& x : spans) {
    s += "[" + std::to_string(x.start) + "+" + std::to_string(x.length) + " d=" +
         std::to_string(x.data) + " z=" + std::to_string(x.zero) + " p=" + std::to_string(x.present) +
         " depth=" + std::to_string(x.depth) + "] ";
  }
  return s;
}

// Full read, map and bitmap comparison of one image against qemu.
void CheckAgainstQemu(const TempDir& dir, const std::string& path) {
  SCOPED_TRACE(path);
  auto image = MustOpen(path);
  ASSERT_NE(image, nullptr);
  // Data: byte-identical to qemu-img convert -O raw.
  const std::string flat = dir / "flat.raw";
  // qemu resolves relative data-file names against its working folder.
  const std::string cd = "cd " + ShellQuote(dir.path().string()) + " && ";
  RunOk(cd + "qemu-img convert -f qcow2 -O raw " + ShellQuote(path) + " " + flat);
  std::vector<std::byte> want = testing::ReadFile(flat);
  ASSERT_EQ(want.size(), image->size_bytes());
  std::vector<std::byte> got(want.size());
  constexpr size_t kChunk = 1 << 20;
  for (size_t off = 0; off < got.size(); off += kChunk) {
    size_t n = std::min(kChunk, got.size() - off);
    Status st = image->ReadAt(off, std::span(got).subspan(off, n));
    ASSERT_TRUE(st.ok()) << st.error().ToString();
  }
  ASSERT_TRUE(got == want) << "guest data differs from qemu-img convert";
  // An unaligned read across cluster boundaries.
  if (got.size() > 5000) {
    std::vector<std::byte> part(3001);
    ASSERT_TRUE(image->ReadAt(1999, part).ok());
    ASSERT_TRUE(std::equal(part.begin(), part.end(), want.begin() + 1999));
  }
  // Unaligned reads of random spans: parts of clusters at both ends, runs of
  // every kind in between, from every layer of a chain.
  std::mt19937_64 rng(17);
  for (int i = 0; i < 64; ++i) {
    const size_t off = rng() % got.size();
    const size_t n = 1 + rng() % std::min<size_t>(got.size() - off, 700 << 10);
    std::vector<std::byte> part(n);
    Status st = image->ReadAt(off, part);
    ASSERT_TRUE(st.ok()) << st.error().ToString();
    ASSERT_TRUE(std::equal(part.begin(), part.end(), want.begin() + off)) << "at " << off << " +" << n;
  }
  // Map: same data/zero/present/depth per byte as qemu-img map.
  auto json = nlohmann::json::parse(RunOk(cd + "qemu-img map -f qcow2 --output=json " + ShellQuote(path)));
  std::vector<Span> theirs;
  for (const auto& e : json) {
    theirs.push_back({e["start"].get<uint64_t>(), e["length"].get<uint64_t>(), e["data"].get<bool>(),
                      e["zero"].get<bool>(), e["present"].get<bool>(), e["depth"].get<int>()});
  }
  auto mapped = image->Map(0, image->size_bytes());
  ASSERT_TRUE(mapped.ok()) << mapped.error().ToString();
  std::vector<Span> ours;
  for (const MappedExtent& m : *mapped) {
    ours.push_back({m.offset, m.length, m.kind == ExtentKind::kData, m.kind != ExtentKind::kData,
                    m.kind != ExtentKind::kHole, m.depth});
  }
  EXPECT_EQ(Describe(Merge(ours)), Describe(Merge(theirs)));
  // Extents agree with Map and cover the disk.
  auto extents = image->Extents(0, image->size_bytes());
  ASSERT_TRUE(extents.ok());
  uint64_t covered = 0;
  for (const Extent& e : *extents) {
    EXPECT_EQ(e.offset, covered);
    covered += e.length;
  }
  EXPECT_EQ(covered, image->size_bytes());
  // Bitmaps: the same dirty ranges as qemu-nbd exports.
  for (const BitmapInfo& b : image->info().bitmaps) {
    auto ranges = ReadBitmapDirtyRanges(*image, b.name);
    if (b.in_use) {
      EXPECT_FALSE(ranges.ok()) << b.name;
      continue;
    }
    ASSERT_TRUE(ranges.ok()) << ranges.error().ToString();
    auto map = nlohmann::json::parse(RunOk("nbdinfo --json --map=qemu:dirty-bitmap:" + b.name +
                                           " -- [ qemu-nbd -r -f qcow2 -B " + b.name + " " +
                                           ShellQuote(path) + " ]"));
    RangeList want_ranges;
    for (const auto& e : map) {
      if (e["type"].get<int>() & 1) want_ranges.push_back({e["offset"].get<uint64_t>(), e["length"].get<uint64_t>()});
    }
    EXPECT_EQ(*ranges, NormalizeRanges(want_ranges)) << b.name;
  }
}

// A 4 MiB raw disk: random data with zero and hole regions.
std::string MakeRaw(const TempDir& dir, uint64_t size = 4 << 20, uint64_t seed = 1) {
  std::vector<std::byte> bytes = testing::RandomBytes(size, seed);
  // Per 192 KiB: 64 KiB of zeros, 64 KiB of compressible text, 64 KiB of
  // random bytes (so `qemu-img convert -c` makes compressed clusters too).
  for (uint64_t off = 0; off < size; off += 192 * 1024) {
    std::fill_n(bytes.begin() + off, std::min<uint64_t>(64 * 1024, size - off), std::byte{0});
    const std::string line = "line of block " + std::to_string(off) + ", fairly compressible\n";
    for (uint64_t i = off + 64 * 1024; i < std::min<uint64_t>(off + 128 * 1024, size); ++i) {
      bytes[i] = std::byte(line[i % line.size()]);
    }
  }
  std::string path = dir / ("src" + std::to_string(seed) + ".raw");
  testing::WriteFile(path, bytes);
  return path;
}

class Qcow2Oracle : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
  }
  std::string Path(const std::string& name) const { return dir_ / name; }
  TempDir dir_;
};

TEST_F(Qcow2Oracle, ClusterSizesWithZeroClusters) {
  std::string raw = MakeRaw(dir_);
  for (const char* cs : {"512", "4k", "64k", "2M"}) {
    std::string img = Path(std::string("cs") + cs + ".qcow2");
    RunOk("qemu-img convert -f raw -O qcow2 -o cluster_size=" + std::string(cs) + " " + raw + " " + img);
    // write -z over data (ZERO_ALLOC) and over a hole (ZERO_PLAIN).
    RunOk("qemu-io -f qcow2 -c 'write -z 2M 128k' -c 'write -z 0 4k' -c 'write -P 7 3M 4k' " + img);
    CheckAgainstQemu(dir_, img);
  }
}

TEST_F(Qcow2Oracle, CompressedDeflateAndZstd) {
  std::string raw = MakeRaw(dir_);
  for (const char* type : {"zlib", "zstd"}) {
    for (const char* cs : {"4k", "64k"}) {
      std::string img = Path(std::string("c-") + type + cs + ".qcow2");
      RunOk("qemu-img convert -f raw -O qcow2 -c -o compression_type=" + std::string(type) +
            ",cluster_size=" + cs + " " + raw + " " + img);
      RunOk("qemu-io -f qcow2 -c 'write -P 3 1M 8k' -c 'write -z 2M 64k' " + img);
      CheckAgainstQemu(dir_, img);
    }
  }
}

TEST_F(Qcow2Oracle, RefcountBitsAndVersion2) {
  std::string raw = MakeRaw(dir_);
  for (const char* opts : {"refcount_bits=1", "refcount_bits=8", "refcount_bits=64", "compat=0.10"}) {
    std::string img = Path(std::string("r-") + opts + ".qcow2");
    RunOk("qemu-img convert -f raw -O qcow2 -o cluster_size=4k," + std::string(opts) + " " + raw + " " + img);
    CheckAgainstQemu(dir_, img);
  }
}

TEST_F(Qcow2Oracle, ExtendedL2WithBackingFallthrough) {
  std::string raw = MakeRaw(dir_);
  std::string base = Path("xbase.qcow2");
  RunOk("qemu-img convert -f raw -O qcow2 -o cluster_size=64k,extended_l2=on " + raw + " " + base);
  RunOk("qemu-io -f qcow2 -c 'write -P 9 4k 4k' -c 'write -z 70k 2k' " + base);
  CheckAgainstQemu(dir_, base);
  std::string top = Path("xtop.qcow2");
  RunOk("cd " + ShellQuote(dir_.path().string()) +
        " && qemu-img create -q -f qcow2 -o cluster_size=128k,extended_l2=on -b xbase.qcow2 -F qcow2 xtop.qcow2 4M");
  RunOk("qemu-io -f qcow2 -c 'write -P 5 8k 4k' -c 'write -z 300k 4k' -c 'write -P 6 1M 128k' " + top);
  CheckAgainstQemu(dir_, top);
}

TEST_F(Qcow2Oracle, ThreeDeepChainWithShortBaseAndRawBottom) {
  std::string raw = MakeRaw(dir_, 2 << 20, 2);
  const std::string d = ShellQuote(dir_.path().string());
  RunOk("cd " + d + " && qemu-img convert -f raw -O qcow2 " + raw + " base.qcow2" +
        " && qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 mid.qcow2 3M" +
        " && qemu-img create -q -f qcow2 -o cluster_size=4k -b mid.qcow2 -F qcow2 top.qcow2 4M");
  RunOk("qemu-io -f qcow2 -c 'write -P 1 64k 64k' -c 'write -z 1M 64k' -c 'write -P 4 2500k 4k' " + Path("mid.qcow2"));
  RunOk("qemu-io -f qcow2 -c 'write -P 2 8k 4k' -c 'write -z 1536k 4k' -c 'write -P 3 3500k 4k' " + Path("top.qcow2"));
  CheckAgainstQemu(dir_, Path("top.qcow2"));
  auto image = MustOpen(Path("top.qcow2"));
  ASSERT_NE(image, nullptr);
  ASSERT_NE(image->backing(), nullptr);
  ASSERT_NE(image->backing()->backing(), nullptr);
  EXPECT_EQ(image->backing()->backing()->backing(), nullptr);
  // A raw bottom layer.
  RunOk("cd " + d + " && qemu-img create -q -f qcow2 -b " + ShellQuote(raw) + " -F raw onraw.qcow2" +
        " && qemu-io -f qcow2 -c 'write -P 8 100k 4k' onraw.qcow2");
  auto onraw = MustOpen(Path("onraw.qcow2"));
  ASSERT_NE(onraw, nullptr);
  std::vector<std::byte> got(onraw->size_bytes());
  ASSERT_TRUE(onraw->ReadAt(0, got).ok());
  RunOk("qemu-img convert -f qcow2 -O raw " + Path("onraw.qcow2") + " " + Path("flat2.raw"));
  EXPECT_TRUE(got == testing::ReadFile(Path("flat2.raw")));
}

TEST_F(Qcow2Oracle, ExternalDataFile) {
  const std::string d = ShellQuote(dir_.path().string());
  RunOk("cd " + d + " && qemu-img create -q -f qcow2 -o data_file=d1.raw df.qcow2 4M" +
        " && qemu-io -f qcow2 -c 'write -P 1 0 64k' -c 'write -P 2 1M 100k' -c 'write -z 2M 64k' df.qcow2");
  CheckAgainstQemu(dir_, Path("df.qcow2"));
  RunOk("cd " + d + " && qemu-img create -q -f qcow2 -o data_file=d2.raw,data_file_raw=on dfr.qcow2 4M" +
        " && qemu-io -f qcow2 -c 'write -P 1 0 64k' -c 'write -P 2 3M 100k' dfr.qcow2");
  CheckAgainstQemu(dir_, Path("dfr.qcow2"));
  auto image = MustOpen(Path("dfr.qcow2"));
  ASSERT_NE(image, nullptr);
  EXPECT_TRUE(image->info().data_file_raw);
  EXPECT_EQ(image->info().data_file, "d2.raw");
}

TEST_F(Qcow2Oracle, PersistentBitmaps) {
  BARGE_REQUIRE_TOOL("qemu-nbd");
  BARGE_REQUIRE_TOOL("nbdinfo");
  for (const char* cs : {"4k", "64k"}) {
    std::string img = Path(std::string("bm") + cs + ".qcow2");
    RunOk("qemu-img create -q -f qcow2 -o cluster_size=" + std::string(cs) + " " + img + " 8M");
    RunOk("qemu-img bitmap --add -g 65536 " + img + " enabled");
    RunOk("qemu-img bitmap --add -g 512 " + img + " fine");
    RunOk("qemu-img bitmap --add --disable " + img + " disabled");
    RunOk("qemu-io -f qcow2 -c 'write -P 1 0 4k' -c 'write -P 2 1M 200k' -c 'write 7M 1k' " + img);
    RunOk("qemu-img bitmap --add " + img + " stale");
    CheckAgainstQemu(dir_, img);
    auto image = MustOpen(img);
    ASSERT_NE(image, nullptr);
    ASSERT_EQ(image->info().bitmaps.size(), 4u);
    for (const BitmapInfo& b : image->info().bitmaps) {
      EXPECT_EQ(b.enabled, b.name != "disabled") << b.name;
      EXPECT_FALSE(b.in_use);
    }
    auto missing = ReadBitmapDirtyRanges(*image, "nope");
    EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  }
}

TEST_F(Qcow2Oracle, InUseBitmapAfterKill) {
  BARGE_REQUIRE_TOOL("qemu-nbd");
  std::string img = Path("inuse.qcow2");
  RunOk("qemu-img create -q -f qcow2 " + img + " 4M && qemu-img bitmap --add " + img + " b0");
  std::string sock = Path("nbd.sock");
  RunOk("qemu-nbd -f qcow2 --socket=" + sock + " --fork --pid-file=" + Path("pid") + " " + img);
  RunOk("kill -9 $(cat " + Path("pid") + ")");
  auto image = MustOpen(img);
  ASSERT_NE(image, nullptr);
  ASSERT_EQ(image->info().bitmaps.size(), 1u);
  EXPECT_TRUE(image->info().bitmaps[0].in_use);
  auto ranges = ReadBitmapDirtyRanges(*image, "b0");
  ASSERT_FALSE(ranges.ok());
  EXPECT_EQ(ranges.error().code(), ErrorCode::kCorruption);
}

TEST_F(Qcow2Oracle, InternalSnapshotListed) {
  std::string raw = MakeRaw(dir_, 1 << 20, 3);
  std::string img = Path("snap.qcow2");
  RunOk("qemu-img convert -f raw -O qcow2 -o cluster_size=4k " + raw + " " + img);
  RunOk("qemu-img snapshot -c first " + img);
  RunOk("qemu-io -f qcow2 -c 'write -P 4 0 64k' " + img);
  RunOk("qemu-img snapshot -c second " + img);
  CheckAgainstQemu(dir_, img);
  auto image = MustOpen(img);
  ASSERT_NE(image, nullptr);
  ASSERT_EQ(image->info().snapshots.size(), 2u);
  EXPECT_EQ(image->info().snapshots[0].name, "first");
  EXPECT_EQ(image->info().snapshots[1].name, "second");
  EXPECT_EQ(image->info().snapshots[0].virtual_size, 1u << 20);
}

}  // namespace
}  // namespace barge::formats
