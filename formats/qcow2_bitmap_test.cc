// Dirty ranges of persistent bitmaps from hostile images: the work and the
// memory stay bounded by what the file holds.
#include "formats/qcow2_bitmap.h"

#include <gtest/gtest.h>

#include "blockio/memory.h"
#include "formats/image.h"
#include "tests/testing/testing.h"

namespace barge::formats {
namespace {

std::unique_ptr<Image> OpenBytes(const std::vector<std::byte>& bytes) {
  SourceOpener opener = [&](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(bytes, path));
  };
  OpenOptions options;
  options.format = ImageFormat::kQcow2;
  auto image = OpenImage("/t/bitmap.qcow2", opener, options);
  EXPECT_TRUE(image.ok()) << image.error().ToString();
  return image.ok() ? std::move(image).value() : nullptr;
}

// Found while building the hostile-image table (docs/security.md): a 16 GiB
// image with a 512-byte-granularity bitmap whose 1024 table entries all name
// one data cluster of alternating bits (0x55). The dirty ranges were built
// for every entry: 16M ranges from 94 KB (a 1 TiB variant of 390 KB grew
// past 1.8 GB in a minute). A data cluster named twice is now kCorruption.
// Input kept as fuzz/corpus/qcow2_tables_fuzzer/regress_bitmap_shared_data_cluster.qcow2.
TEST(Qcow2BitmapTest, DataClusterSharedByTableEntriesIsCorruption) {
  const auto bytes = testing::ReadFile(std::string(BARGE_SOURCE_DIR) +
                                       "/fuzz/corpus/qcow2_tables_fuzzer/regress_bitmap_shared_data_cluster.qcow2");
  ASSERT_FALSE(bytes.empty());
  auto image = OpenBytes(bytes);
  ASSERT_TRUE(image);
  ASSERT_EQ(image->info().bitmaps.size(), 1u);
  auto ranges = ReadBitmapDirtyRanges(*image, "b0");
  ASSERT_FALSE(ranges.ok());
  EXPECT_EQ(ranges.error().code(), ErrorCode::kCorruption) << ranges.error().ToString();
  EXPECT_NE(ranges.error().message().find("more than one table entry"), std::string::npos);
  EXPECT_EQ(ranges.error().path(), "/t/bitmap.qcow2");
}

// The same image with the data cluster named once: its 16K ranges are read.
TEST(Qcow2BitmapTest, DataClusterNamedOnceIsRead) {
  auto bytes = testing::ReadFile(std::string(BARGE_SOURCE_DIR) +
                                 "/fuzz/corpus/qcow2_tables_fuzzer/regress_bitmap_shared_data_cluster.qcow2");
  ASSERT_FALSE(bytes.empty());
  auto image = OpenBytes(bytes);
  ASSERT_TRUE(image);
  const BitmapInfo& b = image->info().bitmaps[0];
  for (uint32_t i = 1; i < b.table_size; ++i) {
    for (int k = 0; k < 8; ++k) bytes[b.table_offset + 8 * i + k] = std::byte{0};
  }
  image = OpenBytes(bytes);
  auto ranges = ReadBitmapDirtyRanges(*image, "b0");
  ASSERT_TRUE(ranges.ok()) << ranges.error().ToString();
  EXPECT_EQ(ranges->size(), 4096u * 4);  // every other bit of one 4 KiB cluster
  EXPECT_EQ(ranges->front().offset, 0u);
  EXPECT_EQ(ranges->front().length, 512u);
}

}  // namespace
}  // namespace barge::formats
