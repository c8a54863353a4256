// Unit tests for in-place bitmap edits on in-memory images made by the
// one-pass writer: rotation, removal, addition, errors, corrupt and garbage
// input, new refcount blocks, and a crash after every single write.
#include "formats/qcow2_bitmap_edit.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <string>

#include "blockio/fault.h"
#include "blockio/memory.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_check.h"
#include "formats/qcow2_format.h"
#include "formats/qcow2_header.h"
#include "tests/testing/qcow2_check_testing.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

using qcow2::check_testing::Messages;
using qcow2::check_testing::MustCheck;

using namespace qcow2;
using Bytes = std::vector<std::byte>;

// An image of `size` bytes with data in every third cluster.
Bytes MakeImage(Qcow2WriterOptions o, uint64_t data_clusters = UINT64_MAX, uint64_t every = 3) {
  if (o.virtual_size == 0) o.virtual_size = 4 << 20;
  o.compression = Compression::kNone;
  MemorySink sink;
  auto writer = Qcow2Writer::Create(sink, o);
  EXPECT_TRUE(writer.ok()) << writer.error().ToString();
  if (!writer.ok()) return {};
  const uint64_t cs = (*writer)->cluster_size();
  const uint64_t clusters = std::min((*writer)->cluster_count(), data_clusters);
  for (uint64_t c = 0; c < clusters; c += every) {
    EXPECT_TRUE((*writer)->WriteData(c, testing::RandomBytes(cs, c + 1)).ok());
  }
  Status s = (*writer)->Finish();
  EXPECT_TRUE(s.ok()) << s.error().ToString();
  return sink.contents();
}

Qcow2WriterOptions TwoBitmaps(uint32_t cluster_bits = 16, uint32_t refcount_order = 4) {
  Qcow2WriterOptions o;
  o.cluster_bits = cluster_bits;
  o.refcount_order = refcount_order;
  o.bitmaps = {BitmapSpec{"a", 65536, true, {{0, 1 << 20}, {3 << 20, 4096}}},
               BitmapSpec{"b", 4096, false, {{1 << 20, 200000}}}};
  return o;
}

SourceOpener MemoryOpener(const Bytes& bytes) {
  return [bytes](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(bytes, path));
  };
}

std::unique_ptr<Image> Open(const Bytes& bytes) {
  OpenOptions options;
  options.format = ImageFormat::kQcow2;
  options.open_backing = false;
  auto image = OpenImage("/img.qcow2", MemoryOpener(bytes), options);
  EXPECT_TRUE(image.ok()) << image.error().ToString();
  return image.ok() ? std::move(*image) : nullptr;
}

Bytes Guest(const Bytes& bytes) {
  auto image = Open(bytes);
  if (!image) return {};
  Bytes out(image->size_bytes());
  EXPECT_TRUE(image->ReadAt(0, out).ok());
  return out;
}

Header MustHeader(const Bytes& bytes) {
  MemorySource source(bytes);
  auto h = ReadHeader(source);
  EXPECT_TRUE(h.ok()) << h.error().ToString();
  return h.ok() ? *h : Header{};
}

// Name -> (granularity, flags) as the directory says.
using BitmapSet = std::map<std::string, std::pair<uint32_t, uint32_t>>;

BitmapSet Bitmaps(const Bytes& bytes) {
  MemorySource source(bytes);
  auto h = ReadHeader(source);
  EXPECT_TRUE(h.ok()) << h.error().ToString();
  if (!h.ok()) return {};
  auto entries = ReadBitmapDirectory(source, *h);
  EXPECT_TRUE(entries.ok()) << entries.error().ToString();
  BitmapSet out;
  if (entries.ok()) {
    for (const auto& e : *entries) out[e.info.name] = {e.info.granularity_bytes, e.info.flags};
  }
  return out;
}

RangeList Dirty(const Bytes& bytes, const std::string& name) {
  auto image = Open(bytes);
  if (!image) return {};
  auto ranges = ReadBitmapDirtyRanges(*image, name);
  EXPECT_TRUE(ranges.ok()) << ranges.error().ToString();
  return ranges.ok() ? *ranges : RangeList{};
}

void ExpectClean(const Bytes& bytes) {
  CheckReport r = MustCheck(bytes);
  EXPECT_TRUE(r.clean()) << r.corruptions << " corruptions, " << r.leaks << " leaks\n" << Messages(r);
}

// The image loaded into a memory sink (flushed), as EditBitmaps sees a file.
struct Loaded {
  explicit Loaded(const Bytes& image) : source(image, "img.qcow2") {
    EXPECT_TRUE(sink.WriteAt(0, image).ok());
    EXPECT_TRUE(sink.Flush().ok());
  }
  // Calls made by the edit (the load's write and flush excluded).
  std::vector<SinkOp> edit_ops() const {
    auto ops = sink.ops();
    return std::vector<SinkOp>(ops.begin() + 2, ops.end());
  }
  MemorySource source;
  MemorySink sink{0, "img.qcow2"};
};

struct Outcome {
  Status status;
  Bytes bytes;
  std::vector<SinkOp> ops;
};

Outcome Apply(const Bytes& image, const BitmapEdit& edit) {
  Loaded l(image);
  Outcome o;
  o.status = EditBitmaps(l.source, l.sink, edit);
  o.bytes = l.sink.contents();
  o.ops = l.edit_ops();
  return o;
}

