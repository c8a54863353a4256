// Tests for the qcow2 checker: qemu-made images are clean; poked refcounts
// give the same verdict (exit code) as `qemu-img check`.
#include "formats/qcow2_check.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "blockio/memory.h"
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_snapshot.h"
#include "tests/testing/qcow2_check_testing.h"
#include "tests/testing/testing.h"

namespace barge::formats::qcow2 {
namespace {

using check_testing::Messages;
using check_testing::MustCheck;

using testing::Run;
using testing::RunOk;
using testing::TempDir;

class Qcow2Check : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
  }
  int QemuCheck(const std::vector<std::byte>& bytes) {
    testing::WriteFile(dir_ / "q.qcow2", bytes);
    return barge::testing::Run("qemu-img check -f qcow2 " + dir_ / "q.qcow2").exit_code;
  }
  TempDir dir_;
};

TEST_F(Qcow2Check, QemuImagesAreClean) {
  const std::string img = dir_ / "i.qcow2";
  const char* variants[] = {
      "-o cluster_size=512",
      "-o cluster_size=4k,refcount_bits=1",
      "-o cluster_size=64k,refcount_bits=64",
      "-o cluster_size=64k,extended_l2=on",
      "-o compat=0.10",
      "-o cluster_size=2M",
  };
  for (const char* opts : variants) {
    SCOPED_TRACE(opts);
    RunOk("rm -f " + img + " && qemu-img create -q -f qcow2 " + std::string(opts) + " " + img + " 4M");
    RunOk("qemu-io -f qcow2 -c 'write -P 1 0 100k' -c 'write -z 1M 64k' -c 'write 3M 4k' -c 'write -z 0 4k' " + img);
    const std::string o = opts;
    if (o.find("compat=0.10") == std::string::npos) {  // v2 cannot store bitmaps
      RunOk("qemu-img bitmap --add " + img + " b0 && qemu-io -f qcow2 -c 'write 2M 4k' " + img);
    }
    if (o.find("refcount_bits=1") == std::string::npos) {  // snapshots need refcounts > 1
      RunOk("qemu-img snapshot -c s1 " + img + " && qemu-io -f qcow2 -c 'write -P 2 0 8k' " + img);
    }
    const auto bytes = testing::ReadFile(img);
    CheckReport r = MustCheck(bytes);
    EXPECT_TRUE(r.clean()) << Messages(r);
    EXPECT_EQ(QemuCheck(bytes), 0);
    EXPECT_GT(r.allocated_clusters, 0u);
  }
  // Compressed images, and packed payloads sharing clusters.
  RunOk("qemu-img create -q -f raw " + dir_ / "s.raw" + " 2M && qemu-io -f raw -c 'write -P 5 0 1M' " + dir_ / "s.raw");
  for (const char* type : {"zlib", "zstd"}) {
    RunOk("rm -f " + img + " && qemu-img convert -c -O qcow2 -o cluster_size=4k,compression_type=" + std::string(type) +
          " " + dir_ / "s.raw" + " " + img);
    CheckReport r = MustCheck(testing::ReadFile(img));
    EXPECT_TRUE(r.clean()) << type << "\n" << Messages(r);
  }
  // An external data file: data clusters are not refcounted.
  RunOk("cd " + testing::ShellQuote(dir_.path().string()) +
        " && qemu-img create -q -f qcow2 -o data_file=d.raw df.qcow2 1M && qemu-io -f qcow2 -c 'write 0 64k' df.qcow2");
  CheckReport r = MustCheck(testing::ReadFile(dir_ / "df.qcow2"));
  EXPECT_TRUE(r.clean()) << Messages(r);
}

