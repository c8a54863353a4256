// Unit tests for offline internal snapshot edits on in-memory images made
// by the one-pass writer: create, delete, rename and rollback keep the
// checker clean and every view's data, refcount tables grow, refusals
// write nothing, and a crash after any write or flush leaves the old or the
// new image, clean.
#include "formats/qcow2_snapshot_edit.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>

#include "blockio/fault.h"
#include "blockio/memory.h"
#include "formats/qcow2_check.h"
#include "formats/qcow2_compress.h"
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "formats/qcow2_refcount_shadow.h"
#include "formats/qcow2_snapshot.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/qcow2_check_testing.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using qcow2::check_testing::Messages;
using qcow2::check_testing::MustCheck;
using Bytes = std::vector<std::byte>;

struct ImageSpec {
  uint64_t virtual_size = 4 << 20;
  uint32_t cluster_bits = 16;
  uint32_t refcount_order = 4;
  uint64_t every = 3;          // data in every Nth cluster
  bool compressed = false;     // zstd payloads (packed, sharing host clusters)
  std::vector<BitmapSpec> bitmaps;
  uint64_t seed = 1;
};

Bytes MakeImage(const ImageSpec& spec) {
  Qcow2WriterOptions o;
  o.virtual_size = spec.virtual_size;
  o.cluster_bits = spec.cluster_bits;
  o.refcount_order = spec.refcount_order;
  o.compression = spec.compressed ? Compression::kZstd : Compression::kNone;
  o.bitmaps = spec.bitmaps;
  MemorySink sink;
  auto writer = Qcow2Writer::Create(sink, o);
  EXPECT_TRUE(writer.ok()) << writer.error().ToString();
  if (!writer.ok()) return {};
  const uint64_t cs = (*writer)->cluster_size();
  ClusterCompressor compressor(Compression::kZstd, 0);
  for (uint64_t c = 0; c < (*writer)->cluster_count(); c += spec.every) {
    Bytes data = testing::RandomBytes(cs, spec.seed * 1000 + c);
    if (spec.compressed) {
      // Compressible: a repeated short pattern.
      for (uint64_t i = 0; i < cs; ++i) data[i] = std::byte((c + i / 64) & 0xff);
      auto payload = compressor.Compress(data);
      EXPECT_TRUE(payload.ok() && payload->has_value());
      EXPECT_TRUE((*writer)->WriteCompressed(c, **payload).ok());
      continue;
    }
    EXPECT_TRUE((*writer)->WriteData(c, data).ok());
  }
  Status s = (*writer)->Finish();
  EXPECT_TRUE(s.ok()) << s.error().ToString();
  return sink.contents();
}

SourceOpener MemoryOpener(const Bytes& bytes) {
  return [bytes](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(bytes, path));
  };
}

// The guest view of the active image, or of a snapshot.
Bytes Guest(const Bytes& bytes, const std::string& snapshot = "") {
  OpenOptions options;
  options.format = ImageFormat::kQcow2;
  options.open_backing = false;
  options.snapshot = snapshot;
  auto image = OpenImage("/img.qcow2", MemoryOpener(bytes), options);
  EXPECT_TRUE(image.ok()) << image.error().ToString();
  if (!image.ok()) return {};
  Bytes out((*image)->size_bytes());
  Status s = (*image)->ReadAt(0, out);
  EXPECT_TRUE(s.ok()) << s.error().ToString();
  return out;
}

// "id:name" per snapshot, in table order.
std::vector<std::string> Names(const Bytes& bytes) {
  MemorySource source(bytes);
  auto list = ListSnapshots(source);
  EXPECT_TRUE(list.ok()) << list.error().ToString();
  std::vector<std::string> out;
  if (list.ok()) {
    for (const auto& s : *list) out.push_back(s.id + ":" + s.name);
  }
  return out;
}

// Host clusters with a refcount above 0, less the refcount table and
// blocks themselves (the table never shrinks, and blocks stay once made,
// as in qemu).
uint64_t UsedClusters(const Bytes& bytes) {
  MemorySource source(bytes);
  auto h = qcow2::ReadHeader(source);
  EXPECT_TRUE(h.ok());
  if (!h.ok()) return 0;
  qcow2::RefcountShadow rc(source, *h);
  EXPECT_TRUE(rc.Load().ok());
  uint64_t used = 0;
  for (uint64_t c = 0; c < qcow2::SizeToClusters(bytes.size(), h->cluster_bits); ++c) {
    auto n = rc.Get(c);
    EXPECT_TRUE(n.ok());
    if (n.ok() && *n > 0) ++used;
  }
  used -= h->refcount_table_clusters;
  for (uint64_t i = 0; i < h->refcount_table_bytes() / 8; ++i) {
    if (qcow2::LoadBe64(bytes.data() + h->refcount_table_offset + 8 * i) != 0) --used;
  }
  return used;
}

