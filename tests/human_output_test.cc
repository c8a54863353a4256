// Readable text output: sizes human-readable (also in error messages),
// dates RFC 3339, durations to 3 significant digits, digests naming their
// algorithm, and a map legend that explains every column.
#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

using testing::Barge;
using testing::Q;
using testing::RunOk;
using testing::Sh;
using testing::TempDir;

// `pattern` (a regular expression) matches somewhere in `text`.
bool Matches(const std::string& text, const std::string& pattern) {
  return std::regex_search(text, std::regex(pattern));
}

// Every "<number> s" in `text` has at most 3 significant digits.
void ExpectThreeDigitSeconds(const std::string& text) {
  const std::regex seconds(R"(([0-9]+(\.[0-9]+)?) s\b)");
  int found = 0;
  for (std::sregex_iterator it(text.begin(), text.end(), seconds), end; it != end; ++it, ++found) {
    std::string digits;
    for (char c : (*it)[1].str()) {
      if (c != '.') digits += c;
    }
    digits.erase(0, digits.find_first_not_of('0'));
    EXPECT_LE(digits.size(), 3u) << (*it)[0] << " in\n" << text;
  }
  EXPECT_GT(found, 0) << text;
}

class HumanOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    img_ = dir_ / "disk.qcow2";
    RunOk("qemu-img create -q -f qcow2 " + Q(img_) + " 8M");
    RunOk("qemu-io -f qcow2 -c 'write -P 0xaa 0 1M' " + Q(img_));
  }
  TempDir dir_;
  std::string img_;
};

TEST_F(HumanOutputTest, InfoShowsSnapshotDatesAsRfc3339AndGranularityAsASize) {
  RunOk("qemu-img snapshot -c before " + Q(img_));
  RunOk("qemu-img bitmap --add -g 65536 " + Q(img_) + " cbt0");
  RunOk("qemu-img bitmap --add -g 4096 --disable " + Q(img_) + " frozen");
  std::string info = RunOk(Barge() + " info " + Q(img_));
  EXPECT_TRUE(Matches(info, R"(before +vm state 0 B +date 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ)")) << info;
  EXPECT_NE(info.find("cbt0: granularity 64 KiB, enabled"), std::string::npos) << info;
  EXPECT_NE(info.find("frozen: granularity 4 KiB, disabled"), std::string::npos) << info;
  EXPECT_NE(info.find("virtual size: 8 MiB (8388608 bytes)"), std::string::npos) << info;
  std::string list = RunOk(Barge() + " bitmap list " + Q(img_));
  EXPECT_NE(list.find("cbt0  granularity 64 KiB  enabled"), std::string::npos) << list;
}

TEST_F(HumanOutputTest, DurationsDigestsAndSizesInMessages) {
  const std::string chain = dir_ / "bk/vda";
  std::string backup = RunOk(Barge() + " backup --source " + Q(img_) + " --target " + Q(dir_ / "bk") + " --name vda");
  ExpectThreeDigitSeconds(backup);
  EXPECT_TRUE(Matches(backup, R"(digest: +xxh3-128:[0-9a-f]{32})")) << backup;
  std::string restore = RunOk(Barge() + " restore " + Q(chain) + " --to " + Q(dir_ / "r.raw"));
  EXPECT_TRUE(Matches(restore, R"(image digest xxh3-128:[0-9a-f]{32} in [0-9.]+ (s|min))")) << restore;
  ExpectThreeDigitSeconds(restore);
  std::string verify = RunOk(Barge() + " verify " + Q(chain));
  EXPECT_NE(verify.find("cluster digests (xxh3-128)"), std::string::npos) << verify;
  ExpectThreeDigitSeconds(verify);
  std::string convert = RunOk(Barge() + " convert " + Q(img_) + " " + Q(dir_ / "c.raw"));
  EXPECT_TRUE(Matches(convert, R"(image digest xxh3-128:[0-9a-f]{32})")) << convert;

  // Sizes in error messages: readable, with the exact count.
  RunOk("qemu-img create -q -f raw " + Q(dir_ / "small.raw") + " 1M");
  auto against = Sh(Barge() + " verify " + Q(chain) + " --against " + Q(dir_ / "small.raw"));
  EXPECT_EQ(against.exit_code, 2) << against.output;  // a mismatch (issue 18), named as the source's
  EXPECT_NE(against.output.find("the source has 1 MiB (1048576 bytes), the backup 8 MiB (8388608 bytes)"),
            std::string::npos)
      << against.output;
  RunOk("qemu-img resize -q -f qcow2 " + Q(img_) + " 16M");
  auto grown = Sh(Barge() + " backup --source " + Q(img_) + " --target " + Q(dir_ / "bk") +
                  " --name vda --incremental --dirty-extents /dev/null");
  EXPECT_NE(grown.exit_code, 0);
  EXPECT_NE(grown.output.find("8 MiB (8388608 bytes) to 16 MiB (16777216 bytes)"), std::string::npos)
      << grown.output;
  std::string compare = Sh(Barge() + " compare -s " + Q(img_) + " " + Q(dir_ / "small.raw")).output;
  EXPECT_NE(compare.find("Image size mismatch: 16 MiB (16777216 bytes) vs 1 MiB (1048576 bytes)"),
            std::string::npos)
      << compare;
}

TEST_F(HumanOutputTest, MapLegendExplainsEveryColumn) {
  RunOk("qemu-io -f qcow2 -c 'write -z 2M 64k' " + Q(img_));
  std::string map = RunOk(Barge() + " map " + Q(img_));
  EXPECT_TRUE(Matches(map, R"(0x0 +0x100000 +data +0 +)" + std::regex_replace(img_, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)")))
      << map;
  EXPECT_TRUE(Matches(map, R"(0x200000 +0x10000 +zero +0 )")) << map;
  EXPECT_TRUE(Matches(map, R"(0x100000 +0x100000 +hole +0 +-\n)")) << map;
  for (const char* word : {"Offset, Length: guest bytes, in hex", "data/z = stored compressed", "zero = reads as zeros",
                           "hole = allocated in no layer", "Depth:", "File:"}) {
    EXPECT_NE(map.find(word), std::string::npos) << word << "\n" << map;
  }
}

}  // namespace
}  // namespace barge
