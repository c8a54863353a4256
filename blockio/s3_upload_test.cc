// S3Upload's part-size arithmetic (pure); the sink itself is tested
// against radosgw in tests/s3_upload_test.cc.
#include "blockio/s3_upload.h"

#include <gtest/gtest.h>

namespace barge {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Parts needed: the front (8 MiB) plus the rest in parts of `part` bytes.
uint64_t PartsFor(uint64_t size, uint64_t part) {
  if (size <= 8 * kMiB) return 1;
  return 1 + (size - 8 * kMiB + part - 1) / part;
}

TEST(S3PartBytesTest, SmallOrUnknownSizesGetEightMiB) {
  EXPECT_EQ(S3PartBytes(0), 8 * kMiB);
  EXPECT_EQ(S3PartBytes(1), 8 * kMiB);
  EXPECT_EQ(S3PartBytes(40 * kMiB), 8 * kMiB);
  EXPECT_EQ(S3PartBytes(8 * kMiB * 9999), 8 * kMiB);
  EXPECT_LE(PartsFor(8 * kMiB * 10000, S3PartBytes(8 * kMiB * 10000)), 10000u);
}

TEST(S3PartBytesTest, LargeSizesFitInTenThousandParts) {
  for (uint64_t size : {16ull << 40, 5ull << 40, (16ull << 40) + 1, (1ull << 40) - 1, 80ull * kMiB * 1000 + 3}) {
    const uint64_t part = S3PartBytes(size);
    EXPECT_EQ(part % kMiB, 0u) << size;
    EXPECT_GE(part, 8 * kMiB) << size;
    EXPECT_LE(PartsFor(size, part), 10000u) << size;
    // Not needlessly large: one MiB less would not fit (or would be under 8 MiB).
    if (part > 8 * kMiB) EXPECT_GT(PartsFor(size, part - kMiB), 10000u) << size;
  }
  EXPECT_EQ(S3PartBytes(16ull << 40), 1678 * kMiB);
}

}  // namespace
}  // namespace barge
