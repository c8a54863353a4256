// PointReader (what barge's nbdkit plugin serves): reads of any alignment
// equal the disk, extents never hide data, a damaged cluster fails its
// reads naming the layer file and guest offset, and merge waits for it.
#include "pipeline/point_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "pipeline/backup.h"
#include "pipeline/endpoints.h"
#include "pipeline/merge.h"
#include "tests/testing/backup_testing.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
// Not a multiple of the cluster size: the last cluster is short.
constexpr uint64_t kSize = 3 * kMiB + 3 * 512;

void Backup(const std::string& raw, const std::string& target, std::optional<RangeList> dirty) {
  Status s = testing::BackupRawFile(raw, target, std::move(dirty), /*uncompressed=*/true);
  ASSERT_TRUE(s.ok()) << s.error().ToString();
}

class PointReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    raw_ = tmp_ / "disk.raw";
    disk_ = testing::RandomBytes(kSize, 11);
    std::memset(disk_.data() + 1 * kMiB, 0, 1 * kMiB);  // a zero run in the full
    testing::WriteFile(raw_, disk_);
    Backup(raw_, tmp_.path().string(), std::nullopt);
    // The incremental rewrites [64 KiB, 192 KiB) and the short last cluster.
    auto fresh = testing::RandomBytes(128 * kKiB, 12);
    std::memcpy(disk_.data() + 64 * kKiB, fresh.data(), fresh.size());
    disk_[kSize - 1] = std::byte{0x7f};
    testing::WriteFile(raw_, disk_);
    Backup(raw_, tmp_.path().string(), RangeList{{64 * kKiB, 128 * kKiB}, {kSize - 512, 512}});
    dir_ = tmp_ / "d";
  }

  TempDir tmp_;
  std::string raw_, dir_;
  std::vector<std::byte> disk_;
};

TEST_F(PointReaderTest, ReadsOfAnyAlignmentEqualTheDisk) {
  auto r = PointReader::Open(PosixEnv(), dir_, "latest");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  PointReader& reader = **r;
  ASSERT_EQ(reader.size_bytes(), kSize);
  const std::vector<std::pair<uint64_t, uint64_t>> reads = {
      {0, kSize},                  // everything, aligned start, short end
      {0, 64 * kKiB},              // one whole cluster (direct)
      {100, 1},                    // one byte
      {64 * kKiB - 7, 200 * kKiB}, // across both layers, unaligned
      {1 * kMiB + 5, 4096},        // inside the zero run
      {kSize - 700, 700},          // the short last cluster
      {kSize, 0},                  // empty, at the end
  };
  for (const auto& [offset, length] : reads) {
    std::vector<std::byte> out(length, std::byte{0xcc});
    ASSERT_TRUE(reader.Read(offset, out).ok()) << offset;
    EXPECT_TRUE(std::equal(out.begin(), out.end(), disk_.begin() + offset)) << "offset " << offset << " length " << length;
  }
  std::vector<std::byte> past(2);
  EXPECT_EQ(reader.Read(kSize - 1, past).error().code(), ErrorCode::kInvalidArgument);
}

TEST_F(PointReaderTest, ExtentsCoverTheDiskAndClaimZerosOnlyWhereTheDiskIsZero) {
  auto r = PointReader::Open(PosixEnv(), dir_, "latest");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  auto extents = (*r)->Extents(0, kSize);
  ASSERT_TRUE(extents.ok()) << extents.error().ToString();
  uint64_t at = 0, zero_bytes = 0;
  for (const Extent& e : *extents) {
    EXPECT_EQ(e.offset, at);
    at = e.end();
    if (e.kind == ExtentKind::kData) continue;
    zero_bytes += e.length;
    for (uint64_t i = e.offset; i < e.end(); ++i) ASSERT_EQ(disk_[i], std::byte{0}) << "offset " << i;
  }
  EXPECT_EQ(at, kSize);
  EXPECT_GE(zero_bytes, 1 * kMiB);  // the zero run is skipped by clients
}

TEST_F(PointReaderTest, ADamagedClusterFailsItsReadsNamingLayerAndOffset) {
  auto chain = LoadChainFolder(PosixEnv(), dir_);
  ASSERT_TRUE(chain.ok());
  const std::string top = chain->PathOf(chain->latest().manifest.image);
  uint64_t host = 0;
  {
    auto image = OpenImageFile(PosixEnv(), top, {});
    ASSERT_TRUE(image.ok()) << image.error().ToString();
    auto map = (*image)->Map(64 * kKiB, 64 * kKiB);
    ASSERT_TRUE(map.ok() && !map->empty() && map->front().depth == 0 && map->front().host_offset);
    host = *map->front().host_offset;
  }
  {
    auto bytes = testing::ReadFile(top);
    bytes[host + 10] ^= std::byte{1};
    testing::WriteFile(top, bytes);
  }
  auto r = PointReader::Open(PosixEnv(), dir_, "latest");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  std::vector<std::byte> out(512);
  Status bad = (*r)->Read(64 * kKiB + 4096, out);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(bad.error().path(), top);
  EXPECT_NE(bad.error().message().find("0x10000"), std::string::npos) << bad.error().ToString();
  // The clusters around it still read.
  EXPECT_TRUE((*r)->Read(0, std::span(out)).ok());
  EXPECT_TRUE((*r)->Read(128 * kKiB, std::span(out)).ok());
  // The older point does not read through the damaged layer.
  auto older = PointReader::Open(PosixEnv(), dir_, "0");
  ASSERT_TRUE(older.ok()) << older.error().ToString();
  EXPECT_TRUE((*older)->Read(64 * kKiB, std::span(out)).ok());
}

TEST_F(PointReaderTest, MergeIsRefusedWhileAReaderIsOpenAndRunsAfter) {
  MergeRequest merge;
  merge.chain_dir = dir_;
  merge.through = "latest";
  merge.copy.threads = 2;
  {
    auto r = PointReader::Open(PosixEnv(), dir_, "latest");
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    auto refused = RunMerge(PosixEnv(), merge);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code(), ErrorCode::kBusy) << refused.error().ToString();
  }
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".export-")) << e.path();
  }
  auto merged = RunMerge(PosixEnv(), merge);
  ASSERT_TRUE(merged.ok()) << merged.error().ToString();
  EXPECT_TRUE(merged->merged);
}

}  // namespace
}  // namespace barge::pipeline
