// Unit tests for the one-pass qcow2 writer against an in-memory sink: header
// fields, entry encodings, option and order checks, sink op sequence, and an
// in-memory refcount check (a small "qemu-img check") over many options.
#include "formats/qcow2_writer.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <string>

#include "blockio/fault.h"
#include "blockio/memory.h"
#include "formats/qcow2_compress.h"
#include "formats/qcow2_format.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using namespace qcow2;  // constants and Be helpers

struct Header {
  uint32_t cluster_bits = 0;
  uint64_t size = 0;
  uint32_t l1_size = 0;
  uint64_t l1_offset = 0, rt_offset = 0;
  uint32_t rt_clusters = 0, refcount_order = 0, header_length = 0;
  uint64_t incompat = 0, compat = 0, autoclear = 0;
  uint8_t compression = 0;
  uint64_t backing_offset = 0;
  uint32_t backing_size = 0;
  std::map<uint32_t, std::string> extensions;
};

Header ParseHeader(const std::vector<std::byte>& f) {
  Header h;
  const std::byte* p = f.data();
  EXPECT_EQ(LoadBe32(p), kMagic);
  EXPECT_EQ(LoadBe32(p + 4), 3u);
  h.backing_offset = LoadBe64(p + 8);
  h.backing_size = LoadBe32(p + 16);
  h.cluster_bits = LoadBe32(p + 20);
  h.size = LoadBe64(p + 24);
  h.l1_size = LoadBe32(p + 36);
  h.l1_offset = LoadBe64(p + 40);
  h.rt_offset = LoadBe64(p + 48);
  h.rt_clusters = LoadBe32(p + 56);
  h.incompat = LoadBe64(p + 72);
  h.compat = LoadBe64(p + 80);
  h.autoclear = LoadBe64(p + 88);
  h.refcount_order = LoadBe32(p + 96);
  h.header_length = LoadBe32(p + 100);
  h.compression = uint8_t(p[104]);
  for (size_t at = h.header_length;;) {
    uint32_t type = LoadBe32(p + at), len = LoadBe32(p + at + 4);
    if (type == 0) break;
    h.extensions[type] = std::string(reinterpret_cast<const char*>(p + at + 8), len);
    at += 8 + (len + 7) / 8 * 8;
  }
  return h;
}

