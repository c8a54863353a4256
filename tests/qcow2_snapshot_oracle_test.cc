// Judges offline internal snapshot edits (formats/qcow2_snapshot_edit.h)
// and snapshot views (OpenOptions::snapshot) with the real tools: after
// every create, rename, delete and rollback qemu-img check is clean,
// qemu-img snapshot -l agrees, qemu-img convert -l snapshot.name=NAME reads
// the data saved at that moment, and qemu-io writes afterwards copy on
// write; qemu-made snapshots read the same through barge; what qemu refuses
// barge refuses; and the file left by an edit that died after any write is
// clean for qemu-img check.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/fault.h"
#include "formats/image.h"
#include "formats/qcow2_snapshot_edit.h"
#include "formats/qcow2_snapshot_metrics.h"
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_refcount_shadow.h"
#include "pipeline/endpoints.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using barge::testing::ReadFile;
using barge::testing::Run;
using barge::testing::RunOk;
using barge::testing::ShellQuote;
using barge::testing::TempDir;

using Names = std::vector<std::string>;  // "id:name" in table order

// The image opened for an in-place edit through the Env.
struct Opened {
  explicit Opened(const std::string& path) {
    auto s = Env::Default().OpenSource(path);
    auto k = Env::Default().OpenSink(path, SinkMode::kExisting);
    EXPECT_TRUE(s.ok() && k.ok());
    if (s.ok()) source = std::move(*s);
    if (k.ok()) sink = std::move(*k);
  }
  std::unique_ptr<BlockSource> source;
  std::unique_ptr<BlockSink> sink;
};

Status Create(const std::string& path, const std::string& name) {
  Opened f(path);
  SnapshotCreateSpec spec;
  spec.name = name;
  auto r = CreateSnapshot(*f.source, *f.sink, spec);
  return r.ok() ? OkStatus() : Status(r.error());
}
Status Delete(const std::string& path, const std::string& which) {
  Opened f(path);
  auto r = DeleteSnapshot(*f.source, *f.sink, which);
  return r.ok() ? OkStatus() : Status(r.error());
}
Status Rename(const std::string& path, const std::string& which, const std::string& to) {
  Opened f(path);
  auto r = RenameSnapshot(*f.source, *f.sink, which, to);
  return r.ok() ? OkStatus() : Status(r.error());
}
Result<SnapshotRollbackResult> Rollback(const std::string& path, const std::string& which, bool discard) {
  Opened f(path);
  return RollbackSnapshot(*f.source, *f.sink, which, discard);
}

#define ASSERT_OK(expr)                                        \
  do {                                                         \
    auto s_ = (expr);                                          \
    ASSERT_TRUE(s_.ok()) << s_.error().ToString();             \
  } while (0)

void ExpectQemuClean(const std::string& image) {
  auto r = Run("qemu-img check -f qcow2 " + ShellQuote(image));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

Names QemuSnapshots(const std::string& image) {
  std::string out = RunOk("qemu-img info -f qcow2 --output=json " + ShellQuote(image));
  auto j = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  Names names;
  if (j.contains("snapshots")) {
    for (const auto& s : j["snapshots"]) names.push_back(s["id"].get<std::string>() + ":" + s["name"].get<std::string>());
  }
  return names;
}

// The guest bytes qemu reads: the active image, or a snapshot by name.
std::vector<std::byte> QemuRead(const TempDir& dir, const std::string& image, const std::string& snapshot = "") {
  const std::string out = dir / "read.raw";
  RunOk("qemu-img convert -f qcow2 -O raw " +
        (snapshot.empty() ? std::string() : "-l " + ShellQuote("snapshot.name=" + snapshot) + " ") +
        ShellQuote(image) + " " + ShellQuote(out));
  auto bytes = ReadFile(out);
  std::remove(out.c_str());
  return bytes;
}

// The guest bytes barge reads.
std::vector<std::byte> BargeRead(const std::string& image, const std::string& snapshot = "") {
  OpenOptions o;
  o.snapshot = snapshot;
  auto opener = [](const std::string& p) { return Env::Default().OpenSource(p); };
  auto img = OpenImage(image, opener, o);
  EXPECT_TRUE(img.ok()) << img.error().ToString();
  if (!img.ok()) return {};
  std::vector<std::byte> out((*img)->size_bytes());
  EXPECT_TRUE((*img)->ReadAt(0, out).ok());
  return out;
}

void QemuIo(const std::string& image, const std::string& command) {
  RunOk("qemu-io -f qcow2 -c " + ShellQuote(command) + " " + ShellQuote(image));
}

class SnapshotOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
  }
  std::string NewImage(const std::string& options = "", const std::string& size = "8M") {
    const std::string path = dir_ / ("img" + std::to_string(count_++) + ".qcow2");
    RunOk("qemu-img create -f qcow2 " + (options.empty() ? "" : "-o " + options + " ") + ShellQuote(path) + " " +
          size);
    return path;
  }
  TempDir dir_;
  int count_ = 0;
};

