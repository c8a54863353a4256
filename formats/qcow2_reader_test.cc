// Corrupt-image tests for the qcow2 reader: valid qemu-made images with bytes
// poked at known offsets must fail with the right error, never crash.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "blockio/memory.h"
#include "formats/image.h"
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_image.h"
#include "tests/testing/qcow2_check_testing.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using namespace qcow2;
using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;
using nlohmann::json;

// Opens files from an in-memory map; anything else is NotFound.
SourceOpener MemoryOpener(std::map<std::string, std::vector<std::byte>> files) {
  return [files = std::move(files)](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    auto it = files.find(path);
    if (it == files.end()) return Error::NotFound("no file " + path);
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(it->second, path));
  };
}

// Opens and reads everything; returns the first error code, or nullopt.
std::optional<ErrorCode> OpenAndRead(const std::vector<std::byte>& bytes) {
  auto image = OpenImage("/img.qcow2", MemoryOpener({{"/img.qcow2", bytes}}));
  if (!image.ok()) return image.error().code();
  std::vector<std::byte> buf(std::min<uint64_t>((*image)->size_bytes(), 8 << 20));
  Status st = (*image)->ReadAt(0, buf);
  if (!st.ok()) return st.error().code();
  auto map = (*image)->Map(0, buf.size());
  if (!map.ok()) return map.error().code();
  return std::nullopt;
}

void Put32(std::vector<std::byte>& b, uint64_t off, uint32_t v) { StoreBe32(b.data() + off, v); }
void Put64(std::vector<std::byte>& b, uint64_t off, uint64_t v) { StoreBe64(b.data() + off, v); }
uint64_t Get64(const std::vector<std::byte>& b, uint64_t off) { return LoadBe64(b.data() + off); }

class Qcow2Corrupt : public ::testing::Test {
 protected:
  void SetUp() override { BARGE_REQUIRE_TOOL("qemu-img"); }
  // A 1 MiB image with data in its first cluster.
  std::vector<std::byte> Make(const std::string& create_opts = "", const std::string& io = "write -P 1 0 64k") {
    std::string img = dir_ / "t.qcow2";
    RunOk("rm -f " + img + " && qemu-img create -q -f qcow2 " + create_opts + " " + img + " 1M");
    if (!io.empty()) RunOk("qemu-io -f qcow2 -c '" + io + "' " + img);
    return testing::ReadFile(img);
  }
  TempDir dir_;
};

TEST_F(Qcow2Corrupt, ValidImageReads) {
  EXPECT_EQ(OpenAndRead(Make()), std::nullopt);
}

