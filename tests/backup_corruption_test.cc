// `barge verify` over damaged backups (after qemu iotest 060): a flipped
// byte in a raw and in a compressed data cluster, in an L2 entry, a
// refcount, the header, the manifest and the digest table, and a truncated
// image. Each must fail with a clear message (naming the guest offset for
// data), never crash, and qemu-img agrees the metadata damage is real.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::RunOk;
using ::barge::testing::ShellQuote;
using ::barge::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kCluster = 64 << 10;

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

// XORs one byte of a file in place.
void FlipByte(const std::string& path, uint64_t offset, uint8_t mask = 0x01) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= mask;
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ::close(fd);
}

uint64_t ReadBe64(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0) << path;
  uint8_t b[8] = {};
  EXPECT_EQ(::pread(fd, b, 8, static_cast<off_t>(offset)), 8);
  ::close(fd);
  uint64_t v = 0;
  for (uint8_t x : b) v = (v << 8) | x;
  return v;
}

using ::barge::testing::ErrorOf;
using ::barge::testing::ResultOf;

class BackupCorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    // 4 MiB random (stored raw: zstd cannot shrink it), 4 MiB of low
    // entropy (stored compressed), 8 MiB zeros (not stored).
    std::vector<std::byte> bytes = testing::RandomBytes(16 * kMiB, 21);
    // Two bits of entropy a byte: every cluster compresses to about a
    // quarter, so a payload is kilobytes long.
    for (uint64_t i = 4 * kMiB; i < 8 * kMiB; ++i) bytes[i] = std::byte("acgt"[uint8_t(bytes[i]) & 3]);
    for (uint64_t i = 8 * kMiB; i < 16 * kMiB; ++i) bytes[i] = std::byte{0};
    disk_ = dir_ / "vm.raw";
    testing::WriteFile(disk_, bytes);
    json r = testing::RunResult(Barge("backup --source " + ShellQuote(disk_) + " --target " +
                                      ShellQuote(dir_ / "b") + " --json"));
    ASSERT_FALSE(r.empty());
    image_ = r["image"];
    manifest_ = r["manifest"];
    digests_ = r["digest_table"];
    chain_ = dir_ / "b/vm";
    RunOk(Barge("verify " + ShellQuote(chain_)));  // intact before we poke it
  }

  // Runs barge verify --json; it must be a clean failure: exit 1 or 2 (2:
  // Corruption), never a signal, with `exact` if given; the error on
  // stderr, and as the error event ending stdout, with no result.
  CommandResult VerifyFails(int exact = 0) {
    CommandResult r = testing::Run(Barge("verify --json " + ShellQuote(chain_)));
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << r.output;
    if (exact != 0) {
      EXPECT_EQ(r.exit_code, exact) << r.output;
    }
    EXPECT_NE(r.stderr_text.find("barge: "), std::string::npos) << r.output;
    json error = ErrorOf(r.stdout_text);
    EXPECT_EQ(error.value("exit_code", -1), r.exit_code) << r.output;
    for (const json& e : testing::Events(r.stdout_text)) EXPECT_NE(e["event"], "result") << r.output;
    return r;
  }

  // Host offset of the first stored cluster of the given kind (barge map).
  struct Stored {
    uint64_t guest = 0;
    uint64_t host = 0;
  };
  Stored FirstStored(bool compressed) {
    json map = testing::RunResult(Barge("map --json " + ShellQuote(image_)))["extents"];
    for (const auto& e : map) {
      if (e.value("data", false) && e.value("compressed", false) == compressed) {
        return {e["start"].get<uint64_t>(), e.value("offset", uint64_t{0})};
      }
    }
    ADD_FAILURE() << "no " << (compressed ? "compressed" : "raw") << " cluster in " << map.dump();
    return {};
  }

  // The host offset of the image's first L2 table (l1_table_offset at 40,
  // then L1 entry 0: guest offsets below 512 MiB).
  uint64_t FirstL2() const { return ReadBe64(image_, ReadBe64(image_, 40)) & 0x00fffffffffffe00ull; }

  // The first compressed cluster, its host offset read from its L2 entry
  // (map gives none for compressed clusters, as qemu-img). Compressed entry
  // (cluster_bits 16): bit 62 set, host offset in bits 0..53
  // (docs/formats/qcow2.md). Use under ASSERT_NO_FATAL_FAILURE.
  void FirstCompressed(Stored* c) {
    *c = FirstStored(/*compressed=*/true);
    ASSERT_GE(c->guest, 4 * kMiB);
    uint64_t entry = ReadBe64(image_, FirstL2() + 8 * (c->guest / kCluster));
    ASSERT_TRUE(entry & (1ull << 62)) << std::hex << entry;
    c->host = entry & ((1ull << 54) - 1);
  }

  TempDir dir_;
  std::string disk_, image_, manifest_, digests_, chain_;
};

