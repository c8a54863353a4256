// The benchmark disk generator's sizes (issue 12: "bench generate --size
// 1000 writes a 0-byte disk and exits 0").
#include "pipeline/disk_generator.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

TEST(DiskGeneratorTest, SizeBelowOneMiBOrNotA4KMultipleIsRefusedAndNoFileWritten) {
  testing::TempDir dir;
  for (uint64_t size : {uint64_t{0}, uint64_t{1000}, uint64_t{4096}, (uint64_t{1} << 20) + 512}) {
    DiskGeneratorOptions o;
    o.size_bytes = size;
    auto r = GenerateDisk(PosixEnv(), dir / "d.raw", o);
    ASSERT_FALSE(r.ok()) << size;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_FALSE(std::filesystem::exists(dir / "d.raw")) << size;
  }
  EXPECT_NE(CheckGeneratedDiskSize(1000).error().message().find("1000"), std::string::npos);
  EXPECT_TRUE(CheckGeneratedDiskSize(1 << 20).ok());
}

// A small disk is a mix too (a 4 MiB disk used to be one hole).
TEST(DiskGeneratorTest, SmallDiskHoldsEveryKind) {
  DiskGeneratorOptions o;
  o.size_bytes = 4 << 20;
  DiskMix mix = PlanDisk(o);
  EXPECT_EQ(mix.size_bytes, o.size_bytes);
  for (uint64_t n : mix.extents) EXPECT_GT(n, 0u);
}

}  // namespace
}  // namespace barge::pipeline