// Recounts every reference like qemu-img check, compares with the stored
// refcounts, checks COPIED flags, and returns the guest view.
std::vector<std::byte> CheckImage(const std::vector<std::byte>& f, Compression compression) {
  Header h = ParseHeader(f);
  uint64_t cs = uint64_t{1} << h.cluster_bits;
  std::map<uint64_t, uint64_t> refs;
  auto add = [&](uint64_t offset, uint64_t bytes) {
    for (uint64_t c = offset >> h.cluster_bits; c <= (offset + bytes - 1) >> h.cluster_bits; ++c) ++refs[c];
  };
  add(0, cs);
  if (h.l1_size) add(h.l1_offset, h.l1_size * 8);
  add(h.rt_offset, h.rt_clusters * cs);
  std::vector<std::byte> guest(h.size);
  uint64_t l2_entries = cs / 8;
  for (uint64_t i = 0; i < h.l1_size; ++i) {
    uint64_t l1 = LoadBe64(f.data() + h.l1_offset + i * 8);
    if (l1 == 0) continue;
    EXPECT_TRUE(l1 & kOflagCopied) << "L1 entry " << i;
    uint64_t l2_off = l1 & kL1OffsetMask;
    add(l2_off, cs);
    for (uint64_t j = 0; j < l2_entries; ++j) {
      uint64_t e = LoadBe64(f.data() + l2_off + j * 8);
      uint64_t guest_off = (i * l2_entries + j) * cs;
      if (e == 0 || e == kOflagZero) continue;
      EXPECT_LT(guest_off, h.size);
      uint64_t n = std::min(cs, h.size - guest_off);
      if (e & kOflagCompressed) {
        EXPECT_FALSE(e & kOflagCopied);
        uint32_t x = CompressedOffsetBits(h.cluster_bits);
        uint64_t off = e & ((uint64_t{1} << x) - 1);
        uint64_t sectors = ((e >> x) & ((uint64_t{1} << (h.cluster_bits - 8)) - 1)) + 1;
        uint64_t rlen = sectors * 512 - (off & 511);
        add(off, rlen);
        std::vector<std::byte> out(cs);
        uint64_t avail = std::min<uint64_t>(rlen, f.size() - off);
        EXPECT_TRUE(DecompressCluster(compression, {f.data() + off, avail}, out).ok());
        std::copy(out.begin(), out.begin() + n, guest.begin() + guest_off);
      } else {
        EXPECT_TRUE(e & kOflagCopied);
        EXPECT_EQ(e & ~(kL2OffsetMask | kOflagCopied), 0u);
        uint64_t off = e & kL2OffsetMask;
        add(off, cs);
        std::copy(f.begin() + off, f.begin() + off + n, guest.begin() + guest_off);
      }
    }
  }
  auto bitmaps = h.extensions.find(kExtBitmaps);
  if (bitmaps != h.extensions.end()) {
    auto* ext = reinterpret_cast<const std::byte*>(bitmaps->second.data());
    uint32_t count = LoadBe32(ext);
    uint64_t dir_size = LoadBe64(ext + 8), dir_off = LoadBe64(ext + 16);
    add(dir_off, dir_size);
    const std::byte* e = f.data() + dir_off;
    for (uint32_t b = 0; b < count; ++b) {
      uint64_t table = LoadBe64(e);
      uint32_t table_size = LoadBe32(e + 8);
      add(table, table_size * 8);
      for (uint32_t k = 0; k < table_size; ++k) {
        uint64_t t = LoadBe64(f.data() + table + k * 8);
        if (t) add(t, cs);
      }
      e += (24 + LoadBe16(e + 18) + 7) / 8 * 8;
    }
  }
  uint64_t per_block = RefcountsPerBlock(h.cluster_bits, h.refcount_order);
  uint64_t file_clusters = (f.size() + cs - 1) / cs;
  for (uint64_t i = 0; i < h.rt_clusters * cs / 8; ++i) {
    uint64_t block = LoadBe64(f.data() + h.rt_offset + i * 8);
    if (block) add(block, cs);
  }
  for (uint64_t c = 0; c < file_clusters; ++c) {
    uint64_t block = LoadBe64(f.data() + h.rt_offset + (c / per_block) * 8);
    uint64_t k = c % per_block, rc = 0;
    uint32_t order = h.refcount_order;
    if (order < 3) {
      uint64_t bit = k << order;
      rc = (uint8_t(f[block + bit / 8]) >> (bit % 8)) & ((1u << (1u << order)) - 1);
    } else {
      for (uint32_t b = 0; b < (1u << order) / 8; ++b) rc = (rc << 8) | uint8_t(f[block + k * ((1u << order) / 8) + b]);
    }
    EXPECT_EQ(rc, refs.count(c) ? refs[c] : 0) << "cluster " << c;
  }
  EXPECT_LE(refs.rbegin()->first, file_clusters - 1) << "reference past the end of the file";
  return guest;
}

std::vector<std::byte> Compressible(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::byte((i / 64) * 7 + seed);
  return out;
}

Qcow2WriterOptions Options(uint64_t size, uint32_t bits = 12, uint32_t order = 4,
                           Compression c = Compression::kZstd) {
  Qcow2WriterOptions o;
  o.virtual_size = size;
  o.cluster_bits = bits;
  o.refcount_order = order;
  o.compression = c;
  return o;
}