TEST_F(Qcow2Check, PokedRefcountsMatchQemuVerdict) {
  const std::string img = dir_ / "p.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + img + " 1M && qemu-io -f qcow2 -c 'write -P 1 0 64k' " + img);
  const std::vector<std::byte> good = testing::ReadFile(img);
  ASSERT_EQ(QemuCheck(good), 0);
  ASSERT_TRUE(MustCheck(good).clean());
  // 64 KiB clusters, 16-bit refcounts; find the first refcount block.
  const uint64_t rt = LoadBe64(good.data() + 48);
  const uint64_t block = LoadBe64(good.data() + rt);
  const uint64_t l1 = LoadBe64(good.data() + 40);
  const uint64_t l2 = LoadBe64(good.data() + l1) & kL1OffsetMask;
  const uint64_t data = LoadBe64(good.data() + l2) & kL2OffsetMask;
  auto set_refcount = [&](std::vector<std::byte>& b, uint64_t cluster, uint16_t v) {
    StoreBe16(b.data() + block + 2 * cluster, v);
  };

  {  // Data cluster refcount 0: too low (corruption).
    auto b = good;
    set_refcount(b, data >> 16, 0);
    CheckReport r = MustCheck(b);
    EXPECT_GE(r.corruptions, 1u);
    EXPECT_EQ(r.exit_code(), QemuCheck(b)) << Messages(r);
  }
  {  // A free cluster appended with refcount 1: a leak only.
    auto b = good;
    const uint64_t clusters = (b.size() + 0xffff) >> 16;
    b.resize((clusters + 1) << 16);
    set_refcount(b, clusters, 1);
    CheckReport r = MustCheck(b);
    EXPECT_EQ(r.corruptions, 0u) << Messages(r);
    EXPECT_EQ(r.leaks, 1u);
    EXPECT_EQ(r.exit_code(), 3);
    EXPECT_EQ(QemuCheck(b), 3);
  }
  {  // L2 table refcount 2: a leak plus an OFLAG_COPIED corruption.
    auto b = good;
    set_refcount(b, l2 >> 16, 2);
    CheckReport r = MustCheck(b);
    EXPECT_EQ(r.leaks, 1u);
    EXPECT_EQ(r.corruptions, 1u) << Messages(r);
    EXPECT_EQ(r.exit_code(), QemuCheck(b));
  }
  {  // Two L2 entries aliasing one data cluster.
    auto b = good;
    StoreBe64(b.data() + l2 + 8, LoadBe64(b.data() + l2));
    CheckReport r = MustCheck(b);
    EXPECT_GE(r.corruptions, 1u);
    EXPECT_EQ(r.exit_code(), QemuCheck(b)) << Messages(r);
  }
  {  // A data cluster beyond the end of the file.
    auto b = good;
    StoreBe64(b.data() + l2 + 8, kOflagCopied | (uint64_t{64} << 20));
    CheckReport r = MustCheck(b);
    EXPECT_GE(r.corruptions, 1u);
    EXPECT_EQ(r.exit_code(), QemuCheck(b)) << Messages(r);
  }
}

// Issue 18: an L1, L2 or refcount table entry with reserved bits set is a
// corruption for qemu-img check (exit 2); barge check called it clean (the
// bits were masked off and the offsets followed).
TEST_F(Qcow2Check, ReservedBitsInEntriesAreCorruption) {
  const std::string img = dir_ / "r.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + img + " 1M && qemu-io -f qcow2 -c 'write -P 1 0 64k' " + img);
  const std::vector<std::byte> good = testing::ReadFile(img);
  ASSERT_TRUE(MustCheck(good).clean());
  const uint64_t l1 = LoadBe64(good.data() + 40);
  const uint64_t l2 = LoadBe64(good.data() + l1) & kL1OffsetMask;
  const uint64_t rt = LoadBe64(good.data() + 48);
  ASSERT_NE(LoadBe64(good.data() + l2), 0u);  // the written cluster's entry
  struct Poke {
    const char* what;
    uint64_t at;
    uint64_t bits;
  };
  const Poke pokes[] = {
      {"L1 entry, bit 0", l1, 1},
      {"L1 entry, bit 56", l1, uint64_t{1} << 56},
      {"L1 entry, bit 62", l1, uint64_t{1} << 62},
      {"L2 entry, bit 1", l2, 2},
      {"L2 entry, bit 8", l2, 0x100},
      {"L2 entry, bit 56", l2, uint64_t{1} << 56},
      {"L2 entry, bit 61", l2, uint64_t{1} << 61},
      {"unallocated L2 entry, bit 4", l2 + 8, 0x10},
      {"refcount table entry, bit 0", rt, 1},
      {"refcount table entry, bit 8", rt, 0x100},
  };
  for (const Poke& p : pokes) {
    SCOPED_TRACE(p.what);
    auto b = good;
    StoreBe64(b.data() + p.at, LoadBe64(b.data() + p.at) | p.bits);
    CheckReport r = MustCheck(b);
    EXPECT_GE(r.corruptions, 1u) << Messages(r);
    EXPECT_NE(Messages(r).find("reserved bits"), std::string::npos) << Messages(r);
    EXPECT_EQ(r.exit_code(), 2);
    EXPECT_EQ(QemuCheck(b), 2);
  }
}