TEST_F(SnapshotOracle, LifecycleAgainstQemu) {
  const std::string img = NewImage();
  QemuIo(img, "write -P 0x11 0 1M");
  QemuIo(img, "write -P 0x12 3M 512k");
  const auto a = QemuRead(dir_, img);

  ASSERT_OK(Create(img, "s1"));
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), Names{"1:s1"});
  EXPECT_EQ(QemuRead(dir_, img, "s1"), a);
  EXPECT_EQ(BargeRead(img, "s1"), a);

  // Writes after a barge-made snapshot copy on write.
  QemuIo(img, "write -P 0x21 512k 1M");
  QemuIo(img, "write -P 0x22 6M 64k");
  ExpectQemuClean(img);
  const auto b = QemuRead(dir_, img);
  ASSERT_NE(a, b);
  EXPECT_EQ(QemuRead(dir_, img, "s1"), a);
  EXPECT_EQ(BargeRead(img), b);

  ASSERT_OK(Create(img, "s2"));
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), (Names{"1:s1", "2:s2"}));
  EXPECT_EQ(QemuRead(dir_, img, "s2"), b);
  QemuIo(img, "write -P 0x31 0 64k");

  ASSERT_OK(Rename(img, "s1", "first"));
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), (Names{"1:first", "2:s2"}));
  EXPECT_EQ(QemuRead(dir_, img, "first"), a);

  // Rollback keeps newer snapshots.
  auto back = Rollback(img, "first", false);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_TRUE(back->discarded.empty());
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), (Names{"1:first", "2:s2"}));
  EXPECT_EQ(QemuRead(dir_, img), a);
  EXPECT_EQ(QemuRead(dir_, img, "s2"), b);
  QemuIo(img, "write -P 0x41 2M 64k");
  ExpectQemuClean(img);
  EXPECT_EQ(QemuRead(dir_, img, "first"), a);
  EXPECT_NE(QemuRead(dir_, img), a);

  ASSERT_OK(Delete(img, "first"));
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), Names{"2:s2"});
  EXPECT_EQ(QemuRead(dir_, img, "s2"), b);

  // A qemu-made snapshot next to barge's, then a rollback that discards it.
  RunOk("qemu-img snapshot -c q3 " + ShellQuote(img));
  const auto d = QemuRead(dir_, img);
  EXPECT_EQ(BargeRead(img, "q3"), d);
  auto discard = Rollback(img, "s2", true);
  ASSERT_TRUE(discard.ok()) << discard.error().ToString();
  ASSERT_EQ(discard->discarded.size(), 1u);
  EXPECT_EQ(discard->discarded[0].name, "q3");
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), Names{"2:s2"});
  EXPECT_EQ(QemuRead(dir_, img), b);

  // qemu goes on from barge's edits.
  RunOk("qemu-img snapshot -c q4 " + ShellQuote(img));
  RunOk("qemu-img snapshot -a s2 " + ShellQuote(img));
  RunOk("qemu-img snapshot -d s2 " + ShellQuote(img));
  ExpectQemuClean(img);
  EXPECT_EQ(QemuSnapshots(img), Names{"3:q4"});
  EXPECT_EQ(QemuRead(dir_, img), b);
}