TEST_F(Qcow2Corrupt, HeaderFields) {
  const auto good = Make();
  auto poke = [&](auto fn) { auto b = good; fn(b); return OpenAndRead(b); };
  EXPECT_EQ(poke([](auto& b) { Put64(b, 72, 1ull << 5); }), ErrorCode::kNotSupported);   // unknown incompat
  EXPECT_EQ(poke([](auto& b) { Put32(b, 20, 30); }), ErrorCode::kCorruption);            // cluster_bits
  EXPECT_EQ(poke([](auto& b) { Put32(b, 20, 8); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([](auto& b) { Put32(b, 32, 1); }), ErrorCode::kNotSupported);           // crypt_method
  EXPECT_EQ(poke([](auto& b) { Put32(b, 4, 4); }), ErrorCode::kNotSupported);            // version
  EXPECT_EQ(poke([](auto& b) { Put64(b, 40, 1ull << 40); }), ErrorCode::kCorruption);    // L1 beyond EOF
  EXPECT_EQ(poke([](auto& b) { Put64(b, 40, Get64(b, 40) + 8); }), ErrorCode::kCorruption);  // L1 misaligned
  EXPECT_EQ(poke([](auto& b) { Put32(b, 36, 0xffffffff); }), ErrorCode::kCorruption);    // huge l1_size
  EXPECT_EQ(poke([](auto& b) { Put32(b, 36, 0); }), ErrorCode::kCorruption);             // L1 too small
  EXPECT_EQ(poke([](auto& b) { Put32(b, 56, 0x10000); }), ErrorCode::kCorruption);       // refcount table
  EXPECT_EQ(poke([](auto& b) { Put32(b, 100, 100); }), ErrorCode::kCorruption);          // header_length
  EXPECT_EQ(poke([](auto& b) { Put32(b, 100, 1 << 20); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([](auto& b) { b[104] = std::byte{1}; }), ErrorCode::kCorruption);       // zstd w/o bit 3
  EXPECT_EQ(poke([](auto& b) { Put32(b, 96, 7); }), ErrorCode::kCorruption);             // refcount_order
  EXPECT_EQ(poke([](auto& b) { Put64(b, 88, kAutoclearDataFileRaw); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([](auto& b) { Put64(b, 72, kIncompatDataFile); }), ErrorCode::kCorruption);  // no name
  EXPECT_EQ(poke([](auto& b) { b.resize(50); }), ErrorCode::kCorruption);                // truncated
  EXPECT_EQ(poke([](auto& b) { b.resize(80); }), ErrorCode::kCorruption);
}

TEST_F(Qcow2Corrupt, ExtensionLengthOverflow) {
  auto b = Make();
  // qemu writes the feature-name table at header_length (112).
  ASSERT_NE(LoadBe32(b.data() + 112), 0u);
  Put32(b, 116, 0xfffffff0);
  EXPECT_EQ(OpenAndRead(b), ErrorCode::kCorruption);
}

TEST_F(Qcow2Corrupt, L2OffsetsAndEntries) {
  const auto good = Make();
  const uint64_t l1 = Get64(good, 40);
  const uint64_t l2 = Get64(good, l1) & kL1OffsetMask;
  ASSERT_NE(l2, 0u);
  auto poke = [&](auto fn) { auto b = good; fn(b); return OpenAndRead(b); };
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l1, Get64(b, l1) + 0x200); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l1, kOflagCopied | (1ull << 45)); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2, Get64(b, l2) + 0x200); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2, kOflagCopied | (1ull << 45)); }), ErrorCode::kCorruption);
  // Compressed descriptor pointing past the end of the file.
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2, kOflagCompressed | (b.size() + 4096)); }), ErrorCode::kCorruption);
  // A compressed descriptor inside the file but over garbage.
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2, kOflagCompressed | 0x200); }), ErrorCode::kCorruption);
  // Reserved bits (qemu-img check: corrupt) are refused, not masked off and
  // followed (issue 18): in the L1 entry, in a data and an unallocated L2
  // entry.
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l1, Get64(b, l1) | (1ull << 56)); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l1, Get64(b, l1) | 1); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2, Get64(b, l2) | 2); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2, Get64(b, l2) | (1ull << 60)); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, l2 + 8, 0x100); }), ErrorCode::kCorruption);
  auto image = OpenImage("/img.qcow2", MemoryOpener({{"/img.qcow2", [&] {
                                                       auto b = good;
                                                       Put64(b, l2, Get64(b, l2) | 2);
                                                       return b;
                                                     }()}}));
  ASSERT_TRUE(image.ok());
  std::vector<std::byte> buf(4096);
  Status st = (*image)->ReadAt(0, buf);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("reserved bits"), std::string::npos) << st.error().ToString();
  EXPECT_EQ(st.error().offset(), l2) << st.error().ToString();
  EXPECT_EQ(st.error().path(), "/img.qcow2");
}