// Found while building the hostile-image table (docs/security.md): every
// L1 entry of a crafted image names the same L2 table. The checker read
// that table once per L1 entry (a 17 MB 1 PiB image with 64 KiB clusters,
// 2M L1 entries: 128 GiB of reads, more than a minute, as qemu-img check
// takes too). Each table is now read once and its references counted for
// every L1 entry that names it (that image: 4 s in the ASan build).
TEST_F(Qcow2Check, SharedL2TableIsReadOnce) {
  const std::string img = dir_ / "shared.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + img + " 4T && qemu-io -f qcow2 -c 'write 0 4k' " + img);
  std::vector<std::byte> b = testing::ReadFile(img);
  const uint64_t l1 = LoadBe64(b.data() + 40);
  const uint32_t l1_size = LoadBe32(b.data() + 36);
  ASSERT_EQ(l1_size, 8192u);  // 512 MiB of L2 reads the old way
  const uint64_t entry = LoadBe64(b.data() + l1);
  ASSERT_NE(entry & kL1OffsetMask, 0u);
  for (uint32_t i = 1; i < l1_size; ++i) StoreBe64(b.data() + l1 + 8 * uint64_t{i}, entry);
  MemorySource source(b, "shared.qcow2");
  CheckOptions options;
  options.max_scan_bytes = 16ull << 20;  // the table is read once, not 8192 times
  auto r = CheckQcow2(source, options);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  // The L2 table (refcount 1) is referenced 8192 times, its data cluster too.
  EXPECT_EQ(r->corruptions, 2u) << Messages(*r);
  EXPECT_EQ(r->allocated_clusters, 8192u);
  EXPECT_EQ(r->exit_code(), 2);
  // The automatic budget (four times the file) is enough as well.
  EXPECT_TRUE(CheckQcow2(source).ok());
}

// Snapshots share the active L2 tables (refcount 2): counted once per L1
// that names them, as before the tables were walked once each.
TEST_F(Qcow2Check, SnapshotsSharingTablesStayClean) {
  const std::string img = dir_ / "snaps.qcow2";
  RunOk("qemu-img create -q -f qcow2 -o cluster_size=4k " + img + " 1M && qemu-io -f qcow2 -c 'write -P 1 0 64k' " + img);
  for (int i = 0; i < 5; ++i) RunOk("qemu-img snapshot -c s" + std::to_string(i) + " " + img);
  RunOk("qemu-io -f qcow2 -c 'write -P 2 0 8k' " + img);
  const auto bytes = testing::ReadFile(img);
  ASSERT_EQ(QemuCheck(bytes), 0);
  CheckReport r = MustCheck(bytes);
  EXPECT_TRUE(r.clean()) << Messages(r);
  EXPECT_EQ(r.allocated_clusters, 16u);
}

// A version 3 snapshot table entry with less than 16 bytes of extra data
// is a corruption for qemu-img check; the checker takes each entry's extra
// data size from the parsed table.
TEST_F(Qcow2Check, SnapshotEntryWithShortExtraDataIsCorruption) {
  const std::string img = dir_ / "short.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + img + " 1M && qemu-io -f qcow2 -c 'write -P 1 0 64k' " + img +
        " && qemu-img snapshot -c s1 " + img + " && qemu-img snapshot -c s2 " + img);
  const auto good = testing::ReadFile(img);
  ASSERT_EQ(QemuCheck(good), 0);
  ASSERT_TRUE(MustCheck(good).clean());
  // The second entry's extra data cut from 24 bytes to 8: its id and name
  // move up behind it.
  MemorySource source(good, "short.qcow2");
  auto h = ReadHeader(source);
  ASSERT_TRUE(h.ok());
  auto table = ReadSnapshotTable(source, *h);
  ASSERT_TRUE(table.ok());
  ASSERT_EQ(table->extra_bytes, (std::vector<uint32_t>{24, 24}));
  const uint64_t second = h->snapshots_offset + ((kSnapshotFixedBytes + 24 + table->snapshots[0].id.size() +
                                                  table->snapshots[0].name.size() + 7) & ~uint64_t{7});
  const uint64_t names = table->snapshots[1].id.size() + table->snapshots[1].name.size();
  auto b = good;
  StoreBe32(b.data() + second + 36, 8);
  std::copy_n(good.begin() + static_cast<std::ptrdiff_t>(second + kSnapshotFixedBytes + 24), names,
              b.begin() + static_cast<std::ptrdiff_t>(second + kSnapshotFixedBytes + 8));
  MemorySource poked(b, "short.qcow2");
  auto short_table = ReadSnapshotTable(poked, *h);
  ASSERT_TRUE(short_table.ok()) << short_table.error().ToString();
  EXPECT_EQ(short_table->extra_bytes, (std::vector<uint32_t>{24, 8}));
  EXPECT_EQ(short_table->snapshots[1].name, "s2");
  CheckReport r = MustCheck(b);
  EXPECT_EQ(r.corruptions, 1u) << Messages(r);
  EXPECT_NE(Messages(r).find("snapshot table entry 1 is incomplete (8 bytes of extra data)"), std::string::npos)
      << Messages(r);
  EXPECT_EQ(r.exit_code(), QemuCheck(b));
}

TEST_F(Qcow2Check, GarbageHeaderIsAnError) {
  std::vector<std::byte> junk(4096, std::byte{0x5a});
  MemorySource source(junk, "junk.qcow2");
  auto r = CheckQcow2(source);
  ASSERT_FALSE(r.ok());
  // The error names the file (barge check printed header errors without it).
  EXPECT_EQ(r.error().path(), "junk.qcow2") << r.error().ToString();
}

}  // namespace
}  // namespace barge::formats::qcow2
