// barge bitmap add|remove|clear|enable|disable judged by qemu-img: after
// every command qemu-img check is clean and qemu-img info shows the bitmaps
// as barge says; barge reads qemu-img's edits the same way; the image lock
// keeps barge off an image QEMU has open; and the offline CBT rotation of
// the README (incremental, then clear) works end to end.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

using testing::Barge;
using testing::ErrorOf;
using testing::Q;
using testing::RunOk;
using testing::RunResult;
using testing::Sh;
using testing::TempDir;

void ExpectQemuClean(const std::string& image) {
  auto r = Sh("qemu-img check -f qcow2 --output=json " + Q(image));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')), nullptr, false);
  EXPECT_EQ(j.value("leaks", 0), 0) << r.output;
  EXPECT_EQ(j.value("corruptions", 0), 0) << r.output;
}

// name -> "granularity flag,flag" as qemu-img info reports them.
using Bitmaps = std::map<std::string, std::string>;

Bitmaps QemuBitmaps(const std::string& image) {
  std::string out = RunOk("qemu-img info -f qcow2 --output=json " + Q(image));
  auto info = nlohmann::json::parse(out.substr(out.find('{')), nullptr, false);
  Bitmaps b;
  const auto& data = info["format-specific"]["data"];
  if (!data.contains("bitmaps")) return b;
  for (const auto& e : data["bitmaps"]) {
    std::string flags;
    for (const auto& f : e["flags"]) flags += (flags.empty() ? "" : ",") + f.get<std::string>();
    b[e["name"].get<std::string>()] = std::to_string(e["granularity"].get<uint64_t>()) + " " + flags;
  }
  return b;
}

// The same from `barge bitmap list --json`, in qemu's notation.
Bitmaps BargeBitmaps(const std::string& image) {
  auto j = RunResult(Barge() + " bitmap list --json " + Q(image));
  Bitmaps b;
  for (const auto& e : j["bitmaps"]) {
    std::string flags = e["in_use"].get<bool>() ? "in-use" : "";
    if (e["enabled"].get<bool>()) flags += std::string(flags.empty() ? "" : ",") + "auto";
    b[e["name"].get<std::string>()] = std::to_string(e["granularity"].get<uint64_t>()) + " " + flags;
  }
  return b;
}

// Dirty ranges of one bitmap as "offset+length" strings, read by barge.
std::vector<std::string> Dirty(const std::string& image, const std::string& bitmap) {
  auto j = RunResult(Barge() + " bitmap dump --json " + Q(image) + " " + Q(bitmap));
  std::vector<std::string> out;
  for (const auto& r : j["dirty"]) {
    out.push_back(std::to_string(r["offset"].get<uint64_t>()) + "+" + std::to_string(r["length"].get<uint64_t>()));
  }
  return out;
}

void QemuIo(const std::string& image, const std::string& commands) {
  RunOk("qemu-io -f qcow2 " + commands + " " + Q(image));
}

class BitmapCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    img_ = dir_ / "disk.qcow2";
    RunOk("qemu-img create -q -f qcow2 " + Q(img_) + " 16M");
    QemuIo(img_, "-c 'write -P 0xaa 0 2M' -c 'write -P 0xbb 9M 300k'");
  }
  // Guest bytes stay what they were through every bitmap edit.
  void SaveGuest() { RunOk("qemu-img convert -f qcow2 -O raw " + Q(img_) + " " + Q(dir_ / "guest.raw")); }
  void ExpectGuestUnchanged() { RunOk("qemu-img compare -f qcow2 -F raw " + Q(img_) + " " + Q(dir_ / "guest.raw")); }

  TempDir dir_;
  std::string img_;
};