TEST(Qcow2WriterTest, HeaderFieldsZstd) {
  MemorySink sink;
  auto w = Qcow2Writer::Create(sink, Options(1000000, 16, 4, Compression::kZstd));
  ASSERT_TRUE(w.ok()) << w.error().ToString();
  EXPECT_EQ((*w)->cluster_size(), 65536u);
  EXPECT_EQ((*w)->cluster_count(), 16u);
  ASSERT_TRUE((*w)->Finish().ok());
  Header h = ParseHeader(sink.contents());
  EXPECT_EQ(h.cluster_bits, 16u);
  EXPECT_EQ(h.size, 1000448u);  // rounded up to 512
  EXPECT_EQ(h.header_length, 112u);
  EXPECT_EQ(h.compression, 1);
  EXPECT_EQ(h.incompat, kIncompatCompression);
  EXPECT_EQ(h.compat, 0u);
  EXPECT_EQ(h.autoclear, 0u);
  EXPECT_EQ(h.refcount_order, 4u);
  EXPECT_EQ(h.l1_size, 1u);
  EXPECT_EQ(h.backing_offset, 0u);
  EXPECT_TRUE(h.extensions.empty());
  EXPECT_EQ((*w)->stats().file_bytes, sink.contents().size());
  CheckImage(sink.contents(), Compression::kZstd);
}

TEST(Qcow2WriterTest, HeaderFieldsDeflateAndNone) {
  for (Compression c : {Compression::kDeflate, Compression::kNone}) {
    MemorySink sink;
    auto w = Qcow2Writer::Create(sink, Options(4096, 9, 0, c));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Finish().ok());
    Header h = ParseHeader(sink.contents());
    EXPECT_EQ(h.compression, 0);
    EXPECT_EQ(h.incompat, 0u);
    EXPECT_EQ(h.refcount_order, 0u);
  }
}

TEST(Qcow2WriterTest, EntryEncodingsAndPacking) {
  MemorySink sink;
  auto w = Qcow2Writer::Create(sink, Options(8 * 4096, 12, 4, Compression::kDeflate));
  ASSERT_TRUE(w.ok());
  ClusterCompressor comp(Compression::kDeflate, 0);
  auto data = barge::testing::RandomBytes(4096, 1);
  ASSERT_TRUE((*w)->WriteData(0, data).ok());
  ASSERT_TRUE((*w)->WriteZero(1).ok());
  for (uint64_t i = 3; i < 6; ++i) {
    auto payload = comp.Compress(Compressible(4096, i));
    ASSERT_TRUE(payload.ok() && payload->has_value());
    ASSERT_TRUE((*w)->WriteCompressed(i, **payload).ok());
  }
  ASSERT_TRUE((*w)->WriteData(7, data).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto f = sink.contents();
  Header h = ParseHeader(f);
  uint64_t l2 = LoadBe64(f.data() + h.l1_offset) & kL1OffsetMask;
  auto entry = [&](int i) { return LoadBe64(f.data() + l2 + i * 8); };
  EXPECT_EQ(entry(0), 4096u | kOflagCopied);  // first cluster after the header
  EXPECT_EQ(entry(1), kOflagZero);
  EXPECT_EQ(entry(2), 0u);
  uint32_t x = CompressedOffsetBits(12);
  uint64_t mask = (uint64_t{1} << x) - 1;
  EXPECT_EQ(entry(3) & mask, 8192u);  // packed right after the data cluster
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(entry(i) & kOflagCompressed);
  EXPECT_EQ((entry(4) & mask) >> 12, 2u);  // shares host cluster 2
  EXPECT_EQ(entry(7) & kL2OffsetMask, 3u * 4096) << "NORMAL cluster padded to the next boundary";
  auto guest = CheckImage(f, Compression::kDeflate);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), guest.begin()));
  auto c4 = Compressible(4096, 4);
  EXPECT_TRUE(std::equal(c4.begin(), c4.end(), guest.begin() + 4 * 4096));
}