BitmapEdit Rotation(const std::string& from, const std::string& to, uint32_t granularity = 65536) {
  BitmapEdit edit;
  edit.remove = {from};
  edit.add = {BitmapSpec{to, granularity, true, {}}};
  return edit;
}

TEST(Qcow2BitmapEdit, RotationKeepsOtherBitmapsAndGuestData) {
  const Bytes image = MakeImage(TwoBitmaps());
  Loaded l(image);
  Status s = RotateBitmap(l.source, l.sink, "a", "a2");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  const Bytes out = l.sink.contents();
  ExpectClean(out);
  EXPECT_EQ(Bitmaps(out), (BitmapSet{{"b", {4096, 0}}, {"a2", {65536, kBitmapAuto}}}));
  EXPECT_TRUE(Dirty(out, "a2").empty());
  EXPECT_EQ(Dirty(out, "b"), Dirty(image, "b"));
  EXPECT_EQ(Guest(out), Guest(image));
  const Header h = MustHeader(out);
  EXPECT_TRUE(h.autoclear_features & kAutoclearBitmaps);
  // The header switch is one write into cluster 0; nothing else touches it.
  int header_writes = 0;
  for (const SinkOp& op : l.edit_ops()) {
    if (op.kind == SinkOp::Kind::kWrite && op.offset < h.cluster_size()) ++header_writes;
  }
  EXPECT_EQ(header_writes, 1);
  EXPECT_EQ(l.edit_ops().back().kind, SinkOp::Kind::kFlush);
  // Kept entry and its table are byte for byte the old ones.
  MemorySource before(image), after(out);
  auto old_dir = ReadBitmapDirectory(before, MustHeader(image));
  auto new_dir = ReadBitmapDirectory(after, h);
  ASSERT_TRUE(old_dir.ok() && new_dir.ok());
  EXPECT_EQ((*old_dir)[1].info.table_offset, (*new_dir)[0].info.table_offset);
}

TEST(Qcow2BitmapEdit, RotationAcrossClusterSizesAndRefcountOrders) {
  // Every order at 512 B and 64 KiB clusters, two at 4 KiB (2 MiB clusters
  // have their own test: those images are tens of MiB).
  const std::map<uint32_t, std::vector<uint32_t>> orders = {
      {9, {0, 1, 2, 3, 4, 5, 6}}, {12, {1, 5}}, {16, {0, 1, 2, 3, 4, 5, 6}}};
  for (const auto& [cluster_bits, order_list] : orders) {
    for (uint32_t order : order_list) {
      SCOPED_TRACE("cluster_bits " + std::to_string(cluster_bits) + " order " + std::to_string(order));
      Qcow2WriterOptions options = TwoBitmaps(cluster_bits, order);
      options.virtual_size = 2 << 20;
      const Bytes image = MakeImage(options, 16);
      Outcome once = Apply(image, Rotation("b", "b2", 512));
      ASSERT_TRUE(once.status.ok()) << once.status.error().ToString();
      ExpectClean(once.bytes);
      EXPECT_EQ(Bitmaps(once.bytes), (BitmapSet{{"a", {65536, kBitmapAuto}}, {"b2", {512, kBitmapAuto}}}));
      EXPECT_TRUE(Dirty(once.bytes, "b2").empty());
      // Once more: freed clusters and fresh ones stay consistent.
      Outcome again = Apply(once.bytes, Rotation("b2", "b3", 512));
      ASSERT_TRUE(again.status.ok()) << again.status.error().ToString();
      ExpectClean(again.bytes);
      EXPECT_EQ(Dirty(again.bytes, "a"), Dirty(image, "a"));
      EXPECT_EQ(Guest(again.bytes), Guest(image));
    }
  }
}

TEST(Qcow2BitmapEdit, TwoMegabyteClusters) {
  Qcow2WriterOptions options = TwoBitmaps(21, 4);
  options.virtual_size = 2 << 20;
  const Bytes image = MakeImage(options, 1);
  Outcome out = Apply(image, Rotation("a", "a2"));
  ASSERT_TRUE(out.status.ok()) << out.status.error().ToString();
  ExpectClean(out.bytes);
  EXPECT_EQ(Bitmaps(out.bytes), (BitmapSet{{"b", {4096, 0}}, {"a2", {65536, kBitmapAuto}}}));
}

TEST(Qcow2BitmapEdit, RemoveOne) {
  const Bytes image = MakeImage(TwoBitmaps());
  BitmapEdit edit;
  edit.remove = {"a"};
  Outcome o = Apply(image, edit);
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  EXPECT_EQ(Bitmaps(o.bytes), (BitmapSet{{"b", {4096, 0}}}));
  EXPECT_EQ(Dirty(o.bytes, "b"), Dirty(image, "b"));
}

TEST(Qcow2BitmapEdit, RemoveAllDropsTheExtensionAndAutoclearBit) {
  const Bytes image = MakeImage(TwoBitmaps());
  BitmapEdit edit;
  edit.remove = {"b", "a"};
  Outcome o = Apply(image, edit);
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  const Header h = MustHeader(o.bytes);
  EXPECT_FALSE(h.has_bitmaps_extension);
  EXPECT_FALSE(h.autoclear_features & kAutoclearBitmaps);
  EXPECT_TRUE(Bitmaps(o.bytes).empty());
  EXPECT_EQ(Guest(o.bytes), Guest(image));
}

