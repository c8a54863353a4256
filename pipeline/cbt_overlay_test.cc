// CreateCbtOverlay: the one creator of the CBT overlay (issue 19) used by
// `overlay create` and `cbt enable`: the checks on the data file, the size
// QEMU sees, and the overlay committed in place.
#include "pipeline/cbt_overlay.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "formats/image.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;

CbtOverlayRequest Request(const std::string& data, const std::string& overlay) {
  CbtOverlayRequest req;
  req.data_file = data;
  req.overlay = overlay;
  formats::BitmapSpec b;
  b.name = "cbt0";
  b.enabled = true;
  req.bitmaps.push_back(b);
  return req;
}

std::string Probe(const std::string& path) {
  auto src = PosixEnv().OpenSource(path);
  if (!src.ok()) return "error";
  auto name = formats::ProbeFormatName(**src);
  return name.ok() ? *name : "error";
}

TEST(CbtOverlayTest, MakesTheOverlayOverTheRealPath) {
  testing::TempDir dir;
  const std::string raw = dir / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes((1 << 20) + 100, 3));
  fs::create_symlink(raw, dir / "link.raw");
  auto made = CreateCbtOverlay(PosixEnv(), Request(dir / "link.raw", dir / "disk.qcow2"));
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  EXPECT_EQ(made->data_file, fs::canonical(raw).string());
  EXPECT_EQ(made->virtual_size, 1u << 20);
  EXPECT_EQ(made->data_stat.size_bytes, (1u << 20) + 100);
  EXPECT_NE(made->warning.find("not a multiple of 512"), std::string::npos) << made->warning;
  EXPECT_EQ(Probe(dir / "disk.qcow2"), "qcow2");
  // The data file is never written.
  EXPECT_EQ(fs::file_size(raw), (1u << 20) + 100);

  auto even = CreateCbtOverlay(PosixEnv(), Request(dir / "disk.qcow2", dir / "twice.qcow2"));
  ASSERT_FALSE(even.ok());
  EXPECT_EQ(even.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(even.error().message().find("is a qcow2 image, not a raw disk"), std::string::npos)
      << even.error().message();
  EXPECT_FALSE(fs::exists(dir / "twice.qcow2"));
  // cbt enable: libvirt's format='raw' says the bytes are the guest's.
  CbtOverlayRequest guest = Request(dir / "disk.qcow2", dir / "twice.qcow2");
  guest.refuse_image_data = false;
  EXPECT_TRUE(CreateCbtOverlay(PosixEnv(), guest).ok());
}

TEST(CbtOverlayTest, RefusesWhatIsNoRawDisk) {
  testing::TempDir dir;
  testing::WriteFile(dir / "tiny.raw", testing::RandomBytes(100, 4));
  auto tiny = CreateCbtOverlay(PosixEnv(), Request(dir / "tiny.raw", dir / "o.qcow2"));
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.error().message().find("smaller than one 512-byte sector"), std::string::npos);
  auto folder = CreateCbtOverlay(PosixEnv(), Request(dir.path().string(), dir / "o.qcow2"));
  ASSERT_FALSE(folder.ok());
  EXPECT_NE(folder.error().message().find("regular raw file"), std::string::npos);
  auto missing = CreateCbtOverlay(PosixEnv(), Request(dir / "missing.raw", dir / "o.qcow2"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir / "o.qcow2"));
}

// The overlay of a data file on another host (remote cbt enable): the same
// bytes CreateCbtOverlay writes for a file of that path and size, built from
// the size libvirt reports, with the same size rules.
TEST(CbtOverlayTest, BuildsTheSameBytesForARemoteDataFile) {
  testing::TempDir dir;
  const std::string raw = fs::canonical(dir.path()).string() + "/disk.raw";
  testing::WriteFile(raw, testing::RandomBytes((3 << 20) + 7, 5));
  CbtOverlayRequest req = Request(raw, dir / "disk.qcow2");
  auto made = CreateCbtOverlay(PosixEnv(), req);
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  auto built = BuildCbtOverlay(raw, (3 << 20) + 7, req.cluster_bits, req.bitmaps);
  ASSERT_TRUE(built.ok()) << built.error().ToString();
  EXPECT_EQ(built->virtual_size, 3u << 20);
  EXPECT_NE(built->warning.find("not a multiple of 512"), std::string::npos) << built->warning;
  const std::vector<std::byte> file = testing::ReadFile(dir / "disk.qcow2");
  ASSERT_EQ(built->bytes.size(), file.size());
  EXPECT_EQ(std::memcmp(built->bytes.data(), file.data(), file.size()), 0);

  auto tiny = BuildCbtOverlay(raw, 100, 16, {});
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.error().message().find("smaller than one 512-byte sector"), std::string::npos);
  auto relative = BuildCbtOverlay("disk.raw", 1 << 20, 16, {});
  ASSERT_FALSE(relative.ok());
  EXPECT_EQ(relative.error().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace barge::pipeline