// With refcount order 0 every payload gets a host cluster of its own; with
// order 1 at most three payloads share one.
TEST(Qcow2WriterTest, LowRefcountOrdersLimitSharing) {
  for (uint32_t order : {0u, 1u}) {
    SCOPED_TRACE(order);
    MemorySink sink;
    auto w = Qcow2Writer::Create(sink, Options(20 * 4096, 12, order, Compression::kZstd));
    ASSERT_TRUE(w.ok());
    ClusterCompressor comp(Compression::kZstd, 0);
    for (uint64_t i = 0; i < 20; ++i) {
      auto payload = comp.Compress(Compressible(4096, i));
      ASSERT_TRUE(payload.ok() && payload->has_value());
      ASSERT_TRUE((*w)->WriteCompressed(i, **payload).ok());
    }
    ASSERT_TRUE((*w)->Finish().ok());
    auto f = sink.contents();
    Header h = ParseHeader(f);
    uint64_t l2 = LoadBe64(f.data() + h.l1_offset) & kL1OffsetMask;
    std::map<uint64_t, int> per_cluster;
    uint64_t mask = (uint64_t{1} << CompressedOffsetBits(12)) - 1;
    for (int i = 0; i < 20; ++i) ++per_cluster[(LoadBe64(f.data() + l2 + i * 8) & mask) >> 12];
    for (auto [cluster, n] : per_cluster) EXPECT_LE(n, order == 0 ? 1 : 3) << "cluster " << cluster;
    CheckImage(f, Compression::kZstd);
  }
}

// Random mixes over every cluster size and refcount order, checked in memory.
TEST(Qcow2WriterTest, RefcountsExactForRandomMixes) {
  for (uint32_t bits : {9u, 10u, 12u, 16u}) {
    for (uint32_t order = 0; order <= 6; ++order) {
      SCOPED_TRACE(::testing::Message() << "bits " << bits << " order " << order);
      uint64_t cs = uint64_t{1} << bits;
      uint64_t size = (bits == 16 ? 20 : 300) * cs - 700;
      MemorySink sink;
      Qcow2WriterOptions o = Options(size, bits, order, Compression::kZstd);
      o.bitmaps = {BitmapSpec{"a", 512, true, {{0, size / 3}}}, BitmapSpec{"b", 4096, false, {{size - 1, 1}}}};
      auto w = Qcow2Writer::Create(sink, o);
      ASSERT_TRUE(w.ok()) << w.error().ToString();
      ClusterCompressor comp(Compression::kZstd, 0);
      uint64_t rounded = (size + 511) / 512 * 512;
      std::vector<std::byte> expected(rounded);
      for (uint64_t i = 0; i < (*w)->cluster_count(); ++i) {
        uint64_t len = std::min(cs, rounded - i * cs);
        uint64_t kind = (i * 2654435761u + order) % 5;
        std::vector<std::byte> d =
            kind == 0 ? barge::testing::RandomBytes(cs, i) : Compressible(cs, i);
        std::fill(d.begin() + len, d.end(), std::byte{0});
        if (kind == 3) {
          ASSERT_TRUE((*w)->WriteZero(i).ok());
          continue;
        }
        if (kind == 4) continue;
        std::copy(d.begin(), d.begin() + len, expected.begin() + i * cs);
        auto payload = comp.Compress(d);
        ASSERT_TRUE(payload.ok());
        Status st = (kind != 1 && payload->has_value())
                        ? (*w)->WriteCompressed(i, **payload)
                        : (*w)->WriteData(i, std::span<const std::byte>(d.data(), len));
        ASSERT_TRUE(st.ok()) << st.error().ToString();
      }
      ASSERT_TRUE((*w)->Finish().ok());
      EXPECT_EQ(CheckImage(sink.contents(), Compression::kZstd), expected);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// All-zero 4 KiB blocks of what the writer appends (zero blocks inside a
// data cluster, the unused tail of the L1 table's cluster) are not written
// to a zero-initialized sink, as qemu-img leaves them sparse; the image
// still reads back exactly.
TEST(Qcow2WriterTest, ZeroBlocksAreLeftUnwritten) {
  MemorySink sink;
  auto w = Qcow2Writer::Create(sink, Options(1 << 20, 16, 4, Compression::kNone));
  ASSERT_TRUE(w.ok());
  std::vector<std::byte> data = barge::testing::RandomBytes(65536, 5);
  std::fill(data.begin() + 8192, data.begin() + 12288, std::byte{0});
  ASSERT_TRUE((*w)->WriteData(0, data).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto written = [&](uint64_t begin, uint64_t end) {
    for (const SinkOp& op : sink.ops()) {
      if (op.kind == SinkOp::Kind::kWrite && op.offset < end && op.offset + op.length > begin) return true;
    }
    return false;
  };
  // Layout: header (0), the data cluster (64 KiB), its L2 table, the L1.
  EXPECT_TRUE(written(65536, 65536 + 8192));
  EXPECT_FALSE(written(65536 + 8192, 65536 + 12288));
  EXPECT_TRUE(written(65536 + 12288, 131072));
  EXPECT_FALSE(written(3 * 65536 + 4096, 4 * 65536));  // the L1 cluster's tail
  const auto contents = sink.contents();
  ASSERT_GE(contents.size(), 131072u);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), contents.begin() + 65536));
}

TEST(Qcow2WriterTest, HeaderIsWrittenLastThenFlushed) {
  MemorySink sink;
  auto w = Qcow2Writer::Create(sink, Options(10 * 4096));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->WriteData(2, barge::testing::RandomBytes(4096, 2)).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto ops = sink.ops();
  ASSERT_GE(ops.size(), 4u);
  // Cluster 0 is reserved as zeros: on a zero-initialized sink it is left
  // unwritten (a hole), so the first write of appended clusters lies past it.
  EXPECT_EQ(ops.front().kind, SinkOp::Kind::kWrite);
  EXPECT_GE(ops.front().offset, 4096u);
  const auto contents = sink.contents();
  ASSERT_GE(contents.size(), 4096u);
  EXPECT_TRUE(std::all_of(contents.begin() + 120, contents.begin() + 4096,
                          [](std::byte b) { return b == std::byte{0}; }));
  EXPECT_EQ(ops.back().kind, SinkOp::Kind::kFlush);
  const SinkOp& header = ops[ops.size() - 2];
  EXPECT_EQ(header.kind, SinkOp::Kind::kWrite);
  EXPECT_EQ(header.offset, 0u);
  EXPECT_EQ(header.length, 120u);  // 112-byte header + end marker
  for (size_t i = 1; i + 2 < ops.size(); ++i) {
    EXPECT_GE(ops[i].offset, 4096u) << "op " << i;
    EXPECT_NE(ops[i].kind, SinkOp::Kind::kFlush);
  }
  // A crash before the final flush leaves no qcow2 magic behind.
  MemorySink crashed;
  auto w2 = Qcow2Writer::Create(crashed, Options(10 * 4096));
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->WriteData(0, barge::testing::RandomBytes(4096, 2)).ok());
  crashed.SimulateCrash();
  auto bytes = crashed.contents();
  EXPECT_TRUE(bytes.size() < 4 || LoadBe32(bytes.data()) != kMagic);
}

