// barge bitmap's edits (RunBitmapEdit) on a qcow2 file barge writes.
#include "pipeline/bitmap_edit.h"

#include <gtest/gtest.h>

#include "formats/qcow2_writer.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

using barge::testing::TempDir;

std::string MakeQcow2(const TempDir& dir) {
  const std::string path = dir / "disk.qcow2";
  auto sink = Env::Default().OpenSink(path, SinkMode::kCreateNew);
  EXPECT_TRUE(sink.ok());
  formats::Qcow2WriterOptions o;
  o.virtual_size = 4 << 20;
  o.compression = formats::Compression::kNone;
  auto w = formats::Qcow2Writer::Create(**sink, o);
  EXPECT_TRUE(w.ok());
  EXPECT_TRUE((*w)->Finish().ok());
  EXPECT_TRUE((*sink)->Flush().ok());
  return path;
}

TEST(BitmapEditTest, Granularity) {
  EXPECT_EQ(DefaultBitmapGranularity(512), 4096u);
  EXPECT_EQ(DefaultBitmapGranularity(65536), 65536u);
  EXPECT_EQ(DefaultBitmapGranularity(2 << 20), 65536u);
  EXPECT_TRUE(CheckBitmapGranularity(512, "512").ok());
  EXPECT_TRUE(CheckBitmapGranularity(uint64_t{1} << 31, "2G").ok());
  for (uint64_t bad : {uint64_t{256}, uint64_t{3000}, uint64_t{1} << 32}) {
    Status s = CheckBitmapGranularity(bad, "X");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.error().message(), "--granularity must be a power of two from 512 to 2G, not X");
  }
}

TEST(BitmapEditTest, AddThenEnableSaysWhatWasAlreadySo) {
  TempDir dir;
  const std::string path = MakeQcow2(dir);
  auto added = RunBitmapEdit(Env::Default(), {path, BitmapAction::kAdd, {"a", "b"}, 0, false});
  ASSERT_TRUE(added.ok()) << added.error().ToString();
  EXPECT_EQ(added->granularity, 65536u);  // the cluster size, as qemu-img
  ASSERT_EQ(added->bitmaps.size(), 2u);
  EXPECT_TRUE(added->unchanged.empty());

  auto disabled = RunBitmapEdit(Env::Default(), {path, BitmapAction::kDisable, {"b"}, 0, false});
  ASSERT_TRUE(disabled.ok()) << disabled.error().ToString();
  auto enabled = RunBitmapEdit(Env::Default(), {path, BitmapAction::kEnable, {"a", "b"}, 0, false});
  ASSERT_TRUE(enabled.ok()) << enabled.error().ToString();
  EXPECT_EQ(enabled->unchanged, std::vector<std::string>{"a"});
  for (const auto& b : enabled->bitmaps) EXPECT_TRUE(b.enabled) << b.name;

  auto removed = RunBitmapEdit(Env::Default(), {path, BitmapAction::kRemove, {"a"}, 0, false});
  ASSERT_TRUE(removed.ok()) << removed.error().ToString();
  ASSERT_EQ(removed->bitmaps.size(), 1u);
  EXPECT_EQ(removed->bitmaps[0].name, "b");
}

TEST(BitmapEditTest, ARawFileIsRefused) {
  TempDir dir;
  const std::string path = dir / "disk.raw";
  testing::WriteFile(path, std::vector<std::byte>(65536));
  auto r = RunBitmapEdit(Env::Default(), {path, BitmapAction::kAdd, {"a"}, 0, false});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotSupported);
  EXPECT_NE(r.error().message().find("create a CBT overlay"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace barge::pipeline