TEST(Qcow2BitmapEdit, AddToAnImageWithoutBitmaps) {
  const Bytes image = MakeImage({});
  BitmapEdit edit;
  edit.add = {BitmapSpec{"cbt0", 65536, true, {}}, BitmapSpec{"frozen", 1 << 20, false, {}}};
  Outcome o = Apply(image, edit);
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  EXPECT_EQ(Bitmaps(o.bytes), (BitmapSet{{"cbt0", {65536, kBitmapAuto}}, {"frozen", {1 << 20, 0}}}));
  EXPECT_TRUE(MustHeader(o.bytes).autoclear_features & kAutoclearBitmaps);
  EXPECT_TRUE(Dirty(o.bytes, "cbt0").empty());
  EXPECT_EQ(Guest(o.bytes), Guest(image));
  // Adding no further bitmaps is a no-op that writes nothing.
  Outcome none = Apply(o.bytes, BitmapEdit{});
  EXPECT_TRUE(none.status.ok());
  EXPECT_TRUE(none.ops.empty());
}

TEST(Qcow2BitmapEdit, AddMovesTheBackingFileNameWhenExtensionsGrow) {
  Qcow2WriterOptions o;
  o.backing_file = "base.qcow2";
  o.backing_format = "qcow2";
  const Bytes image = MakeImage(o);
  const Header before = MustHeader(image);
  BitmapEdit edit;
  edit.add = {BitmapSpec{"x", 65536, true, {}}};
  Outcome out = Apply(image, edit);
  ASSERT_TRUE(out.status.ok()) << out.status.error().ToString();
  ExpectClean(out.bytes);
  const Header after = MustHeader(out.bytes);
  EXPECT_EQ(after.backing_file, "base.qcow2");
  EXPECT_EQ(after.backing_format, "qcow2");
  EXPECT_GT(after.backing_file_offset, before.backing_file_offset);
  EXPECT_EQ(Bitmaps(out.bytes).size(), 1u);
  // And back: the extension goes, the name stays readable.
  BitmapEdit remove;
  remove.remove = {"x"};
  Outcome back = Apply(out.bytes, remove);
  ASSERT_TRUE(back.status.ok()) << back.status.error().ToString();
  ExpectClean(back.bytes);
  EXPECT_EQ(MustHeader(back.bytes).backing_file, "base.qcow2");
  EXPECT_FALSE(MustHeader(back.bytes).has_bitmaps_extension);
}

TEST(Qcow2BitmapEdit, SeveralAtOnceAndNameReuse) {
  Qcow2WriterOptions o = TwoBitmaps();
  o.bitmaps.push_back(BitmapSpec{"c", 1 << 16, true, {{2 << 20, 1 << 20}}});
  const Bytes image = MakeImage(o);
  BitmapEdit edit;
  edit.remove = {"a", "c"};
  edit.add = {BitmapSpec{"a", 512, false, {}}, BitmapSpec{"d", 1 << 16, true, {}},
              BitmapSpec{"e", 1u << 31, true, {}}};
  Outcome out = Apply(image, edit);
  ASSERT_TRUE(out.status.ok()) << out.status.error().ToString();
  ExpectClean(out.bytes);
  EXPECT_EQ(Bitmaps(out.bytes), (BitmapSet{{"a", {512, 0}},
                                           {"b", {4096, 0}},
                                           {"d", {65536, kBitmapAuto}},
                                           {"e", {1u << 31, kBitmapAuto}}}));
  EXPECT_TRUE(Dirty(out.bytes, "a").empty());
  EXPECT_EQ(Dirty(out.bytes, "b"), Dirty(image, "b"));
}

TEST(Qcow2BitmapEdit, UnknownAutoclearBitsAreClearedFirst) {
  Bytes image = MakeImage(TwoBitmaps());
  StoreBe64(image.data() + 88, LoadBe64(image.data() + 88) | (1ull << 7));
  Outcome o = Apply(image, Rotation("a", "n"));
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  EXPECT_EQ(MustHeader(o.bytes).autoclear_features, kAutoclearBitmaps);
  ASSERT_GE(o.ops.size(), 2u);
  EXPECT_EQ(o.ops[0], (SinkOp{SinkOp::Kind::kWrite, 88, 8}));
  EXPECT_EQ(o.ops[1].kind, SinkOp::Kind::kFlush);
}

TEST(Qcow2BitmapEdit, DataFileOverlayRotation) {
  MemorySink sink;
  OverlayOptions o;
  o.virtual_size = 16 << 20;
  o.data_file_path = "/var/lib/disk.raw";
  o.bitmaps = {BitmapSpec{"cbt0", 65536, true, {}}};
  ASSERT_TRUE(WriteDataFileOverlay(sink, o).ok());
  const Bytes image = sink.contents();
  Loaded l(image);
  Status s = RotateBitmap(l.source, l.sink, "cbt0", "cbt1");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  const Bytes out = l.sink.contents();
  ExpectClean(out);
  EXPECT_EQ(Bitmaps(out), (BitmapSet{{"cbt1", {65536, kBitmapAuto}}}));
  const Header h = MustHeader(out);
  EXPECT_EQ(h.data_file, "/var/lib/disk.raw");
  EXPECT_TRUE(h.data_file_raw());
}