TEST(Qcow2WriterTest, OrderViolationsAreRejected) {
  MemorySink sink;
  auto w = Qcow2Writer::Create(sink, Options(10 * 4096 - 1000));
  ASSERT_TRUE(w.ok());
  auto data = barge::testing::RandomBytes(4096, 1);
  ASSERT_TRUE((*w)->WriteData(3, data).ok());
  EXPECT_EQ((*w)->WriteData(3, data).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*w)->WriteZero(2).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*w)->WriteData(10, data).error().code(), ErrorCode::kInvalidArgument);
  // Short data only for the last cluster.
  EXPECT_EQ((*w)->WriteData(4, std::span(data).first(100)).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*w)->WriteCompressed(5, data).error().code(), ErrorCode::kInvalidArgument);  // too big
  EXPECT_EQ((*w)->WriteCompressed(5, {}).error().code(), ErrorCode::kInvalidArgument);
  // The rejected calls changed nothing.
  ASSERT_TRUE((*w)->WriteData(9, std::span(data).first(3096)).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_FALSE((*w)->Finish().ok());
  EXPECT_FALSE((*w)->WriteZero(9).ok());
  CheckImage(sink.contents(), Compression::kZstd);
}

TEST(Qcow2WriterTest, BadOptionsAreRejected) {
  auto code = [](Qcow2WriterOptions o) {
    MemorySink sink;
    auto w = Qcow2Writer::Create(sink, std::move(o));
    return w.ok() ? ErrorCode::kIoError : w.error().code();
  };
  const auto kInvalid = ErrorCode::kInvalidArgument;
  auto o = Options(1 << 20);
  o.cluster_bits = 8;
  EXPECT_EQ(code(o), kInvalid);
  o.cluster_bits = 22;
  EXPECT_EQ(code(o), kInvalid);
  o = Options(1 << 20, 12, 7);
  EXPECT_EQ(code(o), kInvalid);
  o = Options(1 << 20);
  o.backing_file = "base.qcow2";
  EXPECT_EQ(code(o), kInvalid);  // no format
  o.backing_format = "vmdk";
  EXPECT_EQ(code(o), kInvalid);
  o.backing_format = "qcow2";
  o.backing_file = std::string(1024, 'a');
  EXPECT_EQ(code(o), kInvalid);
  o = Options(1 << 20, 9);
  o.backing_file = std::string(500, 'a');  // does not fit in a 512-byte cluster 0
  o.backing_format = "raw";
  EXPECT_EQ(code(o), kInvalid);
  o = Options(1 << 20);
  o.backing_format = "raw";
  EXPECT_EQ(code(o), kInvalid);  // format without file
  o = Options(1 << 20);
  o.bitmaps = {BitmapSpec{"x", 65536, true, {}}, BitmapSpec{"x", 65536, true, {}}};
  EXPECT_EQ(code(o), kInvalid);
  o.bitmaps = {BitmapSpec{"", 65536, true, {}}};
  EXPECT_EQ(code(o), kInvalid);
  o.bitmaps = {BitmapSpec{std::string(1024, 'b'), 65536, true, {}}};
  EXPECT_EQ(code(o), kInvalid);
  for (uint32_t g : {0u, 256u, 3000u}) {
    o.bitmaps = {BitmapSpec{"g", g, true, {}}};
    EXPECT_EQ(code(o), kInvalid) << g;
  }
  o = Options(uint64_t{1} << 50, 9);  // L1 over 32 MiB
  EXPECT_EQ(code(o), kInvalid);
  MemorySink used;
  ASSERT_TRUE(used.WriteAt(0, barge::testing::RandomBytes(10, 1)).ok());
  EXPECT_FALSE(Qcow2Writer::Create(used, Options(4096)).ok());
  MemorySink none;
  auto w = Qcow2Writer::Create(none, Options(65536, 12, 4, Compression::kNone));
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->WriteCompressed(0, std::vector<std::byte>(10)).error().code(), kInvalid);
}