TEST_F(BitmapCliTest, EveryOperationAsQemuImgSeesIt) {
  SaveGuest();
  auto add = RunResult(Barge() + " bitmap add --json " + Q(img_) + " cbt0");
  EXPECT_EQ(add["action"], "add");
  EXPECT_EQ(add["names"], nlohmann::json::array({"cbt0"}));
  EXPECT_TRUE(add["changed"].get<bool>());
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt0", "65536 auto"}}));

  std::string text = RunOk(Barge() + " bitmap add -g 4K --disabled " + Q(img_) + " frozen spare");
  EXPECT_NE(text.find("added bitmap frozen to " + img_ + " (granularity 4 KiB, disabled)"), std::string::npos) << text;
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt0", "65536 auto"}, {"frozen", "4096 "}, {"spare", "4096 "}}));

  // qemu's writes land in the enabled bitmap only; barge reads them.
  QemuIo(img_, "-c 'write -P 0xcc 1M 64k' -c 'write -z 12M 64k'");
  EXPECT_EQ(Dirty(img_, "cbt0"), (std::vector<std::string>{"1048576+65536", "12582912+65536"}));
  EXPECT_TRUE(Dirty(img_, "frozen").empty());
  SaveGuest();

  auto clear = RunResult(Barge() + " bitmap clear --json " + Q(img_) + " cbt0");
  EXPECT_EQ(clear["action"], "clear");
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt0", "65536 auto"}, {"frozen", "4096 "}, {"spare", "4096 "}}));
  EXPECT_TRUE(Dirty(img_, "cbt0").empty());
  ExpectGuestUnchanged();

  RunOk(Barge() + " bitmap enable " + Q(img_) + " frozen");
  RunOk(Barge() + " bitmap disable " + Q(img_) + " cbt0");
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt0", "65536 "}, {"frozen", "4096 auto"}, {"spare", "4096 "}}));
  QemuIo(img_, "-c 'write -P 0xdd 3M 4k'");
  EXPECT_TRUE(Dirty(img_, "cbt0").empty());
  EXPECT_EQ(Dirty(img_, "frozen"), (std::vector<std::string>{"3145728+4096"}));

  // Enabling an enabled bitmap changes nothing, and says so.
  auto again = RunResult(Barge() + " bitmap enable --json " + Q(img_) + " frozen");
  EXPECT_FALSE(again["changed"].get<bool>());
  EXPECT_NE(RunOk(Barge() + " bitmap enable " + Q(img_) + " frozen").find("already enabled"), std::string::npos);

  auto removed = RunResult(Barge() + " bitmap remove --json " + Q(img_) + " spare frozen");
  ASSERT_EQ(removed["bitmaps"].size(), 1u);
  EXPECT_EQ(removed["bitmaps"][0]["name"], "cbt0");
  EXPECT_FALSE(removed["bitmaps"][0]["enabled"].get<bool>());
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt0", "65536 "}}));
  RunOk(Barge() + " bitmap remove " + Q(img_) + " cbt0");
  ExpectQemuClean(img_);
  EXPECT_TRUE(QemuBitmaps(img_).empty());
  // qemu keeps working on what barge left.
  RunOk("qemu-img bitmap --add " + Q(img_) + " after");
  ExpectQemuClean(img_);
}

TEST_F(BitmapCliTest, BargeReadsQemuImgEditsTheSame) {
  RunOk("qemu-img bitmap --add -g 65536 " + Q(img_) + " a");
  RunOk("qemu-img bitmap --add -g 512 --disable " + Q(img_) + " b");
  EXPECT_EQ(BargeBitmaps(img_), QemuBitmaps(img_));
  QemuIo(img_, "-c 'write -P 0x11 5M 128k'");
  RunOk("qemu-img bitmap --disable " + Q(img_) + " a");
  RunOk("qemu-img bitmap --enable " + Q(img_) + " b");
  EXPECT_EQ(BargeBitmaps(img_), QemuBitmaps(img_));
  EXPECT_EQ(Dirty(img_, "a"), (std::vector<std::string>{"5242880+131072"}));
  RunOk("qemu-img bitmap --clear " + Q(img_) + " a");
  EXPECT_TRUE(Dirty(img_, "a").empty());
  // And the other way round: barge's edits, then qemu-img's on top.
  RunOk(Barge() + " bitmap enable " + Q(img_) + " a");
  RunOk("qemu-img bitmap --remove " + Q(img_) + " b");
  EXPECT_EQ(BargeBitmaps(img_), (Bitmaps{{"a", "65536 auto"}}));
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"a", "65536 auto"}}));
  ExpectQemuClean(img_);
}

TEST_F(BitmapCliTest, DefaultGranularityIsQemuImgs) {
  for (const char* cluster : {"512", "4k", "64k", "2M"}) {
    SCOPED_TRACE(cluster);
    const std::string img = dir_ / (std::string("c") + cluster + ".qcow2");
    RunOk("qemu-img create -q -f qcow2 -o cluster_size=" + std::string(cluster) + " " + Q(img) + " 8M");
    RunOk("qemu-img bitmap --add " + Q(img) + " by_qemu");
    RunOk(Barge() + " bitmap add " + Q(img) + " by_barge");
    Bitmaps b = QemuBitmaps(img);
    EXPECT_EQ(b["by_barge"], b["by_qemu"]);
    ExpectQemuClean(img);
  }
}

TEST_F(BitmapCliTest, RefusedWhileQemuHasTheImageOpen) {
  BARGE_REQUIRE_TOOL("qemu-nbd");
  RunOk(Barge() + " bitmap add " + Q(img_) + " cbt0");
  {
    testing::SocketServer nbd("qemu-nbd -f qcow2 --socket=" + Q(dir_ / "nbd.sock") + " " + Q(img_),
                              dir_ / "nbd.sock");
    ASSERT_TRUE(nbd.WaitReady());
    for (const char* edit : {"clear", "remove", "disable"}) {
      auto r = Sh(Barge() + " bitmap " + edit + " --json " + Q(img_) + " cbt0");
      EXPECT_EQ(r.exit_code, 4) << edit << ": " << r.output;
      auto error = ErrorOf(r.stdout_text);
      EXPECT_EQ(error["code"], "Busy") << r.output;
      EXPECT_NE(error.value("message", "").find("qemu-nbd"), std::string::npos) << r.output;
    }
    auto r = Sh(Barge() + " bitmap add " + Q(img_) + " other");
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("barge: Busy: " + img_), std::string::npos) << r.output;
  }
  // Nothing of barge's reached the file (qemu-nbd saved its bitmaps on exit).
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt0", "65536 auto"}}));
}