TEST(Qcow2BitmapEdit, ClearEmptiesTheBitmapAndKeepsEverythingElse) {
  const Bytes image = MakeImage(TwoBitmaps());
  ASSERT_FALSE(Dirty(image, "a").empty());
  BitmapEdit edit;
  edit.clear = {"a"};
  Outcome o = Apply(image, edit);
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  EXPECT_EQ(Bitmaps(o.bytes), Bitmaps(image));  // names, granularities, flags
  EXPECT_TRUE(Dirty(o.bytes, "a").empty());
  EXPECT_EQ(Dirty(o.bytes, "b"), Dirty(image, "b"));
  EXPECT_EQ(Guest(o.bytes), Guest(image));
  // The directory keeps its order; only a's table moved.
  MemorySource before(image), after(o.bytes);
  auto old_dir = ReadBitmapDirectory(before, MustHeader(image));
  auto new_dir = ReadBitmapDirectory(after, MustHeader(o.bytes));
  ASSERT_TRUE(old_dir.ok() && new_dir.ok());
  ASSERT_EQ(new_dir->size(), 2u);
  EXPECT_EQ((*new_dir)[0].info.name, "a");
  EXPECT_NE((*new_dir)[0].info.table_offset, (*old_dir)[0].info.table_offset);
  EXPECT_EQ((*new_dir)[1].info.table_offset, (*old_dir)[1].info.table_offset);
  // a's old data clusters were freed: clearing a clean bitmap again leaks
  // nothing either.
  Outcome again = Apply(o.bytes, edit);
  ASSERT_TRUE(again.status.ok()) << again.status.error().ToString();
  ExpectClean(again.bytes);
}

TEST(Qcow2BitmapEdit, EnableAndDisableFlipTheAutoFlag) {
  const Bytes image = MakeImage(TwoBitmaps());  // a enabled, b disabled
  BitmapEdit edit;
  edit.enable = {"b"};
  edit.disable = {"a"};
  Outcome o = Apply(image, edit);
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  EXPECT_EQ(Bitmaps(o.bytes), (BitmapSet{{"a", {65536, 0}}, {"b", {4096, kBitmapAuto}}}));
  EXPECT_EQ(Dirty(o.bytes, "a"), Dirty(image, "a"));
  EXPECT_EQ(Dirty(o.bytes, "b"), Dirty(image, "b"));
  // Clear and enable together: the rotation of a frozen bitmap.
  BitmapEdit rotate;
  rotate.clear = {"a"};
  rotate.enable = {"a"};
  Outcome r = Apply(o.bytes, rotate);
  ASSERT_TRUE(r.status.ok()) << r.status.error().ToString();
  ExpectClean(r.bytes);
  EXPECT_EQ(Bitmaps(r.bytes), (BitmapSet{{"a", {65536, kBitmapAuto}}, {"b", {4096, kBitmapAuto}}}));
  EXPECT_TRUE(Dirty(r.bytes, "a").empty());
}

TEST(Qcow2BitmapEdit, EnablingAnEnabledBitmapWritesNothing) {
  const Bytes image = MakeImage(TwoBitmaps());
  BitmapEdit edit;
  edit.enable = {"a"};
  edit.disable = {"b"};
  Outcome o = Apply(image, edit);
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  EXPECT_TRUE(o.ops.empty());
  EXPECT_EQ(o.bytes, image);
}

// Every error is found before the first write.
void ExpectRefused(const Bytes& image, const BitmapEdit& edit, ErrorCode code) {
  Outcome o = Apply(image, edit);
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.error().code(), code) << o.status.error().ToString();
  EXPECT_TRUE(o.ops.empty()) << o.status.error().ToString();
}

TEST(Qcow2BitmapEdit, BadEditsAreRefusedWithoutWriting) {
  const Bytes image = MakeImage(TwoBitmaps());
  ExpectRefused(image, Rotation("nope", "x"), ErrorCode::kNotFound);
  ExpectRefused(image, Rotation("a", "b"), ErrorCode::kInvalidArgument);  // b exists, kept
  BitmapEdit twice;
  twice.remove = {"a", "a"};
  ExpectRefused(image, twice, ErrorCode::kInvalidArgument);
  BitmapEdit dup;
  dup.add = {BitmapSpec{"x", 65536, true, {}}, BitmapSpec{"x", 65536, true, {}}};
  ExpectRefused(image, dup, ErrorCode::kInvalidArgument);
  ExpectRefused(image, Rotation("a", ""), ErrorCode::kInvalidArgument);
  ExpectRefused(image, Rotation("a", std::string(1024, 'n')), ErrorCode::kInvalidArgument);
  ExpectRefused(image, Rotation("a", "g", 1000), ErrorCode::kInvalidArgument);
  ExpectRefused(image, Rotation("a", "g", 256), ErrorCode::kInvalidArgument);
  BitmapEdit dirty;
  dirty.add = {BitmapSpec{"x", 65536, true, {{0, 4096}}}};
  ExpectRefused(image, dirty, ErrorCode::kNotSupported);
  for (auto field : {&BitmapEdit::clear, &BitmapEdit::enable, &BitmapEdit::disable}) {
    BitmapEdit missing;
    (missing.*field) = {"nope"};
    ExpectRefused(image, missing, ErrorCode::kNotFound);
    BitmapEdit both;
    both.remove = {"a"};
    (both.*field) = {"a"};
    ExpectRefused(image, both, ErrorCode::kInvalidArgument);
    BitmapEdit twice;
    (twice.*field) = {"b", "b"};
    ExpectRefused(image, twice, ErrorCode::kInvalidArgument);
  }
  BitmapEdit on_and_off;
  on_and_off.enable = {"a"};
  on_and_off.disable = {"a"};
  ExpectRefused(image, on_and_off, ErrorCode::kInvalidArgument);
  Loaded l(image);
  Status s = RotateBitmap(l.source, l.sink, "missing", "x");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNotFound);
}