TEST(Qcow2WriterTest, BackingFileAfterEndMarker) {
  MemorySink sink;
  auto o = Options(65536);
  o.backing_file = "../base.qcow2";
  o.backing_format = "qcow2";
  auto w = Qcow2Writer::Create(sink, o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->WriteZero(0).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  auto f = sink.contents();
  Header h = ParseHeader(f);
  EXPECT_EQ(h.extensions[kExtBackingFormat], "qcow2");
  EXPECT_EQ(h.backing_offset, 112u + 16 + 8);  // after the extension and end marker
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data() + h.backing_offset), h.backing_size),
            "../base.qcow2");
  CheckImage(f, Compression::kZstd);
}

TEST(Qcow2WriterTest, SparseHugeDiskKeepsMemoryAndFileSmall) {
  MemorySink sink;
  const uint64_t size = uint64_t{1} << 40;  // 1 TiB, 64 KiB clusters
  auto w = Qcow2Writer::Create(sink, Options(size, 16));
  ASSERT_TRUE(w.ok());
  auto data = barge::testing::RandomBytes(65536, 3);
  ASSERT_TRUE((*w)->WriteData(0, data).ok());
  ASSERT_TRUE((*w)->WriteData((size >> 16) / 2, data).ok());
  ASSERT_TRUE((*w)->WriteData((size >> 16) - 1, data).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  // header, 3 data, 3 L2, 1 L1 (2048 entries = 16 KiB), refcount table + block
  EXPECT_EQ(sink.contents().size(), 10u * 65536);
  Header h = ParseHeader(sink.contents());
  EXPECT_EQ(h.l1_size, 2048u);
}

TEST(Qcow2WriterTest, SinkErrorsPropagateAndStopTheWriter) {
  MemorySink target;
  FaultSink sink(target);
  auto w = Qcow2Writer::Create(sink, Options(10 * 4096));
  ASSERT_TRUE(w.ok());
  sink.faults().AddRule(FaultRule::Always(FaultOp::kWrite, ENOSPC));
  // Appends are buffered: the error comes with the write that carries them
  // out, at the latest in Finish.
  Status st = (*w)->WriteData(0, barge::testing::RandomBytes(4096, 1));
  if (st.ok()) st = (*w)->Finish();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kNoSpace);
  EXPECT_NE(st.error().message().find("qcow2 writer: writing"), std::string::npos) << st.error().ToString();
  sink.faults().ClearRules();
  EXPECT_FALSE((*w)->WriteZero(1).ok());
  EXPECT_FALSE((*w)->Finish().ok());

  MemorySink target2;
  FaultSink sink2(target2);
  sink2.faults().AddRule(FaultRule::Always(FaultOp::kFlush));
  auto w2 = Qcow2Writer::Create(sink2, Options(4096));
  ASSERT_TRUE(w2.ok());
  EXPECT_EQ((*w2)->Finish().error().code(), ErrorCode::kIoError);
}