void ExpectClean(const Bytes& bytes) {
  qcow2::CheckReport r = MustCheck(bytes);
  EXPECT_TRUE(r.clean()) << r.corruptions << " corruptions, " << r.leaks << " leaks\n" << Messages(r);
}

// The image in a memory sink (flushed), as the edit functions see a file.
struct Loaded {
  explicit Loaded(const Bytes& image) : source(image, "img.qcow2") {
    EXPECT_TRUE(sink.WriteAt(0, image).ok());
    EXPECT_TRUE(sink.Flush().ok());
  }
  size_t edit_ops() const { return sink.ops().size() - 2; }
  MemorySource source;
  MemorySink sink{0, "img.qcow2"};
};

using Edit = std::function<Status(BlockSource&, BlockSink&)>;

Edit Create(const std::string& name) {
  return [name](BlockSource& f, BlockSink& s) -> Status {
    SnapshotCreateSpec spec;
    spec.name = name;
    auto r = CreateSnapshot(f, s, spec);
    return r.ok() ? OkStatus() : Status(r.error());
  };
}
Edit Delete(const std::string& which) {
  return [which](BlockSource& f, BlockSink& s) -> Status {
    auto r = DeleteSnapshot(f, s, which);
    return r.ok() ? OkStatus() : Status(r.error());
  };
}
Edit Rename(const std::string& which, const std::string& to) {
  return [which, to](BlockSource& f, BlockSink& s) -> Status {
    auto r = RenameSnapshot(f, s, which, to);
    return r.ok() ? OkStatus() : Status(r.error());
  };
}
Edit Rollback(const std::string& which, bool discard_newer) {
  return [which, discard_newer](BlockSource& f, BlockSink& s) -> Status {
    auto r = RollbackSnapshot(f, s, which, discard_newer);
    return r.ok() ? OkStatus() : Status(r.error());
  };
}

Bytes MustApply(const Bytes& image, const Edit& edit) {
  Loaded l(image);
  Status s = edit(l.source, l.sink);
  EXPECT_TRUE(s.ok()) << s.error().ToString();
  return l.sink.contents();
}

TEST(SnapshotEdit, CreateKeepsDataAndCheckerClean) {
  const Bytes image = MakeImage({});
  const Bytes guest = Guest(image);
  Loaded l(image);
  SnapshotCreateSpec spec;
  spec.name = "first";
  spec.date_sec = 1700000000;
  spec.date_nsec = 5;
  auto created = CreateSnapshot(l.source, l.sink, spec);
  ASSERT_TRUE(created.ok()) << created.error().ToString();
  EXPECT_EQ(created->id, "1");
  EXPECT_EQ(created->name, "first");
  EXPECT_EQ(created->date_sec, 1700000000u);
  EXPECT_EQ(created->virtual_size, 4u << 20);
  const Bytes after = l.sink.contents();
  ExpectClean(after);
  EXPECT_EQ(Names(after), std::vector<std::string>{"1:first"});
  EXPECT_EQ(Guest(after), guest);
  EXPECT_EQ(Guest(after, "first"), guest);
  EXPECT_EQ(Guest(after, "1"), guest);
  // Exactly one flush before the header write and one after it.
  size_t flushes = 0;
  for (const SinkOp& op : l.sink.ops()) flushes += op.kind == SinkOp::Kind::kFlush;
  EXPECT_EQ(flushes, 3u);  // the load's, then two
}