TEST(Qcow2BitmapEdit, InUseBitmapsMayOnlyBeRemoved) {
  Bytes image = MakeImage(TwoBitmaps());
  const Header h = MustHeader(image);
  // Entry "a" is first in the directory: flags at +12.
  StoreBe32(image.data() + h.bitmap_directory_offset + 12, kBitmapInUse | kBitmapAuto);
  ExpectRefused(image, Rotation("b", "b2"), ErrorCode::kInvalidArgument);
  BitmapEdit clear;  // as qemu-img bitmap --clear: "inconsistent and cannot be used"
  clear.clear = {"a"};
  ExpectRefused(image, clear, ErrorCode::kInvalidArgument);
  BitmapEdit disable;
  disable.disable = {"a"};
  ExpectRefused(image, disable, ErrorCode::kInvalidArgument);
  Outcome o = Apply(image, Rotation("a", "a2"));
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  ExpectClean(o.bytes);
  EXPECT_EQ(Bitmaps(o.bytes), (BitmapSet{{"b", {4096, 0}}, {"a2", {65536, kBitmapAuto}}}));
}

TEST(Qcow2BitmapEdit, NonQcow2AndUnsupportedImagesAreRefused) {
  ExpectRefused(testing::RandomBytes(1 << 20, 5), Rotation("a", "b"), ErrorCode::kNotSupported);
  ExpectRefused(Bytes(100), Rotation("a", "b"), ErrorCode::kNotSupported);
  ExpectRefused(Bytes(), Rotation("a", "b"), ErrorCode::kNotSupported);
  Bytes v2 = MakeImage(TwoBitmaps());
  StoreBe32(v2.data() + 4, 2);
  ExpectRefused(v2, Rotation("a", "b2"), ErrorCode::kNotSupported);
  Bytes dirty = MakeImage(TwoBitmaps());
  StoreBe64(dirty.data() + 72, kIncompatDirty);
  ExpectRefused(dirty, Rotation("a", "b2"), ErrorCode::kNotSupported);
  Bytes corrupt = MakeImage(TwoBitmaps());
  StoreBe64(corrupt.data() + 72, kIncompatCorrupt);
  ExpectRefused(corrupt, Rotation("a", "b2"), ErrorCode::kCorruption);
}

TEST(Qcow2BitmapEdit, CorruptMetadataIsRefusedWithoutWriting) {
  const Bytes image = MakeImage(TwoBitmaps());
  const Header h = MustHeader(image);
  const uint64_t dir = h.bitmap_directory_offset;
  auto poke = [&](uint64_t offset, uint64_t value, int bytes) {
    Bytes b = image;
    if (bytes == 8) StoreBe64(b.data() + offset, value);
    if (bytes == 4) StoreBe32(b.data() + offset, value);
    if (bytes == 1) b[offset] = std::byte(value);
    return b;
  };
  // Directory entry fields.
  ExpectRefused(poke(dir + 16, 2, 1), Rotation("a", "n"), ErrorCode::kCorruption);        // type
  ExpectRefused(poke(dir + 8, 7, 4), Rotation("a", "n"), ErrorCode::kCorruption);         // table size
  ExpectRefused(poke(dir, 0x1234, 8), Rotation("a", "n"), ErrorCode::kCorruption);        // table offset
  ExpectRefused(poke(dir + 12, 1u << 9, 4), Rotation("a", "n"), ErrorCode::kCorruption);  // flags
  // Header bitmaps extension and refcount table.
  Bytes far = image;
  for (uint64_t off = h.header_length; off + 8 < h.extensions_end;) {
    if (LoadBe32(image.data() + off) == kExtBitmaps) StoreBe64(far.data() + off + 24, 1ull << 40);
    off += 8 + ((LoadBe32(image.data() + off + 4) + 7) & ~7u);
  }
  ExpectRefused(far, Rotation("a", "n"), ErrorCode::kCorruption);
  ExpectRefused(poke(48, 1ull << 40, 8), Rotation("a", "n"), ErrorCode::kCorruption);
  ExpectRefused(poke(h.refcount_table_offset, 0x123, 8), Rotation("a", "n"), ErrorCode::kCorruption);
  ExpectRefused(poke(h.refcount_table_offset, 1ull << 40, 8), Rotation("a", "n"), ErrorCode::kCorruption);
  // A data cluster of the removed bitmap beyond the end, or with reserved bits.
  MemorySource source(image);
  auto entries = ReadBitmapDirectory(source, h);
  ASSERT_TRUE(entries.ok());
  const uint64_t table = (*entries)[0].info.table_offset;
  ExpectRefused(poke(table, 1ull << 40, 8), Rotation("a", "n"), ErrorCode::kCorruption);
  ExpectRefused(poke(table, LoadBe64(image.data() + table) | 2, 8), Rotation("a", "n"), ErrorCode::kCorruption);
  // A bitmap data cluster whose refcount is already 0: remove "a", then
  // point b's first table entry at a's old (now free) data cluster.
  const uint64_t a_data = LoadBe64(image.data() + table) & kBitmapTableOffsetMask;
  ASSERT_NE(a_data, 0u);
  BitmapEdit remove_a;
  remove_a.remove = {"a"};
  Outcome removed = Apply(image, remove_a);
  ASSERT_TRUE(removed.status.ok());
  Bytes stale = removed.bytes;
  StoreBe64(stale.data() + (*entries)[1].info.table_offset, a_data);
  ExpectRefused(stale, Rotation("b", "n"), ErrorCode::kCorruption);
}