TEST(Qcow2WriterTest, DataFileOverlayIdentityMapping) {
  MemorySink sink;
  OverlayOptions o;
  o.virtual_size = 5 * 65536 + 512;
  o.data_file_path = "/var/lib/disk.raw";
  o.bitmaps = {BitmapSpec{"cbt0", 65536, true, {}}};
  ASSERT_TRUE(WriteDataFileOverlay(sink, o).ok());
  auto f = sink.contents();
  Header h = ParseHeader(f);
  EXPECT_EQ(h.incompat, kIncompatDataFile);
  EXPECT_EQ(h.autoclear, kAutoclearDataFileRaw | kAutoclearBitmaps);
  EXPECT_EQ(h.extensions[kExtDataFile], "/var/lib/disk.raw");
  EXPECT_EQ(h.compression, 0);
  uint64_t l2 = LoadBe64(f.data() + h.l1_offset) & kL1OffsetMask;
  EXPECT_EQ(LoadBe64(f.data() + l2), 0x8000000000000000ull);
  for (uint64_t i = 1; i < 6; ++i) EXPECT_EQ(LoadBe64(f.data() + l2 + i * 8), (i << 16) | kOflagCopied);
  EXPECT_EQ(LoadBe64(f.data() + l2 + 6 * 8), 0u);
  // Header, L2, L1, bitmap table, directory, refcount table and block.
  EXPECT_EQ(f.size(), 7u * 65536);

  MemorySink s2;
  o.data_file_path = "disk.raw";
  EXPECT_EQ(WriteDataFileOverlay(s2, o).error().code(), ErrorCode::kInvalidArgument);
  o.data_file_path = "/d.raw";
  o.virtual_size = 1000;
  EXPECT_EQ(WriteDataFileOverlay(s2, o).error().code(), ErrorCode::kInvalidArgument);
}

// Resume: a writer rebuilt from the calls made up to a Sync (over a file a
// killed writer left, with more appended after the Sync) finishes the image
// byte for byte as one that never stopped.
struct ResumeOp {
  StoredCluster stored;
  std::vector<std::byte> bytes;  // data or compressed payload
};