TEST_F(SnapshotOracle, QemuMadeSnapshotsReadTheSameThroughBarge) {
  const std::string img = NewImage("", "5M");
  QemuIo(img, "write -P 0x51 0 2M");
  RunOk("qemu-img snapshot -c a " + ShellQuote(img));
  QemuIo(img, "write -P 0x52 1M 2M");
  QemuIo(img, "write -z 4M 64k");
  RunOk("qemu-img snapshot -c b " + ShellQuote(img));
  QemuIo(img, "discard 0 1M");
  for (const std::string name : {"a", "b", "1", "2"}) {
    const std::string qemu_name = name == "1" ? "a" : name == "2" ? "b" : name;
    EXPECT_EQ(BargeRead(img, name), QemuRead(dir_, img, qemu_name)) << name;
  }
  EXPECT_EQ(BargeRead(img), QemuRead(dir_, img));
  ASSERT_OK(Delete(img, "a"));
  ExpectQemuClean(img);
  EXPECT_EQ(BargeRead(img, "b"), QemuRead(dir_, img, "b"));
}

// What convert/backup/compare/map open: a pipeline source at a snapshot.
TEST_F(SnapshotOracle, PipelineSourceAtASnapshot) {
  const std::string img = NewImage("", "4M");
  QemuIo(img, "write -P 0x81 0 1M");
  ASSERT_OK(Create(img, "s1"));
  QemuIo(img, "write -P 0x82 0 2M");
  pipeline::SourceSpec spec;
  spec.location = img;
  spec.snapshot = "s1";
  auto opened = pipeline::OpenSource(Env::Default(), spec);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::vector<std::byte> got(opened->image->size_bytes());
  ASSERT_OK(opened->image->ReadAt(0, got));
  EXPECT_EQ(got, QemuRead(dir_, img, "s1"));
  ASSERT_TRUE(opened->image->info().opened_snapshot.has_value());
  EXPECT_EQ(opened->image->info().opened_snapshot->id, "1");
  spec.snapshot = "nope";
  auto missing = pipeline::OpenSource(Env::Default(), spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  const std::string raw = dir_ / "plain.raw";
  RunOk("truncate -s 1M " + ShellQuote(raw));
  spec.location = raw;
  spec.snapshot = "s1";
  auto on_raw = pipeline::OpenSource(Env::Default(), spec);
  ASSERT_FALSE(on_raw.ok());
  EXPECT_EQ(on_raw.error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(SnapshotOracle, ImageVariants) {
  struct Variant {
    std::string options;
    bool compress = false;
  };
  for (const Variant& v : std::vector<Variant>{{"compat=0.10"},
                                               {"cluster_size=4096"},
                                               {"cluster_size=512,refcount_bits=8"},
                                               {"refcount_bits=64"},
                                               {"extended_l2=on,cluster_size=131072"},
                                               {"compression_type=zstd", true}}) {
    SCOPED_TRACE(v.options);
    std::string img = NewImage(v.options, "4M");
    QemuIo(img, "write -P 0x61 0 1M");
    QemuIo(img, "write -P 0x62 2M 100k");
    if (v.compress) {
      const std::string packed = dir_ / "packed.qcow2";
      RunOk("qemu-img convert -c -f qcow2 -O qcow2 -o " + v.options + " " + ShellQuote(img) + " " +
            ShellQuote(packed));
      RunOk("mv " + ShellQuote(packed) + " " + ShellQuote(img));
    }
    const auto a = QemuRead(dir_, img);
    ASSERT_OK(Create(img, "a"));
    ExpectQemuClean(img);
    QemuIo(img, "write -P 0x63 512k 1M");
    const auto b = QemuRead(dir_, img);
    ASSERT_OK(Create(img, "b"));
    ExpectQemuClean(img);
    EXPECT_EQ(QemuRead(dir_, img, "a"), a);
    EXPECT_EQ(BargeRead(img, "a"), a);
    ASSERT_TRUE(Rollback(img, "a", false).ok());
    ExpectQemuClean(img);
    EXPECT_EQ(QemuRead(dir_, img), a);
    QemuIo(img, "write -P 0x64 0 64k");
    ASSERT_OK(Delete(img, "a"));
    ExpectQemuClean(img);
    EXPECT_EQ(QemuRead(dir_, img, "b"), b);
    ASSERT_OK(Delete(img, "b"));
    ExpectQemuClean(img);
    EXPECT_EQ(QemuSnapshots(img), Names{});
  }
}

TEST_F(SnapshotOracle, RefusedWhereQemuRefuses) {
  // External data file.
  const std::string data = dir_ / "data.raw";
  const std::string ov = NewImage("data_file=" + data, "4M");
  EXPECT_NE(barge::testing::Run("qemu-img snapshot -c s " + ShellQuote(ov)).exit_code, 0);
  Status s = Create(ov, "s");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported);
  // 1-bit refcounts.
  const std::string r1 = NewImage("refcount_bits=1", "4M");
  QemuIo(r1, "write -P 1 0 64k");
  s = Create(r1, "s");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported);
  ExpectQemuClean(r1);
  // (qemu's failed attempt leaks a cluster; barge's writes nothing.)
  EXPECT_NE(barge::testing::Run("qemu-img snapshot -c s " + ShellQuote(r1)).exit_code, 0);
  // Rollback with a persistent bitmap, even a disabled one.
  const std::string bm = NewImage("", "4M");
  ASSERT_OK(Create(bm, "s"));
  RunOk("qemu-img bitmap --add --disable " + ShellQuote(bm) + " b0");
  EXPECT_NE(barge::testing::Run("qemu-img snapshot -a s " + ShellQuote(bm)).exit_code, 0);
  auto r = Rollback(bm, "s", false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotSupported);
  ExpectQemuClean(bm);
}

// Every prefix of an edit's writes (the process died after write N) is a
// clean image for qemu-img check with the old or the new snapshot list.
TEST_F(SnapshotOracle, DeathAfterAnyWriteIsCleanForQemu) {
  const std::string base = NewImage("", "4M");
  QemuIo(base, "write -P 0x71 0 1M");
  ASSERT_OK(Create(base, "a"));
  QemuIo(base, "write -P 0x72 512k 1M");
  ASSERT_OK(Create(base, "b"));
  QemuIo(base, "write -P 0x73 3M 64k");
  const Names before = QemuSnapshots(base);
  struct Op {
    std::string label;
    std::function<Status(BlockSource&, BlockSink&)> run;
  };
  const std::vector<Op> ops = {
      {"create", [](BlockSource& f, BlockSink& k) -> Status {
         SnapshotCreateSpec spec;
         spec.name = "c";
         auto r = CreateSnapshot(f, k, spec);
         return r.ok() ? OkStatus() : Status(r.error());
       }},
      {"delete", [](BlockSource& f, BlockSink& k) -> Status {
         auto r = DeleteSnapshot(f, k, "a");
         return r.ok() ? OkStatus() : Status(r.error());
       }},
      {"rollback", [](BlockSource& f, BlockSink& k) -> Status {
         auto r = RollbackSnapshot(f, k, "a", true);
         return r.ok() ? OkStatus() : Status(r.error());
       }},
  };
  for (const Op& op : ops) {
    for (uint64_t n = 1;; ++n) {
      SCOPED_TRACE(op.label + " write " + std::to_string(n));
      const std::string img = dir_ / "crash.qcow2";
      RunOk("cp " + ShellQuote(base) + " " + ShellQuote(img));
      Status st;
      {
        Opened f(img);
        FaultSink faulty(*f.sink);
        faulty.faults().AddRule(FaultRule::NthAndAfter(FaultOp::kWrite, n));
        st = op.run(*f.source, faulty);
      }
      ExpectQemuClean(img);
      const Names now = QemuSnapshots(img);
      if (st.ok()) {
        EXPECT_NE(now, before);
        break;
      }
      EXPECT_EQ(now, before);
      ASSERT_LT(n, 1000u);
    }
  }
}

SnapshotMetricsReport Metrics(const std::string& path) {
  auto source = Env::Default().OpenSource(path);
  EXPECT_TRUE(source.ok());
  auto r = ComputeSnapshotMetrics(**source);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  return r.ok() ? *r : SnapshotMetricsReport{};
}

// Clusters of the file with a refcount above 0, less the refcount table
// and blocks (barge moves them; qemu does not).
uint64_t InUseClusters(const std::string& path) {
  auto source = Env::Default().OpenSource(path);
  EXPECT_TRUE(source.ok());
  auto h = qcow2::ReadHeader(**source);
  EXPECT_TRUE(h.ok());
  qcow2::RefcountShadow rc(**source, *h);
  EXPECT_TRUE(rc.Load().ok());
  uint64_t n = 0;
  for (uint64_t c = 0; c < qcow2::SizeToClusters((*source)->size_bytes(), h->cluster_bits); ++c) {
    auto count = rc.Get(c);
    EXPECT_TRUE(count.ok());
    n += count.ok() && *count > 0;
  }
  std::vector<std::byte> table(h->refcount_table_bytes());
  EXPECT_TRUE((*source)->ReadAt(h->refcount_table_offset, table).ok());
  n -= h->refcount_table_clusters;
  for (size_t i = 0; i < table.size() / 8; ++i) n -= qcow2::LoadBe64(table.data() + 8 * i) != 0;
  return n;
}

uint64_t AllocatedBytes(const std::string& path) {
  auto st = Env::Default().Stat(path);
  EXPECT_TRUE(st.ok());
  return st.ok() ? st->allocated_bytes : 0;
}

// Metrics of a known history, and `used` against what a delete frees, by
// qemu-img snapshot -d and by barge (both checked clean by qemu-img check,
// so the refcounts counted are the references); barge's delete also gives
// the space back to the file system, as qemu's does.
TEST_F(SnapshotOracle, MetricsOfAKnownHistory) {
  constexpr uint64_t kMiB = 1 << 20, kCs = 65536;
  const std::string img = NewImage("", "16M");
  QemuIo(img, "write -P 0x11 0 4M");
  ASSERT_OK(Create(img, "s1"));
  QemuIo(img, "write -P 0x22 3M 2M");
  ASSERT_OK(Create(img, "s2"));
  QemuIo(img, "write -P 0x33 8M 1M");
  const SnapshotMetricsReport r = Metrics(img);
  ASSERT_EQ(r.snapshots.size(), 2u);
  const SnapshotUsage& s1 = r.snapshots[0].usage;
  const SnapshotUsage& s2 = r.snapshots[1].usage;
  EXPECT_EQ(s1.vol_size, 16 * kMiB);
  EXPECT_EQ(s1.logical_referenced, 4 * kMiB);
  EXPECT_EQ(s2.logical_referenced, 5 * kMiB);
  EXPECT_EQ(r.active.logical_referenced, 6 * kMiB);
  EXPECT_EQ(s1.written, 4 * kMiB);
  EXPECT_EQ(s2.written, 2 * kMiB);
  EXPECT_EQ(r.active.written, 1 * kMiB);
  EXPECT_EQ(s1.referenced, 4 * kMiB + 2 * kCs);
  // s1 alone holds the megabyte s2 overwrote, its L1 and L2 tables.
  EXPECT_EQ(s1.used, 1 * kMiB + 2 * kCs);
  EXPECT_EQ(s2.used, 2 * kCs);
  EXPECT_EQ(r.snapshots[0].info.date_sec > 0, true);
  for (const auto& s : r.snapshots) {
    for (bool by_qemu : {true, false}) {
      SCOPED_TRACE(s.info.name + (by_qemu ? " deleted by qemu" : " deleted by barge"));
      const std::string copy = dir_ / "copy.qcow2";
      RunOk("cp --sparse=always " + ShellQuote(img) + " " + ShellQuote(copy));
      const uint64_t before = InUseClusters(copy);
      const uint64_t allocated = AllocatedBytes(copy);
      if (by_qemu) {
        RunOk("qemu-img snapshot -d " + ShellQuote(s.info.name) + " " + ShellQuote(copy));
      } else {
        ASSERT_OK(Delete(copy, s.info.name));
        // Less what the new metadata copies took (they may land in holes).
        if (s.usage.used >= kMiB) {
          EXPECT_GE(allocated - AllocatedBytes(copy), s.usage.used / 2);
        }
      }
      ExpectQemuClean(copy);
      EXPECT_EQ((before - InUseClusters(copy)) * kCs, s.usage.used);
    }
  }
}

}  // namespace
}  // namespace barge::formats