TEST_F(BackupCorruptionTest, FlippedByteInRawCluster) {
  // Cluster 5 of the random part, byte 1000 inside it.
  Stored first = FirstStored(/*compressed=*/false);
  uint64_t guest = first.guest + 5 * kCluster;
  // Map entries merge contiguous clusters: the host offset follows.
  FlipByte(image_, first.host + 5 * kCluster + 1000, 0x80);
  // qemu sees different guest bytes; only our digests can tell.
  EXPECT_EQ(testing::Run("qemu-img check " + ShellQuote(image_)).exit_code, 0);
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find("guest offset " + Hex(guest)), std::string::npos) << r.output;
  EXPECT_EQ(ErrorOf(r.stdout_text).value("offset", ~0ull), guest) << r.output;
  // Restore refuses too, and leaves no output file.
  CommandResult restore = testing::Run(Barge("restore " + ShellQuote(chain_) + " --to " + ShellQuote(dir_ / "out.raw")));
  EXPECT_NE(restore.exit_code, 0) << restore.output;
  EXPECT_NE(restore.output.find(Hex(guest)), std::string::npos) << restore.output;
  EXPECT_FALSE(fs::exists(dir_ / "out.raw"));
}

TEST_F(BackupCorruptionTest, FlippedByteInCompressedCluster) {
  Stored c;
  ASSERT_NO_FATAL_FAILURE(FirstCompressed(&c));
  // Inside the compressed payload (past the zstd frame header).
  FlipByte(image_, c.host + 100, 0x10);
  CommandResult r = VerifyFails();
  EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << r.output;  // a failure, not a crash
  // The first compressed cluster is the one named, whether zstd refuses the
  // payload or decodes it to wrong bytes.
  EXPECT_NE(r.output.find(Hex(c.guest)), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Corruption"), std::string::npos) << r.output;
}

// Issue 18: a compressed cluster whose zstd frame does not decode was
// reported at the payload's host offset in the file; it is named like a
// damaged uncompressed cluster: by its guest offset and the layer file that
// holds it, also when a later point of the chain is read through it.
TEST_F(BackupCorruptionTest, UndecodableZstdClusterNamesGuestOffsetAndLayer) {
  // A second point on top (one random cluster changed, the compressed part
  // untouched), whose restore reads the damaged cluster from the first.
  const std::string extents = dir_ / "extents.json";
  testing::WriteExtentsFile(extents, {{0, kCluster}}, 16 * kMiB);
  json second = testing::RunResult(Barge("backup --source " + ShellQuote(disk_) + " --target " +
                                         ShellQuote(dir_ / "b") + " --incremental --dirty-extents " +
                                         ShellQuote(extents) + " --json"));
  ASSERT_NE(second.value("image", ""), image_);
  Stored c;
  ASSERT_NO_FATAL_FAILURE(FirstCompressed(&c));
  ASSERT_EQ(ReadBe64(image_, c.host) >> 32, 0x28b52ffdu);  // the zstd frame magic
  FlipByte(image_, c.host, 0xff);  // no frame any more: zstd refuses it
  const std::string where = "guest offset " + Hex(c.guest);
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find(where), std::string::npos) << r.output;
  json error = ErrorOf(r.stdout_text);
  EXPECT_EQ(error.value("offset", ~0ull), c.guest) << r.output;
  EXPECT_EQ(error.value("file", ""), image_) << r.output;
  // Restore of the latest point reads through the second image: the error
  // names the first, where the damage is.
  CommandResult restore = testing::Run(Barge("restore --json " + ShellQuote(chain_) + " --to " +
                                             ShellQuote(dir_ / "out.raw")));
  EXPECT_EQ(restore.exit_code, 2) << restore.output;
  EXPECT_NE(restore.output.find(where), std::string::npos) << restore.output;
  EXPECT_EQ(ErrorOf(restore.stdout_text).value("file", ""), image_) << restore.output;
  EXPECT_EQ(ErrorOf(restore.stdout_text).value("offset", ~0ull), c.guest) << restore.output;
  EXPECT_FALSE(fs::exists(dir_ / "out.raw"));
}