std::vector<ResumeOp> ResumeOps(uint32_t cluster_bits, uint64_t clusters) {
  std::vector<ResumeOp> ops;
  const uint32_t cs = 1u << cluster_bits;
  for (uint64_t c = 0; c < clusters; ++c) {
    if (c % 7 == 3) continue;  // never named
    ResumeOp op;
    op.stored.cluster_index = c;
    if (c % 5 == 0) {
      op.stored.kind = StoredKind::kZero;
    } else if (c % 3 == 0) {
      op.stored.kind = StoredKind::kCompressed;
      op.bytes = testing::RandomBytes(1 + (c * 37) % (cs - 512), c);
      op.stored.payload_bytes = static_cast<uint32_t>(op.bytes.size());
    } else {
      op.stored.kind = StoredKind::kData;
      op.bytes = testing::RandomBytes(c + 1 == clusters ? cs - 512 : cs, c);
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

Status Apply(Qcow2Writer& w, const ResumeOp& op) {
  switch (op.stored.kind) {
    case StoredKind::kData: return w.WriteData(op.stored.cluster_index, op.bytes);
    case StoredKind::kCompressed: return w.WriteCompressed(op.stored.cluster_index, op.bytes);
    case StoredKind::kZero: return w.WriteZero(op.stored.cluster_index);
  }
  return OkStatus();
}

TEST(Qcow2WriterResumeTest, ResumedImageIsByteIdentical) {
  for (uint32_t order : {0u, 1u, 4u}) {
    Qcow2WriterOptions o;
    o.cluster_bits = 10;  // 128 entries per L2 table: several tables
    o.refcount_order = order;
    o.virtual_size = 600 * 1024 - 512;  // a short last cluster
    o.compression = Compression::kZstd;
    std::vector<ResumeOp> ops = ResumeOps(o.cluster_bits, 600);
    MemorySink reference;
    {
      auto w = Qcow2Writer::Create(reference, o);
      ASSERT_TRUE(w.ok());
      for (const ResumeOp& op : ops) ASSERT_TRUE(Apply(**w, op).ok());
      ASSERT_TRUE((*w)->Finish().ok());
    }
    for (size_t cut : {size_t{0}, size_t{1}, size_t{100}, size_t{109}, size_t{110}, size_t{111}, size_t{300}, ops.size()}) {
      SCOPED_TRACE("refcount order " + std::to_string(order) + ", cut after " + std::to_string(cut));
      MemorySink sink;
      std::vector<StoredCluster> stored;
      {
        auto killed = Qcow2Writer::Create(sink, o);
        ASSERT_TRUE(killed.ok());
        for (size_t i = 0; i < cut; ++i) {
          ASSERT_TRUE(Apply(**killed, ops[i]).ok());
          stored.push_back(ops[i].stored);
        }
        auto end = (*killed)->Sync();
        ASSERT_TRUE(end.ok());
        auto planned = Qcow2Writer::PlanStored(o, stored);
        ASSERT_TRUE(planned.ok());
        EXPECT_EQ(planned->end_bytes, *end);
        // What the killed run appended after its last sync.
        for (size_t i = cut; i < std::min(ops.size(), cut + 20); ++i) ASSERT_TRUE(Apply(**killed, ops[i]).ok());
        ASSERT_TRUE((*killed)->Sync().ok());
      }
      auto resumed = Qcow2Writer::Resume(sink, o, stored);
      ASSERT_TRUE(resumed.ok()) << resumed.error().ToString();
      for (size_t i = cut; i < ops.size(); ++i) ASSERT_TRUE(Apply(**resumed, ops[i]).ok());
      ASSERT_TRUE((*resumed)->Finish().ok());
      EXPECT_TRUE(sink.contents() == reference.contents());
      if (!ops.empty() && cut > 0) {
        EXPECT_FALSE(Apply(**resumed, ops[0]).ok());  // finished
      }
    }
  }
}

TEST(Qcow2WriterResumeTest, PlanStoredRefusesOutOfOrderAndForeignKinds) {
  Qcow2WriterOptions o;
  o.virtual_size = 1 << 20;
  std::vector<StoredCluster> stored = {{3, StoredKind::kData, 0}, {2, StoredKind::kData, 0}};
  EXPECT_FALSE(Qcow2Writer::PlanStored(o, stored).ok());
  o.compression = Compression::kNone;
  std::vector<StoredCluster> compressed = {{1, StoredKind::kCompressed, 100}};
  EXPECT_FALSE(Qcow2Writer::PlanStored(o, compressed).ok());
  std::vector<StoredCluster> beyond = {{16, StoredKind::kZero, 0}};
  EXPECT_FALSE(Qcow2Writer::PlanStored(o, beyond).ok());
}

}  // namespace
}  // namespace barge::formats
