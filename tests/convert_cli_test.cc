// barge convert through the real binary: raw and qcow2 outputs judged by
// qemu-img, --no-sync giving the same bytes, an existing output refused
// without --force, and --backing storing only what differs from the backing.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;

class ConvertCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    src_ = dir_ / "src.raw";
    // Data, a hole and a zero run: every path of the copy.
    std::vector<std::byte> bytes = RandomBytes(12 * kMiB, 7);
    std::fill(bytes.begin() + 3 * kMiB, bytes.begin() + 6 * kMiB, std::byte{0});
    WriteFile(src_, bytes);
    RunOk("fallocate -p -o " + std::to_string(8 * kMiB) + " -l " + std::to_string(2 * kMiB) + " " +
          ShellQuote(src_));
  }
  std::string Convert(const std::string& args) {
    return RunOk(ShellQuote(BargeBinary()) + " convert -f raw " + ShellQuote(src_) + " " + args);
  }

  TempDir dir_;
  std::string src_;
};

TEST_F(ConvertCliTest, RawWithAndWithoutSyncIsIdentical) {
  for (const char* extra : {"", " --no-sync"}) {
    std::string out = dir_ / "out.raw";
    Convert(ShellQuote(out) + " -O raw" + extra);
    RunOk("cmp " + ShellQuote(src_) + " " + ShellQuote(out));
    EXPECT_FALSE(fs::exists(dir_ / ".out.raw.barge-tmp"));
    fs::remove(out);
  }
}

TEST_F(ConvertCliTest, Qcow2ZstdPassesQemuImgChecks) {
  std::string out = dir_ / "out.qcow2";
  Convert(ShellQuote(out) + " -O qcow2 --compress zstd");
  RunOk("qemu-img check -q " + ShellQuote(out));
  RunOk("qemu-img compare -q -F raw " + ShellQuote(out) + " " + ShellQuote(src_));
  std::string info = RunOk("qemu-img info " + ShellQuote(out));
  EXPECT_NE(info.find("compression type: zstd"), std::string::npos) << info;
}

TEST_F(ConvertCliTest, ExistingOutputNeedsForce) {
  std::string out = dir_ / "out.raw";
  WriteFile(out, RandomBytes(4096, 1));
  CommandResult refused = ::barge::testing::Run(ShellQuote(BargeBinary()) + " convert -f raw " + ShellQuote(src_) + " " +
                              ShellQuote(out) + " -O raw");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("--force"), std::string::npos) << refused.output;
  EXPECT_EQ(fs::file_size(out), 4096u);
  Convert(ShellQuote(out) + " -O raw --force");
  RunOk("cmp " + ShellQuote(src_) + " " + ShellQuote(out));
}

// --backing: the overlay holds exactly the 64 KiB clusters where the source
// differs from the backing (changed data, data zeroed, data where the backing
// has a hole), reads as the source through qemu, and names the backing
// relative to itself. A backing that cannot be opened is refused.
TEST_F(ConvertCliTest, BackingStoresOnlyWhatDiffers) {
  constexpr uint64_t kCluster = 64 << 10;
  std::vector<std::byte> base = ReadFile(src_);  // data, zeros at 3-6 MiB, hole at 8-10 MiB
  std::vector<std::byte> now = base;
  auto fill = [&](uint64_t off, uint64_t len, uint8_t v) {
    std::fill_n(now.begin() + off, len, std::byte{v});
  };
  fill(0, 100, 0x11);                  // cluster 0: part of it changed
  fill(kMiB, 3 * kCluster, 0);         // clusters 16-18: data zeroed
  fill(4 * kMiB + 5, 10, 0x22);        // cluster 64: data where the base is zero
  fill(9 * kMiB, kCluster, 0x33);      // cluster 144: data where the base has a hole
  std::copy_n(RandomBytes(kCluster, 99).begin(), kCluster, now.begin() + 11 * kMiB);  // cluster 176
  fs::create_directories(std::string(dir_ / "images"));
  const std::string base_path = dir_ / "images/base.raw";
  fs::copy_file(src_, base_path);
  RunOk("fallocate -p -o " + std::to_string(8 * kMiB) + " -l " + std::to_string(2 * kMiB) + " " +
        ShellQuote(base_path));
  const std::string changed = dir_ / "changed.raw";
  WriteFile(changed, now);

  const std::string out = dir_ / "images/top.qcow2";
  RunOk(ShellQuote(BargeBinary()) + " convert -f raw " + ShellQuote(changed) + " " + ShellQuote(out) +
        " -O qcow2 --compress zstd --backing base.raw --backing-format raw");
  RunOk("qemu-img check -q " + ShellQuote(out));
  RunOk("qemu-img compare -q -F raw " + ShellQuote(out) + " " + ShellQuote(changed));
  std::string info = RunOk("qemu-img info --output=json " + ShellQuote(out));
  EXPECT_EQ(nlohmann::json::parse(info)["backing-filename"], "base.raw") << info;

  // Clusters present in the top layer (depth 0) vs the ones that differ.
  std::vector<uint64_t> differ;
  for (uint64_t c = 0; c < now.size() / kCluster; ++c) {
    if (!std::equal(now.begin() + c * kCluster, now.begin() + (c + 1) * kCluster, base.begin() + c * kCluster) ||
        (c >= 8 * kMiB / kCluster && c < 10 * kMiB / kCluster &&
         std::any_of(now.begin() + c * kCluster, now.begin() + (c + 1) * kCluster,
                     [](std::byte b) { return b != std::byte{0}; }))) {
      differ.push_back(c);
    }
  }
  EXPECT_EQ(differ, (std::vector<uint64_t>{0, 16, 17, 18, 64, 144, 176}));
  std::vector<uint64_t> stored;
  for (const auto& e : nlohmann::json::parse(RunOk("qemu-img map --output=json " + ShellQuote(out)))) {
    if (e["depth"] != 0) continue;
    for (uint64_t off = e["start"]; off < e["start"].get<uint64_t>() + e["length"].get<uint64_t>(); off += kCluster) {
      stored.push_back(off / kCluster);
    }
  }
  EXPECT_EQ(stored, differ);

  CommandResult missing = ::barge::testing::Run(ShellQuote(BargeBinary()) + " convert -f raw " + ShellQuote(changed) +
                                                " " + ShellQuote(dir_ / "top2.qcow2") +
                                                " -O qcow2 --backing nowhere.raw --backing-format raw");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("backing file 'nowhere.raw'"), std::string::npos) << missing.output;
  EXPECT_FALSE(fs::exists(dir_ / "top2.qcow2"));
}

}  // namespace
}  // namespace barge::testing