TEST_F(BitmapCliTest, MistakesAreRefusedWithoutWriting) {
  RunOk(Barge() + " bitmap add " + Q(img_) + " cbt0");
  const std::string before = RunOk("md5sum < " + Q(img_));
  auto missing = Sh(Barge() + " bitmap clear --json " + Q(img_) + " nope");
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_EQ(ErrorOf(missing.stdout_text)["code"], "NotFound");
  EXPECT_EQ(Sh(Barge() + " bitmap add " + Q(img_) + " cbt0").exit_code, 1);          // exists
  EXPECT_EQ(Sh(Barge() + " bitmap add -g 1000 " + Q(img_) + " x").exit_code, 64);    // not a power of two
  EXPECT_EQ(Sh(Barge() + " bitmap add -g 256 " + Q(img_) + " x").exit_code, 64);     // below 512
  EXPECT_EQ(Sh(Barge() + " bitmap remove " + Q(img_)).exit_code, 64);                // no name
  EXPECT_EQ(Sh(Barge() + " bitmap remove " + Q(img_) + " cbt0 cbt0").exit_code, 1);  // twice
  EXPECT_EQ(RunOk("md5sum < " + Q(img_)), before);
  // A raw file has no bitmaps: the error says what to do instead.
  RunOk("qemu-img create -q -f raw " + Q(dir_ / "disk.raw") + " 1M");
  auto raw = Sh(Barge() + " bitmap add " + Q(dir_ / "disk.raw") + " cbt0");
  EXPECT_EQ(raw.exit_code, 1) << raw.output;
  EXPECT_NE(raw.output.find("not a qcow2 image"), std::string::npos) << raw.output;
  auto gone = Sh(Barge() + " bitmap add " + Q(dir_ / "absent.qcow2") + " cbt0");
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
  EXPECT_NE(gone.output.find("absent.qcow2"), std::string::npos) << gone.output;
}

// The README's offline rotation: an incremental from cbt0, then
// `bitmap clear cbt0` starts the next tracking period; the next incremental
// holds only what changed after the clear, and every point restores.
TEST_F(BitmapCliTest, OfflineTrackingPeriodRotation) {
  const std::string target = dir_ / "bk";
  RunOk(Barge() + " bitmap add " + Q(img_) + " cbt0");
  RunOk(Barge() + " backup --source " + Q(img_) + " --target " + Q(target) + " --name vda");
  RunOk("qemu-img convert -f qcow2 -O raw " + Q(img_) + " " + Q(dir_ / "p0.raw"));
  QemuIo(img_, "-c 'write -P 0x21 4M 1M'");
  auto first = RunResult(Barge() + " backup --json --source " + Q(img_) + " --target " + Q(target) +
                         " --name vda --incremental --dirty-bitmap cbt0");
  EXPECT_EQ(first["dirty_bytes"], 1 << 20);
  RunOk("qemu-img convert -f qcow2 -O raw " + Q(img_) + " " + Q(dir_ / "p1.raw"));
  RunOk(Barge() + " bitmap clear " + Q(img_) + " cbt0");
  QemuIo(img_, "-c 'write -P 0x22 14M 64k'");
  auto second = RunResult(Barge() + " backup --json --source " + Q(img_) + " --target " + Q(target) +
                          " --name vda --incremental --dirty-bitmap cbt0");
  EXPECT_EQ(second["dirty_bytes"], 64 << 10);
  RunOk("qemu-img convert -f qcow2 -O raw " + Q(img_) + " " + Q(dir_ / "p2.raw"));
  for (int k = 0; k < 3; ++k) {
    const std::string out = dir_ / ("r" + std::to_string(k) + ".raw");
    RunOk(Barge() + " restore " + Q(target + "/vda") + " --at " + std::to_string(k) + " --to " + Q(out));
    RunOk("cmp " + Q(out) + " " + Q(dir_ / ("p" + std::to_string(k) + ".raw")));
  }
  // remove + add is the other way to rotate.
  RunOk(Barge() + " bitmap remove " + Q(img_) + " cbt0");
  RunOk(Barge() + " bitmap add " + Q(img_) + " cbt1");
  ExpectQemuClean(img_);
  EXPECT_EQ(QemuBitmaps(img_), (Bitmaps{{"cbt1", "65536 auto"}}));
}

}  // namespace
}  // namespace barge