TEST_F(Qcow2Corrupt, BitmapDirectory) {
  std::string img = dir_ / "bm.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + img + " 1M && qemu-img bitmap --add " + img + " b0");
  const auto good = testing::ReadFile(img);
  EXPECT_EQ(OpenAndRead(good), std::nullopt);
  // Find the bitmaps extension.
  uint64_t ext = 112, dir = 0;
  while (LoadBe32(good.data() + ext) != 0) {
    if (LoadBe32(good.data() + ext) == kExtBitmaps) dir = Get64(good, ext + 8 + 16);
    ext += 8 + ((LoadBe32(good.data() + ext + 4) + 7) & ~7u);
  }
  ASSERT_NE(dir, 0u);
  auto poke = [&](auto fn) { auto b = good; fn(b); return OpenAndRead(b); };
  EXPECT_EQ(poke([&](auto& b) { Put32(b, dir + 8, LoadBe32(b.data() + dir + 8) + 1); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { b[dir + 17] = std::byte{40}; }), ErrorCode::kCorruption);   // granularity
  EXPECT_EQ(poke([&](auto& b) { Put32(b, dir + 20, 8); }), ErrorCode::kCorruption);       // extra data
  EXPECT_EQ(poke([&](auto& b) { StoreBe16(b.data() + dir + 18, 0); }), ErrorCode::kCorruption);
  EXPECT_EQ(poke([&](auto& b) { Put64(b, dir, 1ull << 40); }), ErrorCode::kCorruption);
}

// Backing-file policy tests use real files.
class Qcow2Backing : public ::testing::Test {
 protected:
  void SetUp() override { BARGE_REQUIRE_TOOL("qemu-img"); }
  Result<std::unique_ptr<Image>> Open(const std::string& path, OpenOptions options = {}) {
    return OpenImage(path, [](const std::string& p) -> Result<std::unique_ptr<BlockSource>> {
      std::vector<std::byte> bytes = testing::ReadFile(p);
      if (bytes.empty()) return Error::NotFound("missing " + p);
      return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(std::move(bytes), p));
    }, options);
  }
  std::string Cd() const { return "cd " + ShellQuote(dir_.path().string()) + " && "; }
  TempDir dir_;
};

TEST_F(Qcow2Backing, RefusesJsonAndProtocolNames) {
  RunOk(Cd() + "qemu-img create -q -f qcow2 base.qcow2 1M && qemu-img create -q -f qcow2 -b base.qcow2 -F qcow2 top.qcow2");
  for (const char* name : {"json:{\"driver\":\"raw\",\"file\":{\"filename\":\"/etc/passwd\"}}", "nbd:unix:/x",
                           "file:base.qcow2", "http://x/y"}) {
    RunOk(Cd() + "qemu-img rebase -u -b " + ShellQuote(name) + " -F raw top.qcow2");
    auto image = Open(dir_ / "top.qcow2");
    ASSERT_FALSE(image.ok()) << name;
    EXPECT_EQ(image.error().code(), ErrorCode::kInvalidArgument) << name;
  }
}

