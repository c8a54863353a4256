// CreateCbtOverlay: the one creator of the CBT overlay (issue 19) used by
// `overlay create` and `cbt enable`: the checks on the data file, the size
// QEMU sees, and the overlay committed in place.
#include "pipeline/cbt_overlay.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <span>
#include <utility>
#include <vector>

#include "blockio/memory.h"
#include "formats/image.h"
#include "formats/qcow2_writer.h"
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

// What StreamCbtOverlay passes on, in call order.
struct Piece {
  uint64_t offset;
  std::vector<std::byte> bytes;
};
struct Streamed {
  Result<CbtOverlayImage> image;
  std::vector<Piece> pieces;
};
Streamed Stream(const std::string& data_file, uint64_t data_size, uint32_t cluster_bits,
                const std::vector<formats::BitmapSpec>& bitmaps) {
  std::vector<Piece> pieces;
  auto image = StreamCbtOverlay(data_file, data_size, cluster_bits, bitmaps,
                                [&](uint64_t offset, std::span<const std::byte> bytes) {
                                  pieces.push_back({offset, {bytes.begin(), bytes.end()}});
                                  return OkStatus();
                                });
  return {std::move(image), std::move(pieces)};
}

// The pieces laid out as the file they make, checking that they cover it
// once, that none is larger than kCbtOverlayPieceBytes, and that the head
// (the qcow2 header block) comes last.
std::vector<std::byte> Assemble(const std::vector<Piece>& pieces, uint64_t size_bytes) {
  std::vector<std::byte> file(size_bytes);
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // offset, end
  for (const Piece& p : pieces) {
    EXPECT_FALSE(p.bytes.empty());
    EXPECT_LE(p.bytes.size(), kCbtOverlayPieceBytes) << "piece at " << p.offset;
    EXPECT_LE(p.offset + p.bytes.size(), size_bytes) << "piece at " << p.offset;
    if (p.offset + p.bytes.size() > size_bytes) continue;
    std::memcpy(file.data() + p.offset, p.bytes.data(), p.bytes.size());
    spans.emplace_back(p.offset, p.offset + p.bytes.size());
  }
  std::sort(spans.begin(), spans.end());
  uint64_t end = 0;
  for (const auto& [offset, span_end] : spans) {
    EXPECT_EQ(offset, end) << "pieces overlap or leave a gap";
    end = span_end;
  }
  EXPECT_EQ(end, size_bytes);
  EXPECT_FALSE(pieces.empty());
  if (!pieces.empty()) {
    EXPECT_EQ(pieces.back().offset, 0u);
    EXPECT_EQ(pieces.back().bytes.size(), std::min<uint64_t>(kCbtOverlayHeadBytes, size_bytes));
  }
  return file;
}

// The overlay of a data file on another host (remote cbt enable): the same
// bytes CreateCbtOverlay writes for a file of that path and size, made from
// the size libvirt reports, with the same size rules.
TEST(CbtOverlayTest, StreamsTheSameBytesForARemoteDataFile) {
  testing::TempDir dir;
  const std::string raw = fs::canonical(dir.path()).string() + "/disk.raw";
  testing::WriteFile(raw, testing::RandomBytes((3 << 20) + 7, 5));
  CbtOverlayRequest req = Request(raw, dir / "disk.qcow2");
  auto made = CreateCbtOverlay(PosixEnv(), req);
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  Streamed built = Stream(raw, (3 << 20) + 7, req.cluster_bits, req.bitmaps);
  ASSERT_TRUE(built.image.ok()) << built.image.error().ToString();
  EXPECT_EQ(built.image->virtual_size, 3u << 20);
  EXPECT_NE(built.image->warning.find("not a multiple of 512"), std::string::npos) << built.image->warning;
  const std::vector<std::byte> file = testing::ReadFile(dir / "disk.qcow2");
  ASSERT_EQ(built.image->size_bytes, file.size());
  EXPECT_TRUE(Assemble(built.pieces, built.image->size_bytes) == file);

  auto tiny = Stream(raw, 100, 16, {});
  ASSERT_FALSE(tiny.image.ok());
  EXPECT_NE(tiny.image.error().message().find("smaller than one 512-byte sector"), std::string::npos);
  EXPECT_TRUE(tiny.pieces.empty());
  auto relative = Stream("disk.raw", 1 << 20, 16, {});
  ASSERT_FALSE(relative.image.ok());
  EXPECT_EQ(relative.image.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(relative.pieces.empty());
}

// The overlay of a large disk is never held whole: no piece is larger than
// kCbtOverlayPieceBytes (a 40 GiB disk's overlay is about 5 MiB), and the
// pieces make the same file the qcow2 writer writes into memory, header
// block last. With 2 MiB clusters, cluster 0 (held until the end) is
// passed on in two pieces, past the head and then the head.
TEST(CbtOverlayTest, LargeDiskOverlayComesInBoundedPieces) {
  formats::BitmapSpec b;
  b.name = "cbt0";
  b.enabled = true;
  for (uint32_t cluster_bits : {16u, 21u}) {
    SCOPED_TRACE("cluster_bits " + std::to_string(cluster_bits));
    // Overlays of 5 and 6 MiB: one whole piece and a part.
    const uint64_t size = cluster_bits == 16 ? uint64_t{40} << 30 : uint64_t{3} << 39;
    Streamed built = Stream("/host/disk.raw", size, cluster_bits, {b});
    ASSERT_TRUE(built.image.ok()) << built.image.error().ToString();
    EXPECT_GT(built.image->size_bytes, kCbtOverlayPieceBytes);
    EXPECT_GE(built.pieces.size(), 3u);

    formats::OverlayOptions o;
    o.virtual_size = size;
    o.data_file_path = "/host/disk.raw";
    o.cluster_bits = cluster_bits;
    o.bitmaps = {b};
    MemorySink whole;
    ASSERT_TRUE(formats::WriteDataFileOverlay(whole, o).ok());
    ASSERT_EQ(built.image->size_bytes, whole.size_bytes());
    EXPECT_TRUE(Assemble(built.pieces, built.image->size_bytes) == whole.contents());
    if (cluster_bits == 21) {
      ASSERT_GE(built.pieces.size(), 2u);
      const Piece& rest = built.pieces[built.pieces.size() - 2];
      EXPECT_EQ(rest.offset, kCbtOverlayHeadBytes);
      EXPECT_EQ(rest.bytes.size(), (uint64_t{1} << 21) - kCbtOverlayHeadBytes);
    }
  }
}

// The caller's error (a failed upload) stops the stream: no piece follows,
// so the head never goes out, and the error comes back as it was.
TEST(CbtOverlayTest, PieceErrorStopsTheStream) {
  std::vector<uint64_t> offsets;
  auto image = StreamCbtOverlay("/host/disk.raw", uint64_t{40} << 30, 16, {},
                                [&](uint64_t offset, std::span<const std::byte>) -> Status {
                                  offsets.push_back(offset);
                                  if (offsets.size() == 2) return Error::IoError("upload failed");
                                  return OkStatus();
                                });
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.error().code(), ErrorCode::kIoError);
  EXPECT_EQ(image.error().message(), "upload failed");
  ASSERT_EQ(offsets.size(), 2u);
  EXPECT_NE(offsets[0], 0u);
  EXPECT_NE(offsets[1], 0u);
}

}  // namespace
}  // namespace barge::pipeline