TEST(Qcow2BitmapEdit, GarbageMetadataNeverCrashes) {
  const Bytes image = MakeImage(TwoBitmaps(12, 4), 64);
  const Header h = MustHeader(image);
  MemorySource source(image);
  auto entries = ReadBitmapDirectory(source, h);
  ASSERT_TRUE(entries.ok());
  // Words worth hitting: header, extensions, refcount table, directory, tables.
  std::vector<uint64_t> hot = {8, 20, 24, 36, 40, 48, 56, 72, 88, 96, 100};
  for (uint64_t off = h.header_length; off < h.extensions_end; off += 4) hot.push_back(off);
  for (uint64_t i = 0; i < 16; ++i) hot.push_back(h.refcount_table_offset + 8 * i);
  for (uint64_t off = 0; off < h.bitmap_directory_size; off += 4) hot.push_back(h.bitmap_directory_offset + off);
  for (const auto& e : *entries) {
    for (uint64_t i = 0; i < std::min<uint64_t>(e.info.table_size, 8); ++i) hot.push_back(e.info.table_offset + 8 * i);
  }
  int refused = 0;
  for (uint64_t seed = 0; seed < 1500; ++seed) {
    Bytes b = image;
    const Bytes noise = testing::RandomBytes(16, seed);
    const int pokes = 1 + seed % 3;
    for (int p = 0; p < pokes; ++p) {
      const uint64_t at = hot[LoadBe32(noise.data() + 4 * p) % hot.size()];
      const uint32_t kind = uint8_t(noise[12 + p]) % 4;
      const uint64_t garbage = kind == 0 ? 0 : kind == 1 ? ~0ull : kind == 2 ? (1ull << 40) : LoadBe64(noise.data());
      StoreBe32(b.data() + at, uint32_t(garbage >> (8 * p)));
    }
    Outcome o = Apply(b, Rotation("a", "n"));
    if (!o.status.ok()) {
      ++refused;
      continue;
    }
    // Accepted input: the checker may complain, but nothing may crash.
    MemorySource out(o.bytes);
    (void)CheckQcow2(out);
  }
  EXPECT_GT(refused, 300);
}

// ---- Crash safety ----

enum class CrashState { kOld, kOldMarkedInUse, kNew };

// Classifies the bitmaps of `bytes`: the old set (the removed ones maybe
// marked in_use) while the header still names the old directory, else the
// new set; fails the test for anything else. (The directory decides, not
// the set: a clear changes no name or flag.)
std::optional<CrashState> Classify(const Bytes& bytes, const Header& old_header, const BitmapSet& old_set,
                                   const BitmapSet& new_set, const std::set<std::string>& removed) {
  const Header h = MustHeader(bytes);
  const bool old_directory = old_header.has_bitmaps_extension
                                 ? h.has_bitmaps_extension &&
                                       h.bitmap_directory_offset == old_header.bitmap_directory_offset
                                 : !h.has_bitmaps_extension;
  const BitmapSet now = Bitmaps(bytes);
  if (!old_directory) {
    if (now != new_set) return std::nullopt;
    return CrashState::kNew;
  }
  if (now.size() != old_set.size()) return std::nullopt;
  bool marked = false;
  for (const auto& [name, info] : old_set) {
    auto it = now.find(name);
    if (it == now.end() || it->second.first != info.first) return std::nullopt;
    if (it->second.second == info.second) continue;
    if (!removed.count(name) || it->second.second != (info.second | kBitmapInUse)) return std::nullopt;
    marked = true;
  }
  return marked ? CrashState::kOldMarkedInUse : CrashState::kOld;
}