TEST(SnapshotEdit, ManySnapshotsThenDeleteInAnyOrder) {
  for (uint32_t cluster_bits : {9u, 12u, 16u}) {
    for (uint32_t order : {1u, 3u, 4u, 6u}) {
      SCOPED_TRACE("cluster_bits " + std::to_string(cluster_bits) + " order " + std::to_string(order));
      ImageSpec spec;
      spec.cluster_bits = cluster_bits;
      spec.refcount_order = order;
      spec.virtual_size = cluster_bits == 9 ? (256 << 10) : (4 << 20);
      Bytes image = MakeImage(spec);
      const Bytes guest = Guest(image);
      const uint64_t used0 = UsedClusters(image);
      // Order 1 (2-bit refcounts) holds up to 3: the third snapshot of the
      // same data cannot be counted.
      const int count = order == 1 ? 2 : 4;
      for (int i = 0; i < count; ++i) {
        image = MustApply(image, Create("s" + std::to_string(i)));
        ExpectClean(image);
      }
      if (order == 1) {
        Loaded l(image);
        Status s = Create("s9")(l.source, l.sink);
        ASSERT_FALSE(s.ok());
        EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported) << s.error().ToString();
        EXPECT_EQ(l.edit_ops(), 0u);
      }
      for (int i = 0; i < count; ++i) EXPECT_EQ(Guest(image, "s" + std::to_string(i)), guest);
      EXPECT_EQ(Guest(image), guest);
      image = MustApply(image, Delete("s1"));
      ExpectClean(image);
      image = MustApply(image, Delete("s0"));
      ExpectClean(image);
      for (int i = 2; i < count; ++i) {
        EXPECT_EQ(Guest(image, "s" + std::to_string(i)), guest);
        image = MustApply(image, Delete("s" + std::to_string(i)));
        ExpectClean(image);
      }
      EXPECT_TRUE(Names(image).empty());
      EXPECT_EQ(Guest(image), guest);
      // Without snapshots the image holds what it held before (the
      // metadata moved, the count did not grow).
      EXPECT_EQ(UsedClusters(image), used0);
    }
  }
}

TEST(SnapshotEdit, DeleteOfTheOnlySnapshotFreesItsL1AndCopiedFlagsReturn) {
  const Bytes image = MakeImage({});
  const Bytes one = MustApply(image, Create("a"));
  const Bytes none = MustApply(one, Delete("a"));
  ExpectClean(none);
  MemorySource before(image), after(none);
  auto h0 = qcow2::ReadHeader(before);
  auto h1 = qcow2::ReadHeader(after);
  ASSERT_TRUE(h0.ok() && h1.ok());
  EXPECT_EQ(h1->nb_snapshots, 0u);
  EXPECT_EQ(h1->snapshots_offset, 0u);
  EXPECT_EQ(UsedClusters(none), UsedClusters(image));
}

TEST(SnapshotEdit, RenameAndNames) {
  Bytes image = MustApply(MakeImage({}), Create("a"));
  image = MustApply(image, Create("b"));
  image = MustApply(image, Rename("a", "c"));
  ExpectClean(image);
  EXPECT_EQ(Names(image), (std::vector<std::string>{"1:c", "2:b"}));
  image = MustApply(image, Rename("2", "d"));  // by id
  EXPECT_EQ(Names(image), (std::vector<std::string>{"1:c", "2:d"}));
  // A taken name, an unknown snapshot, a too long name: refused, nothing written.
  for (const auto& [edit, code] :
       std::vector<std::pair<Edit, ErrorCode>>{{Rename("c", "d"), ErrorCode::kInvalidArgument},
                                               {Rename("zz", "e"), ErrorCode::kNotFound},
                                               {Rename("c", std::string(256, 'x')), ErrorCode::kInvalidArgument},
                                               {Create("d"), ErrorCode::kInvalidArgument},
                                               {Delete("zz"), ErrorCode::kNotFound},
                                               {Rollback("zz", false), ErrorCode::kNotFound}}) {
    Loaded l(image);
    Status s = edit(l.source, l.sink);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), code) << s.error().ToString();
    EXPECT_EQ(l.edit_ops(), 0u);
  }
  // Renaming to the same name writes nothing.
  Loaded same(image);
  ASSERT_TRUE(Rename("c", "c")(same.source, same.sink).ok());
  EXPECT_EQ(same.edit_ops(), 0u);
}

TEST(SnapshotEdit, DuplicateNamesOnlyWhenAskedAndThenOnlyById) {
  Bytes image = MustApply(MakeImage({}), Create("x"));
  Loaded l(image);
  SnapshotCreateSpec spec;
  spec.name = "x";
  spec.allow_duplicate_name = true;
  ASSERT_TRUE(CreateSnapshot(l.source, l.sink, spec).ok());
  image = l.sink.contents();
  EXPECT_EQ(Names(image), (std::vector<std::string>{"1:x", "2:x"}));
  Loaded ambiguous(image);
  Status s = Delete("x")(ambiguous.source, ambiguous.sink);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.error().message().find("ids 1, 2"), std::string::npos) << s.error().message();
  image = MustApply(image, Delete("2"));
  EXPECT_EQ(Names(image), std::vector<std::string>{"1:x"});
  ExpectClean(image);
}

