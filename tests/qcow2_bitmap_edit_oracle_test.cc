// Judges in-place bitmap edits (formats/qcow2_bitmap_edit.h) with the real
// tools: qemu-img check/info/compare on qemu-made images and CBT overlays,
// qemu-io writes afterwards tracked by the new bitmap, and qemu-img check
// on the file left by an edit that died after every single write.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "blockio/fault.h"
#include "blockio/file.h"
#include "formats/image.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_bitmap_edit.h"
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

Result<std::unique_ptr<BlockSource>> OpenRead(const std::string& path) { return OpenFileSource(path); }
Result<std::unique_ptr<BlockSink>> OpenWrite(const std::string& path) {
  return OpenFileSink(path, SinkMode::kExisting);
}

Status Edit(const std::string& path, const BitmapEdit& edit) {
  return EditBitmaps(path, OpenRead, OpenWrite, edit);
}

// The JSON document a command prints on stdout (its stderr kept apart).
nlohmann::json Json(const std::string& command) {
  auto r = Run(command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return nlohmann::json::parse(r.stdout_text, nullptr, false);
}

// qemu-img check exit code and its JSON report.
struct QemuCheck {
  int exit_code = -1;
  nlohmann::json report;
  std::string output;
};

QemuCheck Check(const std::string& image) {
  QemuCheck c;
  auto r = Run("qemu-img check -f qcow2 --output=json " + ShellQuote(image));
  c.exit_code = r.exit_code;
  c.output = r.output;
  c.report = nlohmann::json::parse(r.stdout_text, nullptr, false);
  return c;
}

void ExpectClean(const std::string& image) {
  QemuCheck c = Check(image);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_EQ(c.report.value("leaks", 0), 0) << c.output;
  EXPECT_EQ(c.report.value("corruptions", 0), 0) << c.output;
  EXPECT_EQ(c.report.value("check-errors", 0), 0) << c.output;
}

// name -> "granularity flag,flag" from qemu-img info, e.g. "65536 auto".
using QemuBitmaps = std::map<std::string, std::string>;

QemuBitmaps InfoBitmaps(const std::string& image) {
  auto info = Json("qemu-img info -f qcow2 --output=json " + ShellQuote(image));
  QemuBitmaps out;
  const auto& data = info["format-specific"]["data"];
  if (!data.contains("bitmaps")) return out;
  for (const auto& b : data["bitmaps"]) {
    std::string flags;
    for (const auto& f : b["flags"]) flags += (flags.empty() ? "" : ",") + f.get<std::string>();
    out[b["name"].get<std::string>()] = std::to_string(b["granularity"].get<uint64_t>()) + " " + flags;
  }
  return out;
}

RangeList BargeDirty(const std::string& image, const std::string& bitmap) {
  OpenOptions options;
  options.format = ImageFormat::kQcow2;
  options.open_data_file = false;
  auto opened = OpenImage(image, OpenRead, options);
  EXPECT_TRUE(opened.ok()) << opened.error().ToString();
  if (!opened.ok()) return {};
  auto ranges = ReadBitmapDirtyRanges(**opened, bitmap);
  EXPECT_TRUE(ranges.ok()) << ranges.error().ToString();
  return ranges.ok() ? *ranges : RangeList{};
}

void QemuIo(const std::string& image, const std::string& commands) {
  RunOk("qemu-io -f qcow2 " + commands + " " + ShellQuote(image));
}

class Qcow2BitmapEditOracle : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
  }
  TempDir dir_;
};

// (a) qemu's own image: two bitmaps, one dirty, rotate it; qemu must find
// the image clean, list the right bitmaps, read the same guest data, and
// its later writes must land in the new bitmap.
TEST_P(Qcow2BitmapEditOracle, RotateQemuImage) {
  const std::string img = dir_ / "vm.qcow2";
  const std::string before = dir_ / "before.raw";
  RunOk("qemu-img create -q -f qcow2 -o cluster_size=" + GetParam() + " " + ShellQuote(img) + " 16M");
  QemuIo(img, "-c 'write -P 0xaa 0 1M' -c 'write -P 0xbb 9M 300k'");
  RunOk("qemu-img bitmap --add -g 65536 " + ShellQuote(img) + " cbt0");
  RunOk("qemu-img bitmap --add -g 4096 --disable " + ShellQuote(img) + " frozen");
  QemuIo(img, "-c 'write -P 0xcc 2M 128k' -c 'write -z 12M 64k'");
  ASSERT_EQ(BargeDirty(img, "cbt0"), (RangeList{{2 << 20, 128 << 10}, {12 << 20, 64 << 10}}));
  ExpectClean(img);
  RunOk("qemu-img convert -f qcow2 -O raw " + ShellQuote(img) + " " + ShellQuote(before));

  Status s = RotateBitmap(img, OpenRead, OpenWrite, "cbt0", "cbt1");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ExpectClean(img);
  EXPECT_EQ(InfoBitmaps(img), (QemuBitmaps{{"frozen", "4096 "}, {"cbt1", "65536 auto"}}));
  RunOk("qemu-img compare -f qcow2 -F raw " + ShellQuote(img) + " " + ShellQuote(before));
  EXPECT_TRUE(BargeDirty(img, "cbt1").empty());

  // qemu writes through the rotated image: the new bitmap tracks it, the
  // disabled one does not.
  QemuIo(img, "-c 'write -P 0xdd 5M 64k' -c 'write -P 0xee 15M 4k'");
  ExpectClean(img);
  EXPECT_EQ(BargeDirty(img, "cbt1"), (RangeList{{5 << 20, 64 << 10}, {15 << 20, 64 << 10}}));
  EXPECT_TRUE(BargeDirty(img, "frozen").empty());
  // qemu can still work on the bitmaps we wrote, and we on the ones it
  // rewrote: merge, then remove everything.
  RunOk("qemu-img bitmap --add -g 65536 " + ShellQuote(img) + " copy");
  RunOk("qemu-img bitmap --merge cbt1 " + ShellQuote(img) + " copy");
  EXPECT_EQ(BargeDirty(img, "copy"), BargeDirty(img, "cbt1"));
  BitmapEdit remove_all;
  remove_all.remove = {"cbt1", "copy", "frozen"};
  s = Edit(img, remove_all);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ExpectClean(img);
  EXPECT_TRUE(InfoBitmaps(img).empty());
  auto info = Json("qemu-img info -f qcow2 --output=json " + ShellQuote(img));
  EXPECT_FALSE(info["format-specific"]["data"].contains("bitmaps"));
  RunOk("qemu-img bitmap --add " + ShellQuote(img) + " again");  // qemu accepts the result
  ExpectClean(img);
}