TEST_F(Qcow2Backing, RefusesBackingOutsideFolderUnlessAllowed) {
  TempDir other;
  std::string base = other / "base.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + base + " 1M");
  RunOk(Cd() + "qemu-img create -q -f qcow2 -b " + ShellQuote(base) + " -F qcow2 top.qcow2");
  auto image = Open(dir_ / "top.qcow2");
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(image.error().message().find("--allow-any-path"), std::string::npos);
  OpenOptions any;
  any.allow_any_path = true;
  EXPECT_TRUE(Open(dir_ / "top.qcow2", any).ok());
  OpenOptions listed;
  listed.allowed_dirs = {dir_.path().string(), other.path().string()};
  EXPECT_TRUE(Open(dir_ / "top.qcow2", listed).ok());
  // "../" escapes are refused too.
  RunOk(Cd() + "mkdir -p sub && qemu-img create -q -f qcow2 -b ../top.qcow2 -F qcow2 -u sub/s.qcow2 1M");
  auto sub = Open(dir_ / "sub/s.qcow2");
  EXPECT_EQ(sub.error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(Qcow2Backing, MissingFormatNameTooLongAndCycles) {
  RunOk(Cd() + "qemu-img create -q -f qcow2 a.qcow2 1M && qemu-img create -q -f qcow2 -b a.qcow2 -F qcow2 b.qcow2");
  EXPECT_TRUE(Open(dir_ / "b.qcow2").ok());
  // A cycle: a -> b -> a, and a self loop.
  RunOk(Cd() + "qemu-img rebase -u -b b.qcow2 -F qcow2 a.qcow2");
  auto cycle = Open(dir_ / "b.qcow2");
  ASSERT_FALSE(cycle.ok());
  EXPECT_EQ(cycle.error().code(), ErrorCode::kCorruption);
  RunOk(Cd() + "qemu-img rebase -u -b a.qcow2 -F qcow2 a.qcow2");
  EXPECT_FALSE(Open(dir_ / "a.qcow2").ok());
  OpenOptions shallow;
  shallow.open_backing = false;
  EXPECT_TRUE(Open(dir_ / "a.qcow2", shallow).ok());
  // No backing format extension: rename its type so it is unknown.
  RunOk(Cd() + "qemu-img create -q -f qcow2 c.qcow2 1M && qemu-img create -q -f qcow2 -b c.qcow2 -F qcow2 d.qcow2");
  auto d = testing::ReadFile(dir_ / "d.qcow2");
  ASSERT_EQ(LoadBe32(d.data() + 112), kExtBackingFormat);
  Put32(d, 112, 0x12345678);
  testing::WriteFile(dir_ / "d.qcow2", d);
  auto noformat = Open(dir_ / "d.qcow2");
  ASSERT_FALSE(noformat.ok());
  EXPECT_NE(noformat.error().message().find("qemu-img rebase -u -F"), std::string::npos);
  // Backing name too long.
  Put32(d, 16, 2000);
  testing::WriteFile(dir_ / "d.qcow2", d);
  EXPECT_EQ(Open(dir_ / "d.qcow2").error().code(), ErrorCode::kCorruption);
}

TEST_F(Qcow2Backing, ChainDepthLimit) {
  RunOk(Cd() + "qemu-img create -q -f qcow2 l0.qcow2 1M && qemu-img create -q -f qcow2 -b l0.qcow2 -F qcow2 l1.qcow2 && "
               "qemu-img create -q -f qcow2 -b l1.qcow2 -F qcow2 l2.qcow2");
  OpenOptions options;
  options.max_chain_depth = 1;
  EXPECT_EQ(Open(dir_ / "l2.qcow2", options).error().code(), ErrorCode::kInvalidArgument);
  options.max_chain_depth = 2;
  EXPECT_TRUE(Open(dir_ / "l2.qcow2", options).ok());
}

// Offset 0 with COPIED is the data file's first cluster, but with the ZERO
// flag (no extended L2) the entry is a plain zero cluster, as qemu's
// qcow2_get_cluster_type decides: it reads as zeros, map gives no offset,
// and check counts no allocation. The reader and map gave host offset 0 for
// it, where the checker did not.
TEST_F(Qcow2Backing, DataFileClusterZeroWithZeroFlagIsAPlainZeroCluster) {
  BARGE_REQUIRE_TOOL("qemu-io");
  RunOk(Cd() + "qemu-img create -q -f qcow2 -o data_file=df.raw df.qcow2 1M && "
               "qemu-io -f qcow2 -c 'write -P 0x5a 0 64k' df.qcow2");
  std::vector<std::byte> b = testing::ReadFile(dir_ / "df.qcow2");
  const uint64_t l2 = Get64(b, Get64(b, 40)) & kL1OffsetMask;
  ASSERT_NE(l2, 0u);
  ASSERT_EQ(Get64(b, l2), kOflagCopied);  // guest cluster 0 at data file offset 0
  {  // Unpoked: data at host offset 0 of the data file, for all three.
    auto image = Open(dir_ / "df.qcow2");
    ASSERT_TRUE(image.ok()) << image.error().ToString();
    auto map = (*image)->Map(0, 64 << 10);
    ASSERT_TRUE(map.ok());
    ASSERT_EQ(map->size(), 1u);
    EXPECT_EQ((*map)[0].kind, ExtentKind::kData);
    EXPECT_EQ((*map)[0].host_offset, std::optional<uint64_t>(0));
    EXPECT_EQ(check_testing::MustCheck(b).allocated_clusters, 1u);
  }
  Put64(b, l2, kOflagCopied | kOflagZero);
  testing::WriteFile(dir_ / "df.qcow2", b);

  // qemu: a zero cluster with no offset, and a clean image.
  const json q = json::parse(RunOk(Cd() + "qemu-img map --output=json -f qcow2 df.qcow2"));
  ASSERT_GE(q.size(), 1u) << q.dump();
  EXPECT_EQ(q[0]["start"], 0);
  EXPECT_EQ(q[0]["zero"], true) << q.dump();
  EXPECT_EQ(q[0]["data"], false) << q.dump();
  EXPECT_FALSE(q[0].contains("offset")) << q.dump();
  RunOk(Cd() + "qemu-img check -q -f qcow2 df.qcow2");

  auto image = Open(dir_ / "df.qcow2");
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  auto map = (*image)->Map(0, 64 << 10);
  ASSERT_TRUE(map.ok()) << map.error().ToString();
  ASSERT_EQ(map->size(), 1u);
  EXPECT_EQ((*map)[0].kind, ExtentKind::kZero);
  EXPECT_FALSE((*map)[0].host_offset.has_value()) << *(*map)[0].host_offset;
  std::vector<std::byte> data(64 << 10, std::byte{1});
  ASSERT_TRUE((*image)->ReadAt(0, data).ok());
  EXPECT_EQ(data, std::vector<std::byte>(64 << 10));
  // The checker agrees: no allocated cluster, nothing wrong.
  const CheckReport r = check_testing::MustCheck(b);
  EXPECT_TRUE(r.clean()) << check_testing::Messages(r);
  EXPECT_EQ(r.allocated_clusters, 0u);
}

}  // namespace
}  // namespace barge::formats