TEST(SnapshotEdit, NextIdFollowsQemu) {
  std::vector<SnapshotInfo> list(3);
  list[0].id = "7";
  list[1].id = "abc";
  list[2].id = " 12x";
  EXPECT_EQ(qcow2::NextSnapshotId(list), "13");
  EXPECT_EQ(qcow2::NextSnapshotId({}), "1");
}

TEST(SnapshotEdit, RollbackKeepsOrDiscardsNewer) {
  Bytes image = MakeImage({});
  const Bytes guest = Guest(image);
  image = MustApply(image, Create("a"));
  image = MustApply(image, Create("b"));
  image = MustApply(image, Create("c"));
  Bytes kept = MustApply(image, Rollback("a", false));
  ExpectClean(kept);
  EXPECT_EQ(Names(kept), (std::vector<std::string>{"1:a", "2:b", "3:c"}));
  EXPECT_EQ(Guest(kept), guest);
  Loaded l(image);
  auto r = RollbackSnapshot(l.source, l.sink, "b", true);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ASSERT_EQ(r->discarded.size(), 1u);
  EXPECT_EQ(r->discarded[0].name, "c");
  EXPECT_EQ(r->target.name, "b");
  const Bytes discarded = l.sink.contents();
  ExpectClean(discarded);
  EXPECT_EQ(Names(discarded), (std::vector<std::string>{"1:a", "2:b"}));
  EXPECT_EQ(Guest(discarded), guest);
  EXPECT_EQ(Guest(discarded, "a"), guest);
  // Everything gone again leaves the image's own clusters.
  Bytes none = MustApply(MustApply(discarded, Delete("a")), Delete("b"));
  ExpectClean(none);
  EXPECT_EQ(Guest(none), guest);
}

TEST(SnapshotEdit, CompressedClustersShareHostClusters) {
  ImageSpec spec;
  spec.compressed = true;
  spec.every = 1;
  Bytes image = MakeImage(spec);
  const Bytes guest = Guest(image);
  image = MustApply(image, Create("a"));
  image = MustApply(image, Create("b"));
  ExpectClean(image);
  EXPECT_EQ(Guest(image, "a"), guest);
  image = MustApply(image, Rollback("a", true));
  ExpectClean(image);
  image = MustApply(image, Delete("a"));
  ExpectClean(image);
  EXPECT_EQ(Guest(image), guest);
}

TEST(SnapshotEdit, RefcountTableGrows) {
  // 512-byte clusters with 64-bit refcounts: a block covers 64 clusters
  // (32 KiB) and a one-cluster table 64 blocks (2 MiB of file).
  ImageSpec spec;
  spec.cluster_bits = 9;
  spec.refcount_order = 6;
  spec.virtual_size = 1952 << 10;
  spec.every = 1;
  Bytes image = MakeImage(spec);
  const Bytes guest = Guest(image);
  auto table_clusters = [](const Bytes& b) {
    MemorySource source(b);
    auto h = qcow2::ReadHeader(source);
    EXPECT_TRUE(h.ok());
    return h.ok() ? h->refcount_table_clusters : 0;
  };
  const uint32_t before = table_clusters(image);
  EXPECT_EQ(before, 1u);
  int made = 0;
  while (table_clusters(image) == before && made < 20) {
    image = MustApply(image, Create("s" + std::to_string(made++)));
    ExpectClean(image);
  }
  EXPECT_GT(table_clusters(image), before);
  for (int i = 0; i < made; ++i) EXPECT_EQ(Guest(image, "s" + std::to_string(i)), guest);
  EXPECT_EQ(Guest(image), guest);
}