// (b) CBT overlays over a raw data file, made by barge and by qemu-img.
TEST_P(Qcow2BitmapEditOracle, RotateCbtOverlay) {
  const uint32_t bits = GetParam() == "512" ? 9 : GetParam() == "64k" ? 16 : 21;
  const std::string raw = dir_ / "disk.raw";
  const std::string overlay = dir_ / "overlay.qcow2";
  const uint64_t size = 8 << 20;
  WriteFile(raw, barge::testing::RandomBytes(size, bits));
  OverlayOptions options;
  options.virtual_size = size;
  options.data_file_path = raw;
  options.cluster_bits = bits;
  options.bitmaps = {BitmapSpec{"cbt0", 65536, true, {}}};
  {
    auto sink = OpenFileSink(overlay, SinkMode::kCreateNew);
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE(WriteDataFileOverlay(**sink, options).ok());
  }
  QemuIo(overlay, "-c 'write -P 0x11 1M 64k'");  // the VM ran: cbt0 is dirty
  const std::vector<std::byte> disk = ReadFile(raw);
  ExpectClean(overlay);

  Status s = RotateBitmap(overlay, OpenRead, OpenWrite, "cbt0", "cbt1");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ExpectClean(overlay);
  EXPECT_EQ(InfoBitmaps(overlay), (QemuBitmaps{{"cbt1", "65536 auto"}}));
  EXPECT_EQ(ReadFile(raw), disk);  // the data file is never touched
  RunOk("qemu-img compare -f qcow2 -F raw " + ShellQuote(overlay) + " " + ShellQuote(raw));
  QemuIo(overlay, "-c 'write -P 0x22 7M 4k'");
  EXPECT_EQ(BargeDirty(overlay, "cbt1"), (RangeList{{7 << 20, 64 << 10}}));
  ExpectClean(overlay);

  // The same on an overlay qemu-img made (over a scratch raw file: create
  // with data_file= truncates the file it names).
  const std::string qraw = dir_ / "q.raw";
  const std::string qoverlay = dir_ / "q.qcow2";
  RunOk("qemu-img create -q -f qcow2 -o cluster_size=" + GetParam() + ",data_file=" + ShellQuote(qraw) +
        ",data_file_raw=on " + ShellQuote(qoverlay) + " 8M");
  RunOk("qemu-img bitmap --add -g 65536 " + ShellQuote(qoverlay) + " cbt0");
  QemuIo(qoverlay, "-c 'write -P 0x33 0 64k'");
  s = RotateBitmap(qoverlay, OpenRead, OpenWrite, "cbt0", "cbt1");
  ASSERT_TRUE(s.ok()) << s.error().ToString();
  ExpectClean(qoverlay);
  EXPECT_EQ(InfoBitmaps(qoverlay), (QemuBitmaps{{"cbt1", "65536 auto"}}));
  RunOk("qemu-img compare -f qcow2 -F raw " + ShellQuote(qoverlay) + " " + ShellQuote(qraw));
}