// Runs `edit` with the Nth write (then the Nth flush) failing, for every N
// until the edit gets through, and checks both the state the writes so far
// left (the process died) and the state after a power loss (everything
// since the last flush forgotten): old or new bitmaps, each with the dirty
// ranges it should have (cleared ones empty in the new state).
void CrashAfterEveryWrite(const Bytes& image, const BitmapEdit& edit) {
  const BitmapSet old_set = Bitmaps(image);
  const Header old_header = MustHeader(image);
  Outcome done = Apply(image, edit);
  ASSERT_TRUE(done.status.ok()) << done.status.error().ToString();
  const BitmapSet new_set = Bitmaps(done.bytes);
  const std::set<std::string> removed(edit.remove.begin(), edit.remove.end());
  const std::set<std::string> cleared(edit.clear.begin(), edit.clear.end());
  const Bytes guest = Guest(image);
  std::set<CrashState> seen;
  for (FaultOp op : {FaultOp::kWrite, FaultOp::kFlush}) {
    for (uint64_t n = 1;; ++n) {
      SCOPED_TRACE(std::string(FaultOpName(op)) + " " + std::to_string(n));
      Loaded l(image);
      FaultSink faulty(l.sink);
      faulty.faults().AddRule(FaultRule::Nth(op, n));
      Status s = EditBitmaps(l.source, faulty, edit);
      if (s.ok()) {
        EXPECT_GT(n, 1u);
        break;
      }
      ASSERT_EQ(s.error().code(), ErrorCode::kIoError) << s.error().ToString();
      Bytes died = l.sink.contents();
      l.sink.SimulateCrash();
      Bytes lost = l.sink.contents();
      for (const Bytes* b : {&died, &lost}) {
        CheckReport r = MustCheck(*b);
        EXPECT_EQ(r.corruptions, 0u) << Messages(r);
        auto state = Classify(*b, old_header, old_set, new_set, removed);
        ASSERT_TRUE(state.has_value());
        seen.insert(*state);
        EXPECT_EQ(Guest(*b), guest);
        for (const auto& [name, info] : Bitmaps(*b)) {
          if (!(info.second & kBitmapInUse) && old_set.count(name) && !removed.count(name)) {
            if (*state == CrashState::kNew && cleared.count(name)) {
              EXPECT_TRUE(Dirty(*b, name).empty()) << name;
            } else {
              EXPECT_EQ(Dirty(*b, name), Dirty(image, name)) << name;
            }
          }
        }
        // Before the switch the same edit can simply be run again; it
        // finishes with the new set and at most the crash's leaks.
        if (*state != CrashState::kNew) {
          Outcome retry = Apply(*b, edit);
          ASSERT_TRUE(retry.status.ok()) << retry.status.error().ToString();
          EXPECT_EQ(MustCheck(retry.bytes).corruptions, 0u);
          EXPECT_EQ(Bitmaps(retry.bytes), new_set);
          for (const std::string& name : cleared) EXPECT_TRUE(Dirty(retry.bytes, name).empty()) << name;
        }
      }
    }
  }
  EXPECT_TRUE(seen.count(CrashState::kOld));
  EXPECT_TRUE(seen.count(CrashState::kNew));
  if (!removed.empty()) {
    EXPECT_TRUE(seen.count(CrashState::kOldMarkedInUse));
  } else {
    EXPECT_FALSE(seen.count(CrashState::kOldMarkedInUse));
  }
}

TEST(Qcow2BitmapEditCrash, Rotation) {
  CrashAfterEveryWrite(MakeImage(TwoBitmaps()), Rotation("a", "a2"));
}

TEST(Qcow2BitmapEditCrash, RotationSmallClustersOneBitRefcounts) {
  CrashAfterEveryWrite(MakeImage(TwoBitmaps(9, 0), 200), Rotation("b", "b2", 4096));
}

TEST(Qcow2BitmapEditCrash, RemoveSeveralAddSeveral) {
  Qcow2WriterOptions o = TwoBitmaps(12, 3);
  o.bitmaps.push_back(BitmapSpec{"c", 512, true, {{0, 4 << 20}}});
  BitmapEdit edit;
  edit.remove = {"a", "c"};
  edit.add = {BitmapSpec{"x", 512, true, {}}, BitmapSpec{"y", 65536, false, {}}};
  CrashAfterEveryWrite(MakeImage(o), edit);
}

TEST(Qcow2BitmapEditCrash, RemoveLastAndAddFirst) {
  BitmapEdit remove;
  remove.remove = {"only"};
  Qcow2WriterOptions o;
  o.bitmaps = {BitmapSpec{"only", 65536, true, {{0, 1 << 20}}}};
  CrashAfterEveryWrite(MakeImage(o), remove);
  BitmapEdit add;
  add.add = {BitmapSpec{"first", 65536, true, {}}};
  CrashAfterEveryWrite(MakeImage({}), add);
}

TEST(Qcow2BitmapEditCrash, Clear) {
  BitmapEdit edit;
  edit.clear = {"a"};
  CrashAfterEveryWrite(MakeImage(TwoBitmaps()), edit);
}

TEST(Qcow2BitmapEditCrash, ClearSmallClustersOneBitRefcounts) {
  BitmapEdit edit;
  edit.clear = {"b", "a"};
  CrashAfterEveryWrite(MakeImage(TwoBitmaps(9, 0), 200), edit);
}

TEST(Qcow2BitmapEditCrash, EnableDisable) {
  BitmapEdit edit;
  edit.enable = {"b"};
  edit.disable = {"a"};
  CrashAfterEveryWrite(MakeImage(TwoBitmaps()), edit);
}

TEST(Qcow2BitmapEditCrash, EverythingAtOnce) {
  Qcow2WriterOptions o = TwoBitmaps(12, 3);
  o.bitmaps.push_back(BitmapSpec{"c", 512, true, {{0, 4 << 20}}});
  BitmapEdit edit;
  edit.remove = {"c"};
  edit.clear = {"a", "b"};
  edit.enable = {"b"};
  edit.add = {BitmapSpec{"x", 512, false, {}}};
  CrashAfterEveryWrite(MakeImage(o), edit);
}

// ---- Refcount coverage ----

uint64_t UsedTableEntries(const Bytes& bytes) {
  const Header h = MustHeader(bytes);
  uint64_t used = 0;
  for (uint64_t i = 0; i < h.refcount_table_bytes() / 8; ++i) {
    used += LoadBe64(bytes.data() + h.refcount_table_offset + 8 * i) != 0;
  }
  return used;
}

// Clusters between the end of `image` and the end of what its refcount
// table's blocks cover, and whether every table entry is in use.
struct Coverage {
  uint64_t slack_clusters = 0;
  bool table_full = false;
};

Coverage CoverageOf(const Bytes& image) {
  const Header h = MustHeader(image);
  const uint64_t per_block = RefcountsPerBlock(h.cluster_bits, h.refcount_order);
  const uint64_t used = UsedTableEntries(image);
  return {used * per_block - SizeToClusters(image.size(), h.cluster_bits),
          used == h.refcount_table_bytes() / 8};
}