namespace barge::formats::qcow2 {
namespace {

TEST(Qcow2L2Cache, EvictsAndReloads) {
  std::vector<std::byte> file(8 * 512);
  for (size_t i = 0; i < file.size(); ++i) file[i] = std::byte(i / 512);
  MemorySource source(file);
  L2Cache cache(source, 9, 2);
  for (int round = 0; round < 3; ++round) {
    for (uint64_t c = 0; c < 8; ++c) {
      auto table = cache.Get(c * 512);
      ASSERT_TRUE(table.ok());
      EXPECT_EQ((**table)[0], std::byte(c));
      EXPECT_EQ((**table)[511], std::byte(c));
    }
  }
}

TEST(Qcow2ConcurrentReads, ThreadsSeeTheSameBytes) {
  BARGE_REQUIRE_TOOL("qemu-img");
  barge::testing::TempDir dir;
  std::string raw = dir / "s.raw";
  barge::testing::WriteFile(raw, barge::testing::RandomBytes(2 << 20, 9));
  std::string img = dir / "c.qcow2";
  barge::testing::RunOk("qemu-img convert -c -O qcow2 -o cluster_size=4k " + raw + " " + img);
  auto image = OpenImage(img, [](const std::string& p) -> Result<std::unique_ptr<BlockSource>> {
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(barge::testing::ReadFile(p), p));
  });
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  const auto want = barge::testing::ReadFile(raw);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::byte> buf(12345);
      for (uint64_t off = t * 1000; off + buf.size() <= want.size(); off += 40000) {
        if (!(*image)->ReadAt(off, buf).ok() || !std::equal(buf.begin(), buf.end(), want.begin() + off)) {
          ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

// `img` opened over a CallLog of its file's reads and hints (*log).
Result<std::unique_ptr<Image>> OpenLogged(const std::string& img, barge::testing::CallLog** log) {
  return OpenImage(img, [log](const std::string& p) -> Result<std::unique_ptr<BlockSource>> {
    auto file = std::make_unique<barge::testing::CallLog>(
        std::make_unique<MemorySource>(barge::testing::ReadFile(p), p));
    *log = file.get();
    return std::unique_ptr<BlockSource>(std::move(file));
  });
}

// A pass in guest order over a layer is read ahead: hints never overlap and
// always move forward, and every data read after the first lies inside what
// was hinted before it. A jump far ahead is not hinted; reading on from
// there is.
TEST(Qcow2ReadAhead, SequentialPassIsHintedAheadAndJumpsAreNot) {
  BARGE_REQUIRE_TOOL("qemu-img");
  barge::testing::TempDir dir;
  std::string raw = dir / "s.raw";
  barge::testing::WriteFile(raw, barge::testing::RandomBytes(48 << 20, 4));
  std::string img = dir / "d.qcow2";
  barge::testing::RunOk("qemu-img convert -O qcow2 -o cluster_size=4k " + raw + " " + img);
  barge::testing::CallLog* log = nullptr;
  auto image = OpenLogged(img, &log);
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  std::vector<std::byte> buf(1 << 20);
  for (uint64_t off = 0; off < (8u << 20); off += buf.size()) ASSERT_TRUE((*image)->ReadAt(off, buf).ok());

  uint64_t hinted_end = 0;
  bool first_read = true;
  size_t hints = 0;
  std::vector<std::pair<uint64_t, uint64_t>> hinted;
  for (const barge::testing::CallLog::Call& c : log->calls()) {
    if (!c.hint && c.length <= 4096) continue;  // the header and L2 tables (4 KiB clusters)
    if (c.hint) {
      EXPECT_GE(c.offset, hinted_end) << "hints overlap or go back";
      if (!hinted.empty() && hinted.back().second == c.offset) {
        hinted.back().second = c.offset + c.length;  // one stretch with the one before
      } else {
        hinted.emplace_back(c.offset, c.offset + c.length);
      }
      hinted_end = c.offset + c.length;
      ++hints;
      continue;
    }
    if (first_read) {
      first_read = false;
      continue;
    }
    bool inside = std::any_of(hinted.begin(), hinted.end(), [&](auto& h) {
      return c.offset >= h.first && c.offset + c.length <= h.second;
    });
    EXPECT_TRUE(inside) << "read at " << c.offset << " was not hinted before";
  }
  EXPECT_GE(hints, 2u);

  // Far past the hinted end: no hint; the next read on from it: hinted.
  ASSERT_TRUE((*image)->ReadAt(40u << 20, buf).ok());
  auto after_jump = log->calls();
  EXPECT_FALSE(after_jump.back().hint);
  EXPECT_EQ(std::count_if(after_jump.begin(), after_jump.end(), [](auto& c) { return c.hint; }),
            static_cast<long>(hints));
  ASSERT_TRUE((*image)->ReadAt(41u << 20, buf).ok());
  auto later = log->calls();
  EXPECT_GT(std::count_if(later.begin(), later.end(), [](auto& c) { return c.hint; }), static_cast<long>(hints));
}

// A copy's chunk is one ReadMany of its data runs: the layer fetches the
// stored runs of all of them sorted by file offset, so neighbouring runs
// cost one read of the file (one GET from a bucket), not one each.
TEST(Qcow2ReadMany, NeighbouringRequestsAreOneReadOfTheFile) {
  BARGE_REQUIRE_TOOL("qemu-img");
  barge::testing::TempDir dir;
  std::string raw = dir / "s.raw";
  const std::vector<std::byte> bytes = barge::testing::RandomBytes(4 << 20, 5);
  barge::testing::WriteFile(raw, bytes);
  std::string img = dir / "d.qcow2";
  barge::testing::RunOk("qemu-img convert -O qcow2 -o cluster_size=64k " + raw + " " + img);
  barge::testing::CallLog* log = nullptr;
  auto image = OpenLogged(img, &log);
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  const size_t before = log->calls().size();
  // Four runs of one cluster each, next to each other in the file.
  std::vector<std::byte> out(4 << 16);
  std::vector<ReadRequest> requests;
  for (size_t i = 0; i < 4; ++i) {
    requests.push_back({(1u << 20) + i * (1u << 16), std::span(out).subspan(i << 16, 1u << 16), {}});
  }
  ASSERT_TRUE((*image)->ReadMany(requests).ok());
  EXPECT_TRUE(std::equal(out.begin(), out.end(), bytes.begin() + (1 << 20)));
  std::vector<barge::testing::CallLog::Call> reads;
  const auto calls = log->calls();  // a copy: calls() returns by value
  for (size_t i = before; i < calls.size(); ++i) {
    const auto& c = calls[i];
    if (!c.hint && c.length > (1u << 16)) reads.push_back(c);  // data, not an L2 table
  }
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].length, 4u << 16);
}

}  // namespace
}  // namespace barge::formats::qcow2