// A crash after any write: what reached the file must pass qemu-img check
// (leaks allowed: exit 3) and show the old bitmaps (the removed one maybe
// in use) or the new ones.
TEST_P(Qcow2BitmapEditOracle, DyingAfterEveryWriteLeavesAValidImage) {
  const std::string base = dir_ / "base.qcow2";
  const std::string img = dir_ / "img.qcow2";
  RunOk("qemu-img create -q -f qcow2 -o cluster_size=" + GetParam() + " " + ShellQuote(base) + " 8M");
  QemuIo(base, "-c 'write -P 0xaa 0 1M'");
  RunOk("qemu-img bitmap --add -g 65536 " + ShellQuote(base) + " cbt0");
  RunOk("qemu-img bitmap --add -g 65536 --disable " + ShellQuote(base) + " keep");
  QemuIo(base, "-c 'write -P 0xbb 4M 64k'");
  const QemuBitmaps old_set = InfoBitmaps(base);
  const QemuBitmaps marked = {{"cbt0", "65536 in-use,auto"}, {"keep", "65536 "}};
  const QemuBitmaps new_set = {{"cbt1", "65536 auto"}, {"keep", "65536 "}};
  std::map<std::string, int> seen;
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("write " + std::to_string(n));
    RunOk("cp " + ShellQuote(base) + " " + ShellQuote(img));
    auto source = OpenFileSource(img);
    auto sink = OpenFileSink(img, SinkMode::kExisting);
    ASSERT_TRUE(source.ok() && sink.ok());
    FaultSink faulty(std::move(*sink));
    faulty.faults().AddRule(FaultRule::Nth(FaultOp::kWrite, n));
    Status s = RotateBitmap(**source, faulty, "cbt0", "cbt1");
    QemuCheck c = Check(img);
    EXPECT_TRUE(c.exit_code == 0 || c.exit_code == 3) << c.output;
    EXPECT_EQ(c.report.value("corruptions", 0), 0) << c.output;
    const QemuBitmaps now = InfoBitmaps(img);
    if (now == old_set) {
      ++seen["old"];
    } else if (now == marked) {
      ++seen["marked"];
    } else {
      EXPECT_EQ(now, new_set);
      ++seen["new"];
    }
    if (s.ok()) {
      EXPECT_EQ(c.exit_code, 0) << c.output;
      break;
    }
    ASSERT_LT(n, 100u);
  }
  EXPECT_GT(seen["old"], 0);
  EXPECT_GT(seen["marked"], 0);
  EXPECT_GT(seen["new"], 0);
}

// The same for clear and disable together: what reached the file passes
// qemu-img check (leaks allowed) and qemu sees the old bitmaps (cbt0 dirty,
// enabled) or the new ones (cbt0 empty, disabled), nothing in between.
TEST_P(Qcow2BitmapEditOracle, DyingDuringClearAndDisableLeavesAValidImage) {
  const std::string base = dir_ / "base.qcow2";
  const std::string img = dir_ / "img.qcow2";
  RunOk("qemu-img create -q -f qcow2 -o cluster_size=" + GetParam() + " " + ShellQuote(base) + " 8M");
  RunOk("qemu-img bitmap --add -g 65536 " + ShellQuote(base) + " cbt0");
  RunOk("qemu-img bitmap --add -g 4096 " + ShellQuote(base) + " keep");
  QemuIo(base, "-c 'write -P 0xbb 4M 64k'");
  const QemuBitmaps old_set = {{"cbt0", "65536 auto"}, {"keep", "4096 auto"}};
  const QemuBitmaps new_set = {{"cbt0", "65536 "}, {"keep", "4096 auto"}};
  ASSERT_EQ(InfoBitmaps(base), old_set);
  BitmapEdit edit;
  edit.clear = {"cbt0"};
  edit.disable = {"cbt0"};
  std::map<std::string, int> seen;
  for (uint64_t n = 1;; ++n) {
    SCOPED_TRACE("write " + std::to_string(n));
    RunOk("cp " + ShellQuote(base) + " " + ShellQuote(img));
    auto source = OpenFileSource(img);
    auto sink = OpenFileSink(img, SinkMode::kExisting);
    ASSERT_TRUE(source.ok() && sink.ok());
    FaultSink faulty(std::move(*sink));
    faulty.faults().AddRule(FaultRule::Nth(FaultOp::kWrite, n));
    Status s = EditBitmaps(**source, faulty, edit);
    QemuCheck c = Check(img);
    EXPECT_TRUE(c.exit_code == 0 || c.exit_code == 3) << c.output;
    EXPECT_EQ(c.report.value("corruptions", 0), 0) << c.output;
    const QemuBitmaps now = InfoBitmaps(img);
    if (now == old_set) {
      ++seen["old"];
      EXPECT_EQ(BargeDirty(img, "cbt0"), (RangeList{{4 << 20, 64 << 10}}));
    } else {
      EXPECT_EQ(now, new_set);
      EXPECT_TRUE(BargeDirty(img, "cbt0").empty());
      ++seen["new"];
    }
    EXPECT_EQ(BargeDirty(img, "keep"), (RangeList{{4 << 20, 64 << 10}}));
    if (s.ok()) {
      EXPECT_EQ(c.exit_code, 0) << c.output;
      break;
    }
    ASSERT_LT(n, 100u);
  }
  EXPECT_GT(seen["old"], 0);
  EXPECT_GT(seen["new"], 0);
}

INSTANTIATE_TEST_SUITE_P(ClusterSizes, Qcow2BitmapEditOracle, ::testing::Values("512", "64k", "2M"),
                         [](const auto& info) { return "cs" + info.param; });

}  // namespace
}  // namespace barge::formats
