// `image add --source -` (issue 39): an image uploaded on standard input,
// piped through the real barge binary, is checked and committed as a file
// would be: qcow2 or raw as its first bytes say (the copy named .qcow2 or
// .raw), its SHA-512 checked, staged privately beside the catalog and
// nothing left there; a short stream (fewer bytes than --size, a qcow2 cut
// short of its tables), an empty one and a checksum mismatch are errors
// that leave no ready copy and no file.
#include <algorithm>
#include <filesystem>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

using nlohmann::json;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::Has;
using ::barge::testing::Q;
using ::barge::testing::Sh;
using ::barge::testing::TempDir;

class ImageUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    // An 8 MiB qcow2 with data in three places and its raw twin.
    testing::RunOk("cd " + Q(src_.path().string()) + " && qemu-img create -q -f qcow2 disk.qcow2 8M && qemu-io -f "
                   "qcow2 -c 'write -P 0xab 0 1M' -c 'write -P 0x17 3M 512k' -c 'write -P 0x42 7M 64k' disk.qcow2 "
                   ">/dev/null && qemu-img convert -O raw disk.qcow2 disk.raw");
    sha_ = testing::RunOk("sha512sum " + Q(src_ / "disk.raw") + " | cut -d' ' -f1").substr(0, 128);
  }

  // `image add NAME --source - ...` with `feed` (a shell command) piped in.
  CommandResult Upload(const std::string& feed, const std::string& name, const std::string& flags = "") {
    return Sh(feed + " | " + Barge("image add " + name + " --source - --disk " + Q(disk_) + " --catalog " +
                                   Q(catalog_) + " " + flags));
  }

  // Nothing of a staged upload is left beside the catalog.
  void ExpectNoStaging() {
    for (const auto& e : std::filesystem::directory_iterator(cat_dir_.path())) {
      const std::string name = e.path().filename().string();
      EXPECT_TRUE(name.starts_with("catalog.db") || name.starts_with(".barge-lock") || name == "locks")
          << "left beside the catalog: " << name;
    }
  }

  // The failed upload of image `name`: no row, no copy file, no temporary.
  void ExpectNothingOf(const std::string& name) {
    CommandResult s = Sh(Barge("image status --json --catalog " + Q(catalog_)));
    EXPECT_FALSE(Has(s.stdout_text, "\"" + name + "\"")) << s.output;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(disk_, ec)) {
      EXPECT_FALSE(e.path().filename().string().starts_with(name)) << "left: " << e.path();
      EXPECT_FALSE(e.path().filename().string().starts_with("." + name)) << "left: " << e.path();
    }
    ExpectNoStaging();
  }

  TempDir src_, dir_, cat_dir_;
  const std::string disk_ = dir_ / "disk1";
  const std::string catalog_ = cat_dir_ / "catalog.db";
  std::string sha_;
};

TEST_F(ImageUploadTest, AQcow2AndARawOnStandardInputBecomeReadyCopiesNamedByTheirFormat) {
  CommandResult q = Upload("cat " + Q(src_ / "disk.qcow2"), "base", "--expected-sha512 " + sha_);
  ASSERT_EQ(q.exit_code, 0) << q.output;
  EXPECT_EQ(testing::RunOk("head -c 3 " + Q(disk_ + "/base.qcow2")), "QFI");  // a qcow2 copy
  EXPECT_EQ(Sh("qemu-img compare " + Q(src_ / "disk.raw") + " " + Q(disk_ + "/base.qcow2")).exit_code, 0);

  const std::string size = std::to_string(std::filesystem::file_size(src_ / "disk.raw"));
  CommandResult r = Upload("cat " + Q(src_ / "disk.raw"), "flat", "--size " + size + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Sh("cmp " + Q(src_ / "disk.raw") + " " + Q(disk_ + "/flat.raw")).exit_code, 0);

  const json status = testing::RunResult(Barge("image status --json --catalog " + Q(catalog_)));
  ASSERT_EQ(status["images"].size(), 2u) << status.dump();
  for (const auto& im : status["images"]) {
    EXPECT_EQ(im["source"], "-") << status.dump();
    EXPECT_EQ(im["sha512"], sha_) << status.dump();
    EXPECT_EQ(im["copies"][0]["state"], "ready") << status.dump();
  }
  // Delivered to another disk from the ready copy, under the same name.
  const std::string disk2 = dir_ / "disk2";
  testing::RunOk(Barge("image sync base --disks " + Q(disk2) + " --catalog " + Q(catalog_)));
  EXPECT_TRUE(std::filesystem::exists(disk2 + "/base.qcow2"));
  ExpectNoStaging();
}

TEST_F(ImageUploadTest, AShortStreamIsAnErrorNeverAShortImage) {
  const uint64_t full = std::filesystem::file_size(src_ / "disk.raw");
  CommandResult r = Upload("head -c 1000000 " + Q(src_ / "disk.raw"), "short", "--size " + std::to_string(full));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "barge: IoError: standard input: the stream ended after 1000000 of the")) << r.output;
  EXPECT_EQ(std::count(r.stderr_text.begin(), r.stderr_text.end(), '\n'), 1) << r.stderr_text;
  ExpectNothingOf("short");

  // Longer than declared: as wrong.
  r = Upload("cat " + Q(src_ / "disk.raw"), "long", "--size 4096");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "longer than the 4096 bytes --size declared")) << r.output;
  ExpectNothingOf("long");

  // A qcow2 cut short: its data clusters lie past the stream's end.
  const uint64_t qsize = std::filesystem::file_size(src_ / "disk.qcow2");
  r = Upload("head -c " + std::to_string(qsize / 2) + " " + Q(src_ / "disk.qcow2"), "cut");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.stderr_text.starts_with("barge: ")) << r.output;
  ExpectNothingOf("cut");

  r = Upload("true", "empty");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "empty")) << r.output;
  ExpectNothingOf("empty");
}

TEST_F(ImageUploadTest, AChecksumMismatchLeavesNothingReady) {
  CommandResult r = Upload("cat " + Q(src_ / "disk.qcow2"), "base", "--expected-sha512 " + std::string(128, '0'));
  EXPECT_NE(r.exit_code, 0) << r.output;
  ExpectNothingOf("base");
}

TEST_F(ImageUploadTest, SizeIsForUploadsOnly) {
  CommandResult r = Sh(Barge("image add base --source " + Q(src_ / "disk.raw") + " --size 10 --disk " + Q(disk_) +
                             " --catalog " + Q(catalog_)));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "--size")) << r.output;
}

}  // namespace
}  // namespace barge
