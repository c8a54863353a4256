// barge convert through the real binary: raw and qcow2 outputs judged by
// qemu-img, --no-sync giving the same bytes, and an existing output refused
// without --force.
#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace barge::testing