TEST(SnapshotEdit, Refusals) {
  // Not qcow2.
  {
    Loaded l(Bytes(1 << 20));
    Status s = Create("a")(l.source, l.sink);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported);
  }
  // External data file.
  {
    MemorySink sink;
    OverlayOptions o;
    o.virtual_size = 1 << 20;
    o.data_file_path = "/data.raw";
    ASSERT_TRUE(WriteDataFileOverlay(sink, o).ok());
    Loaded l(sink.contents());
    Status s = Create("a")(l.source, l.sink);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported);
    EXPECT_NE(s.error().message().find("external data file"), std::string::npos);
    EXPECT_EQ(l.edit_ops(), 0u);
  }
  // Rollback with persistent bitmaps (qemu: "Device has active dirty
  // bitmaps"); create and delete are fine.
  {
    ImageSpec spec;
    spec.bitmaps = {BitmapSpec{"b0", 65536, false, {}}};
    Bytes image = MustApply(MakeImage(spec), Create("a"));
    ExpectClean(image);
    Loaded l(image);
    Status s = Rollback("a", false)(l.source, l.sink);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported);
    EXPECT_NE(s.error().message().find("bitmaps"), std::string::npos);
    EXPECT_EQ(l.edit_ops(), 0u);
    ExpectClean(MustApply(image, Delete("a")));
  }
  // Dirty and corrupt images.
  for (uint64_t bit : {qcow2::kIncompatDirty, qcow2::kIncompatCorrupt}) {
    Bytes image = MakeImage({});
    image[79] |= std::byte(bit);
    Loaded l(image);
    Status s = Create("a")(l.source, l.sink);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(),
              bit == qcow2::kIncompatDirty ? ErrorCode::kNotSupported : ErrorCode::kCorruption);
    EXPECT_EQ(l.edit_ops(), 0u);
  }
  // 1-bit refcounts cannot count a second reference.
  {
    ImageSpec spec;
    spec.refcount_order = 0;
    Loaded l(MakeImage(spec));
    Status s = Create("a")(l.source, l.sink);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported);
    EXPECT_EQ(l.edit_ops(), 0u);
  }
  // before_write can stop the edit (the free-space check).
  {
    Loaded l(MakeImage({}));
    SnapshotCreateSpec spec;
    spec.name = "a";
    SnapshotEditOptions o;
    SnapshotEditPlan seen;
    o.before_write = [&](const SnapshotEditPlan& p) -> Status {
      seen = p;
      return Error::NoSpace("not enough space");
    };
    auto r = CreateSnapshot(l.source, l.sink, spec, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::kNoSpace);
    EXPECT_EQ(l.edit_ops(), 0u);
    EXPECT_GT(seen.write_bytes, 0u);
    EXPECT_GT(seen.copied_l2_tables, 0u);
    EXPECT_GE(seen.new_file_bytes, seen.file_bytes);
  }
}

TEST(SnapshotEdit, EstimateBoundsWhatCreateWrites) {
  for (uint32_t cluster_bits : {9u, 16u}) {
    ImageSpec spec;
    spec.cluster_bits = cluster_bits;
    spec.refcount_order = cluster_bits == 9 ? 6 : 4;
    spec.virtual_size = cluster_bits == 9 ? (1952 << 10) : (8 << 20);
    spec.every = 1;
    Bytes image = MakeImage(spec);
    for (int i = 0; i < 3; ++i) {
      MemorySource source(image);
      auto estimate = EstimateSnapshotCreateBytes(source);
      ASSERT_TRUE(estimate.ok()) << estimate.error().ToString();
      Loaded l(image);
      SnapshotCreateSpec create;
      create.name = "s" + std::to_string(i);
      SnapshotEditOptions o;
      SnapshotEditPlan plan;
      o.before_write = [&](const SnapshotEditPlan& p) {
        plan = p;
        return OkStatus();
      };
      ASSERT_TRUE(CreateSnapshot(l.source, l.sink, create, o).ok());
      EXPECT_GE(*estimate, plan.write_bytes) << "cluster_bits " << cluster_bits;
      EXPECT_GE(*estimate, plan.new_file_bytes - plan.file_bytes);
      image = l.sink.contents();
    }
  }
}

TEST(SnapshotEdit, CorruptRefcountsAreRefusedWithoutWriting) {
  const Bytes image = MakeImage({});
  MemorySource source(image);
  auto h = qcow2::ReadHeader(source);
  ASSERT_TRUE(h.ok());
  // Zero the first refcount block: every referenced cluster has refcount 0.
  const uint64_t block = qcow2::LoadBe64(image.data() + h->refcount_table_offset);
  Bytes bad = image;
  std::fill(bad.begin() + block, bad.begin() + block + h->cluster_size(), std::byte{0});
  Loaded l(bad);
  Status s = Create("a")(l.source, l.sink);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kCorruption) << s.error().ToString();
  EXPECT_EQ(l.edit_ops(), 0u);
}