// Images with 512-byte clusters and `data` clusters of data, from `data`
// upwards, until `want` says yes; each step adds about half the slack, so
// the file end approaches the covered limit without skipping it.
Bytes FindImage(uint32_t refcount_order, uint64_t virtual_size, uint64_t data,
                const std::function<bool(const Coverage&)>& want) {
  for (int tries = 0; tries < 200; ++tries) {
    Qcow2WriterOptions o = TwoBitmaps(9, refcount_order);
    o.virtual_size = virtual_size;
    Bytes image = MakeImage(o, data, 1);
    const Coverage c = CoverageOf(image);
    if (want(c)) return image;
    data += std::max<uint64_t>(1, c.slack_clusters / 2);
  }
  return {};
}

// The rotation's table and directory need two clusters; with fewer left
// below the covered limit, a new refcount block goes into a free table
// entry.
TEST(Qcow2BitmapEdit, NewRefcountBlockWhenTheOldOnesDoNotReach) {
  const Bytes image = FindImage(4, 1 << 20, 1000, [](const Coverage& c) { return c.slack_clusters < 2; });
  ASSERT_FALSE(image.empty());
  Outcome out = Apply(image, Rotation("a", "a2"));
  ASSERT_TRUE(out.status.ok()) << out.status.error().ToString();
  ExpectClean(out.bytes);
  EXPECT_EQ(UsedTableEntries(out.bytes), UsedTableEntries(image) + 1);
  EXPECT_EQ(Guest(out.bytes), Guest(image));
  CrashAfterEveryWrite(image, Rotation("a", "a2"));
}

// 512-byte clusters with 64-bit refcounts: one table cluster covers 2 MiB.
// When every table entry is used and the file ends at the covered limit,
// growing the table is refused (before anything is written).
TEST(Qcow2BitmapEdit, FullRefcountTableIsNotSupported) {
  const Bytes image = FindImage(6, 4 << 20, 3890, [](const Coverage& c) {
    return c.table_full && c.slack_clusters < 2;
  });
  ASSERT_FALSE(image.empty());
  ExpectRefused(image, Rotation("a", "a2"), ErrorCode::kNotSupported);
}

// A leaked cluster past the end of the file (an earlier crash) is skipped.
TEST(Qcow2BitmapEdit, AllocationSkipsLeaksPastTheEnd) {
  Bytes image = MakeImage(TwoBitmaps());
  const Header h = MustHeader(image);
  const uint64_t next = SizeToClusters(image.size(), h.cluster_bits);
  const uint64_t block = LoadBe64(image.data() + h.refcount_table_offset);  // covers 32768 clusters
  StoreBe16(image.data() + block + 2 * next, 1);
  Outcome o = Apply(image, Rotation("a", "a2"));
  ASSERT_TRUE(o.status.ok()) << o.status.error().ToString();
  CheckReport r = MustCheck(o.bytes);
  EXPECT_EQ(r.corruptions, 0u) << Messages(r);
  EXPECT_EQ(r.leaks, 1u) << Messages(r);  // the old leak, now inside the file
  MemorySource src(o.bytes);
  auto entries = ReadBitmapDirectory(src, MustHeader(o.bytes));
  ASSERT_TRUE(entries.ok());
  for (const auto& e : *entries) EXPECT_NE(e.info.table_offset, next << h.cluster_bits);
}

// A sink that cannot grow, like a block device.
class FixedSizeSink final : public BlockSink {
 public:
  explicit FixedSizeSink(MemorySink& target) : target_(target) {}
  const std::string& name() const override { return target_.name(); }
  uint64_t size_bytes() const override { return target_.size_bytes(); }
  SinkCapabilities capabilities() const override { return {}; }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    return target_.WriteAt(offset, data);
  }
  Status Flush() override { return target_.Flush(); }

 private:
  MemorySink& target_;
};

TEST(Qcow2BitmapEdit, SinkThatCannotGrowOnlyAllowsRemovingAll) {
  const Bytes image = MakeImage(TwoBitmaps());
  Loaded l(image);
  FixedSizeSink fixed(l.sink);
  Status s = RotateBitmap(l.source, fixed, "a", "a2");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kNotSupported) << s.error().ToString();
  EXPECT_TRUE(l.edit_ops().empty());
  BitmapEdit all;
  all.remove = {"a", "b"};
  s = EditBitmaps(l.source, fixed, all);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ExpectClean(l.sink.contents());
  EXPECT_EQ(l.sink.contents().size(), image.size());
}

TEST(Qcow2BitmapEdit, PathFormUsesTheOpeners) {
  const Bytes image = MakeImage(TwoBitmaps());
  Loaded l(image);
  SourceOpener open_source = [&](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    EXPECT_EQ(path, "/x.qcow2");
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(image, path));
  };
  SinkOpener open_sink = [&](const std::string&) -> Result<std::unique_ptr<BlockSink>> {
    return std::unique_ptr<BlockSink>(std::make_unique<FaultSink>(l.sink));
  };
  Status s = RotateBitmap("/x.qcow2", open_source, open_sink, "a", "z");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  EXPECT_EQ(Bitmaps(l.sink.contents()).count("z"), 1u);
  Status missing = EditBitmaps("/x.qcow2", open_source, open_sink, Rotation("nope", "q"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().path(), "/x.qcow2");
}

}  // namespace
}  // namespace barge::formats