TEST_F(BackupCorruptionTest, FlippedL2Entry) {
  uint64_t l2 = FirstL2();
  ASSERT_NE(l2, 0u);
  // Entry of cluster 0 (random data): move its host offset by 0x10000 * 256.
  FlipByte(image_, l2 + 5, 0x01);
  EXPECT_NE(testing::Run("qemu-img check " + ShellQuote(image_)).exit_code, 0) << "qemu-img must agree";
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find(fs::path(image_).filename().string()), std::string::npos) << r.output;
}

// Issue 18: a reserved bit in an L2 entry: qemu-img check reports a
// corruption (exit 2); barge check said "No errors were found" and verify
// "structure OK".
TEST_F(BackupCorruptionTest, ReservedBitInL2Entry) {
  uint64_t l2 = FirstL2();
  ASSERT_NE(ReadBe64(image_, l2), 0u);  // cluster 0 (random data) is stored
  FlipByte(image_, l2 + 7, 0x02);       // bit 1: reserved
  EXPECT_EQ(testing::Run("qemu-img check " + ShellQuote(image_)).exit_code, 2);
  CommandResult check = testing::Run(Barge("check " + ShellQuote(image_)));
  EXPECT_EQ(check.exit_code, 2) << check.output;
  EXPECT_NE(check.output.find("reserved bits"), std::string::npos) << check.output;
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find("structure check failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("reserved bits"), std::string::npos) << r.output;
}

TEST_F(BackupCorruptionTest, FlippedRefcount) {
  uint64_t table = ReadBe64(image_, 48);  // refcount_table_offset
  uint64_t block = ReadBe64(image_, table);
  ASSERT_NE(block, 0u);
  FlipByte(image_, block + 1, 0x01);  // the header cluster's refcount (any order)
  EXPECT_NE(testing::Run("qemu-img check " + ShellQuote(image_)).exit_code, 0) << "qemu-img must agree";
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find("structure check failed"), std::string::npos) << r.output;
}

TEST_F(BackupCorruptionTest, FlippedHeaderMagic) {
  FlipByte(image_, 0, 0x20);
  CommandResult r = VerifyFails();
  EXPECT_NE(r.output.find(fs::path(image_).filename().string()), std::string::npos) << r.output;
}

TEST_F(BackupCorruptionTest, FlippedHeaderClusterBits) {
  FlipByte(image_, 23, 0x01);  // cluster_bits 16 -> 17
  CommandResult r = VerifyFails();
  EXPECT_NE(r.output.find(fs::path(image_).filename().string()), std::string::npos) << r.output;
}

TEST_F(BackupCorruptionTest, FlippedByteInManifest) {
  // In the recorded image digest: the chain no longer adds up.
  std::string text = testing::Run("cat " + ShellQuote(manifest_)).output;
  size_t at = text.find("\"value\"");
  ASSERT_NE(at, std::string::npos) << text;
  FlipByte(manifest_, text.find('"', at + 8) + 5, 0x01);  // a hex digit becomes another
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find("image digest"), std::string::npos) << r.output;
}

TEST_F(BackupCorruptionTest, BrokenManifestJson) {
  FlipByte(manifest_, 0, '{' ^ '[');  // the object becomes an array
  CommandResult r = VerifyFails();
  EXPECT_NE(r.output.find(".json"), std::string::npos) << "names the manifest: " << r.output;
}

TEST_F(BackupCorruptionTest, FlippedByteInDigestTable) {
  FlipByte(digests_, 32 + 24 + 9, 0x04);  // digest of the second entry
  CommandResult r = VerifyFails(2);
  EXPECT_NE(r.output.find(".digests"), std::string::npos) << r.output;
}

TEST_F(BackupCorruptionTest, TruncatedImage) {
  for (uint64_t size : {fs::file_size(image_) / 2, uint64_t{100}}) {
    SCOPED_TRACE(size);
    fs::resize_file(image_, size);
    CommandResult r = VerifyFails();
    EXPECT_NE(r.output.find(fs::path(image_).filename().string()), std::string::npos) << r.output;
  }
}

TEST_F(BackupCorruptionTest, MissingImage) {
  fs::remove(image_);
  CommandResult r = VerifyFails(2);  // a broken chain: damage to the backup (docs/errors.md)
  EXPECT_NE(r.output.find(fs::path(image_).filename().string()), std::string::npos) << r.output;
}

}  // namespace
}  // namespace barge