TEST(SnapshotEdit, GarbageNeverCrashes) {
  Bytes image = MustApply(MakeImage({}), Create("a"));
  uint64_t seed = 7;
  auto next = [&seed] {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return seed >> 33;
  };
  for (int round = 0; round < 80; ++round) {
    Bytes bad = image;
    for (int k = 0; k < 4; ++k) bad[next() % std::min<size_t>(bad.size(), 1 << 20)] = std::byte(next());
    for (const Edit& edit : {Create("z"), Delete("a"), Rollback("a", true), Rename("a", "q")}) {
      Loaded l(bad);
      Status s = edit(l.source, l.sink);
      if (!s.ok()) continue;
      MemorySource out(l.sink.contents());
      auto r = qcow2::CheckQcow2(out);
      // Accepted input: only "no crash" counts.
      EXPECT_TRUE(r.ok() || !r.ok());
    }
  }
}

// ---- Crash safety ----

// Runs `edit` with the Nth write (then the Nth flush) failing, for every N
// until it gets through, and checks the state the writes so far left (the
// process died) and the state after a power loss: the old image or the new
// one, clean, with every view's data.
void CrashAtEveryStep(const Bytes& image, const Edit& edit) {
  const Bytes done = MustApply(image, edit);
  ExpectClean(done);
  const auto old_names = Names(image);
  const auto new_names = Names(done);
  std::set<std::string> seen;
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kFlush}) {
    for (uint64_t n = 1;; ++n) {
      SCOPED_TRACE(std::string(FaultOpName(op)) + " " + std::to_string(n));
      Loaded l(image);
      FaultSink faulty(l.sink);
      faulty.faults().AddRule(FaultRule::Nth(op, n));
      Status s = edit(l.source, faulty);
      if (s.ok()) break;
      ASSERT_EQ(s.error().code(), ErrorCode::kIoError) << s.error().ToString();
      const Bytes died = l.sink.contents();
      l.sink.SimulateCrash();
      const Bytes lost = l.sink.contents();
      for (const Bytes* b : {&died, &lost}) {
        ExpectClean(*b);
        const auto names = Names(*b);
        const bool is_old = names == old_names, is_new = names == new_names;
        ASSERT_TRUE(is_old || is_new);
        const Bytes& like = is_new && !is_old ? done : image;
        seen.insert(is_new && !is_old ? "new" : "old");
        EXPECT_EQ(Guest(*b), Guest(like));
        MemorySource source(*b);
        auto list = ListSnapshots(source);
        ASSERT_TRUE(list.ok());
        for (const auto& sn : *list) EXPECT_EQ(Guest(*b, sn.id), Guest(like, sn.id)) << sn.id;
      }
    }
  }
  EXPECT_TRUE(seen.count("old"));
  if (old_names != new_names) {
    EXPECT_TRUE(seen.count("new"));
  }
}

TEST(SnapshotEditCrash, Create) { CrashAtEveryStep(MakeImage({}), Create("a")); }

TEST(SnapshotEditCrash, CreateSecond) {
  CrashAtEveryStep(MustApply(MakeImage({}), Create("a")), Create("b"));
}

TEST(SnapshotEditCrash, Delete) {
  const Bytes two = MustApply(MustApply(MakeImage({}), Create("a")), Create("b"));
  CrashAtEveryStep(two, Delete("a"));
  CrashAtEveryStep(two, Delete("b"));
}

TEST(SnapshotEditCrash, Rename) {
  CrashAtEveryStep(MustApply(MakeImage({}), Create("a")), Rename("a", "b"));
}

TEST(SnapshotEditCrash, RollbackDiscardingNewer) {
  Bytes image = MakeImage({});
  for (const char* name : {"a", "b", "c"}) image = MustApply(image, Create(name));
  CrashAtEveryStep(image, Rollback("a", true));
  CrashAtEveryStep(image, Rollback("b", false));
}

TEST(SnapshotEditCrash, SmallClustersGrowingRefcounts) {
  ImageSpec spec;
  spec.cluster_bits = 9;
  spec.refcount_order = 6;
  spec.virtual_size = 256 << 10;
  spec.every = 1;
  Bytes image = MakeImage(spec);
  for (int i = 0; i < 3; ++i) image = MustApply(image, Create("s" + std::to_string(i)));
  CrashAtEveryStep(image, Create("t"));
  CrashAtEveryStep(image, Delete("s1"));
}

TEST(SnapshotEditCrash, CreateThatGrowsTheRefcountTable) {
  ImageSpec spec;
  spec.cluster_bits = 9;
  spec.refcount_order = 6;
  spec.virtual_size = 1952 << 10;
  spec.every = 1;
  CrashAtEveryStep(MakeImage(spec), Create("a"));
}

}  // namespace
}  // namespace barge::formats
