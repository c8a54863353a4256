// Encryption at rest under a real image format: a qcow2 written by the
// qcow2 writer through an EncryptingSink (appends, a Sync in the middle,
// the header at 0 last) reads back through a DecryptingSource and the
// qcow2 reader as the disk that went in, and its ciphertext holds none of
// the disk's known text. Here rather than in blockio: blockio tests may not
// see formats/.
#include <gtest/gtest.h>

#include <cstring>
#include <string_view>

#include "blockio/aead_stream.h"
#include "blockio/memory.h"
#include "formats/image.h"
#include "formats/qcow2_compress.h"
#include "formats/qcow2_writer.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

TEST(AeadQcow2Test, Qcow2ThroughEncryptionReadsBackTheDisk) {
  constexpr uint64_t kCluster = 64 * 1024;
  constexpr uint64_t kClusters = 48;
  const std::string marker = "BARGE-ENCRYPTION-MARKER-6f1c2a";
  // Random clusters (stored raw), text clusters (compressible, stored
  // compressed), zero clusters and never-written ones.
  std::vector<std::byte> disk(kClusters * kCluster);
  for (uint64_t c = 0; c < kClusters; ++c) {
    std::byte* at = disk.data() + c * kCluster;
    if (c % 4 == 0) {
      const auto random = testing::RandomBytes(kCluster, c + 1);
      std::memcpy(at, random.data(), kCluster);
    } else if (c % 4 == 1) {
      for (uint64_t i = 0; i + marker.size() <= kCluster; i += 256) std::memcpy(at + i, marker.data(), marker.size());
    }
  }
  std::array<uint8_t, kKekBytes> raw{};
  raw.fill(0x5a);
  const EncryptionKey key = EncryptionKey::FromRawKey(raw);

  MemorySink object(0, "s3://bucket/chain/full.qcow2");
  auto sink = EncryptingSink::Create(object, key, "bucket/chain/full.qcow2");
  ASSERT_TRUE(sink.ok());
  formats::Qcow2WriterOptions options;
  options.virtual_size = disk.size();
  options.compression = formats::Compression::kZstd;
  auto writer = formats::Qcow2Writer::Create(**sink, options);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  formats::ClusterCompressor compressor(formats::Compression::kZstd, 1);
  for (uint64_t c = 0; c < kClusters; ++c) {
    const auto cluster = std::span<const std::byte>(disk).subspan(c * kCluster, kCluster);
    if (c % 4 == 2) {
      ASSERT_TRUE((*writer)->WriteZero(c).ok());
    } else if (c % 4 == 1) {
      auto payload = compressor.Compress(cluster);
      ASSERT_TRUE(payload.ok() && payload->has_value());
      ASSERT_TRUE((*writer)->WriteCompressed(c, **payload).ok());
    } else if (c % 4 == 0) {
      ASSERT_TRUE((*writer)->WriteData(c, cluster).ok());
    }  // c % 4 == 3: never written, reads as zeros
    if (c == kClusters / 2) {
      auto synced = (*writer)->Sync();  // a mid-stream Flush of the encrypting sink
      ASSERT_TRUE(synced.ok()) << synced.error().ToString();
    }
  }
  ASSERT_TRUE((*writer)->Finish().ok());

  const std::vector<std::byte> ciphertext = object.contents();
  const std::string_view text(reinterpret_cast<const char*>(ciphertext.data()), ciphertext.size());
  EXPECT_EQ(text.find(marker.substr(0, 16)), std::string_view::npos);
  EXPECT_EQ(text.find("QFI\xfb"), std::string_view::npos);  // not even the qcow2 magic

  auto opener = [&](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    auto decrypted = DecryptingSource::Open(std::make_unique<MemorySource>(ciphertext, path), key,
                                            "bucket/chain/full.qcow2");
    if (!decrypted.ok()) return std::move(decrypted).error();
    return std::unique_ptr<BlockSource>(std::move(decrypted).value());
  };
  auto image = formats::OpenImage("s3://bucket/chain/full.qcow2", opener);
  ASSERT_TRUE(image.ok()) << image.error().ToString();
  EXPECT_EQ((*image)->format(), formats::ImageFormat::kQcow2);
  ASSERT_EQ((*image)->size_bytes(), disk.size());
  std::vector<std::byte> back(disk.size());
  ASSERT_TRUE((*image)->ReadAt(0, back).ok());
  EXPECT_TRUE(back == disk);
}

}  // namespace
}  // namespace barge
