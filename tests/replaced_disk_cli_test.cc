// Issue 36, item 1: a disk file replaced under the same path. Two same-size
// qcow2 disks whose files are swapped (or one overwritten by a copy of the
// other) keep their paths, and each file carries its own persistent
// bitmaps: an incremental took the other disk's bitmap and data into the
// chain, which then restored to neither disk while verify passed. Through
// the real binary: the sampled check of the clean clusters turns such an
// incremental into a full naming the replacement, every point restores to
// its disk's bytes, and `verify --against` names a chain already mixed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ReplacedDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveTool("qemu-img") || !HaveTool("qemu-io")) {
      if (ToolsRequired()) FAIL() << "qemu-img and qemu-io are required";
      GTEST_SKIP() << "qemu-img or qemu-io missing";
    }
    // Two disks of one size and different data, each with an enabled
    // persistent bitmap cbt0 added after its data was written.
    dir_path_ = fs::canonical(dir_.path()).string();
    a_ = dir_path_ + "/a.qcow2";
    b_ = dir_path_ + "/b.qcow2";
    for (const auto& [disk, pattern] : {std::pair{a_, "0x11"}, std::pair{b_, "0x22"}}) {
      RunOk("qemu-img create -q -f qcow2 " + Q(disk) + " 8M && qemu-io -f qcow2 -c 'write -P " + pattern +
            " 0 2M' -c 'write -P " + pattern + " 5M 1M' " + Q(disk) + " >/dev/null && qemu-img bitmap --add " +
            "--enable " + Q(disk) + " cbt0");
    }
    target_ = dir_path_ + "/t";
  }
  void Write(const std::string& disk, const std::string& pattern, const std::string& where) {
    RunOk("qemu-io -f qcow2 -c 'write -P " + pattern + " " + where + "' " + Q(disk) + " >/dev/null");
  }
  json Backup(const std::string& source, const std::string& name, const std::string& extra) {
    return RunResult(Barge("backup --json --source " + Q(source) + " --target " + Q(target_) + " --name " + name +
                           " " + extra));
  }
  // A frozen copy of `disk` now, to compare a point's restore with.
  std::string Snapshot(const std::string& disk, const std::string& as) {
    const std::string copy = dir_path_ + "/" + as + ".qcow2";
    RunOk("cp --sparse=always " + Q(disk) + " " + Q(copy));
    return copy;
  }
  // Point `position` of chain `name` restores to exactly `expected`.
  void ExpectRestoresTo(const std::string& name, size_t position, const std::string& expected) {
    std::string file = name;
    std::replace(file.begin(), file.end(), '/', '-');
    const std::string out = dir_path_ + "/restored-" + file + "-" + std::to_string(position) + ".raw";
    RunOk(Barge("restore " + Q(target_ + "/" + name) + " --at " + std::to_string(position) + " --to " + Q(out)));
    CommandResult cmp = Sh("qemu-img compare -q -U -f raw -F qcow2 " + Q(out) + " " + Q(expected));
    EXPECT_EQ(cmp.exit_code, 0) << name << "@" << position << " is not " << expected << ": " << cmp.output;
    fs::remove(out);
  }
  void Swap() {
    const std::string tmp = dir_path_ + "/swap.tmp";
    RunOk("mv " + Q(a_) + " " + Q(tmp) + " && mv " + Q(b_) + " " + Q(a_) + " && mv " + Q(tmp) + " " + Q(b_));
  }
  TempDir dir_;
  std::string dir_path_, a_, b_, target_;
};

// The swap: each path now holds the other disk, with that disk's bitmap.
// Each incremental asked for is taken as a full, its reason naming the
// replacement, and every point of both chains restores to its own disk.
TEST_F(ReplacedDiskTest, SwappedFilesTakeAFullNamingTheReplacement) {
  EXPECT_EQ(Backup(a_, "a", "")["type"], "full");
  EXPECT_EQ(Backup(b_, "b", "")["type"], "full");
  const std::string a0 = Snapshot(a_, "a0"), b0 = Snapshot(b_, "b0");

  // The disks' own incrementals stay incrementals: the sample matches.
  Write(a_, "0x33", "1M 64k");
  Write(b_, "0x44", "3M 64k");
  json ia = Backup(a_, "a", "--incremental --dirty-bitmap cbt0");
  EXPECT_EQ(ia["type"], "incremental") << ia.dump();
  ASSERT_TRUE(ia.contains("clean_check")) << ia.dump();
  EXPECT_GT(ia["clean_check"]["clusters"].get<uint64_t>(), 0u);
  EXPECT_LE(ia["clean_check"]["clusters"].get<uint64_t>(), 64u);
  EXPECT_EQ(ia["clean_check"]["differing"], 0);
  EXPECT_FALSE(ia.contains("replaced"));
  const std::string a1 = Snapshot(a_, "a1");

  // More writes, then the files change places.
  Write(a_, "0x55", "6M 64k");
  Write(b_, "0x66", "7M 64k");
  Swap();
  for (const auto& [path, name] : {std::pair{a_, "a"}, std::pair{b_, "b"}}) {
    json r = Backup(path, name, "--incremental --dirty-bitmap cbt0");
    EXPECT_EQ(r["type"], "full") << name << ": " << r.dump();
    EXPECT_EQ(r["replaced"], true) << r.dump();
    EXPECT_TRUE(r["parent"].is_null()) << r.dump();
    EXPECT_NE(r["reason"].get<std::string>().find("disk replaced"), std::string::npos) << r.dump();
    EXPECT_NE(r["reason"].get<std::string>().find(path + " is not the disk this chain holds"), std::string::npos)
        << r.dump();
    EXPECT_GT(r["clean_check"]["differing"].get<uint64_t>(), 0u) << r.dump();
    EXPECT_LE(r["clean_check"]["bytes_read"].get<uint64_t>(), 64u * 65536u) << r.dump();
    RunOk(Barge("verify --all " + Q(target_ + "/" + name)));
  }
  ExpectRestoresTo("a", 0, a0);
  ExpectRestoresTo("a", 1, a1);
  ExpectRestoresTo("a", 2, a_);  // what path a holds now: disk B
  ExpectRestoresTo("b", 0, b0);
  ExpectRestoresTo("b", 1, b_);  // what path b holds now: disk A
}

// One disk overwritten by a copy of the other keeps its inode: only its
// content tells. Its incremental is a full, and restores to the copy.
TEST_F(ReplacedDiskTest, OverwrittenByACopyTakesAFull) {
  Backup(a_, "a", "");
  Backup(b_, "b", "");
  Write(b_, "0x44", "3M 64k");
  RunOk("cp " + Q(b_) + " " + Q(a_));
  json r = Backup(a_, "a", "--incremental --dirty-bitmap cbt0");
  EXPECT_EQ(r["type"], "full") << r.dump();
  EXPECT_EQ(r["replaced"], true) << r.dump();
  ExpectRestoresTo("a", 1, a_);
  // The text output says what the check read and found.
  Write(a_, "0x77", "4M 64k");
  CommandResult t = Sh(Barge("backup --source " + Q(a_) + " --target " + Q(target_) +
                             " --name a --incremental --dirty-bitmap cbt0"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  EXPECT_NE(t.output.find("unchanged clusters sampled"), std::string::npos) << t.output;
  EXPECT_NE(t.output.find("they match the chain"), std::string::npos) << t.output;
  ExpectRestoresTo("a", 2, a_);
}

// A chain already mixed (the incremental read from the other disk's file,
// as before the check; --no-clean-check does it now): verify passes, and
// verify --against the disk says the chain does not match it.
TEST_F(ReplacedDiskTest, VerifyAgainstNamesAnAlreadyMixedChain) {
  const std::string full_id = Backup(a_, "a", "")["id"];
  Backup(b_, "b", "");
  Write(b_, "0x44", "3M 64k");
  Swap();
  json mixed = Backup(a_, "a", "--incremental --dirty-bitmap cbt0 --no-clean-check");
  ASSERT_EQ(mixed["type"], "incremental") << mixed.dump();
  EXPECT_FALSE(mixed.contains("clean_check")) << mixed.dump();
  const std::string chain = target_ + "/a";
  RunOk(Barge("verify " + Q(chain)));  // its own digests all match
  CommandResult v = Sh(Barge("verify " + Q(chain) + " --against " + Q(a_)));
  EXPECT_EQ(v.exit_code, 2) << v.output;
  EXPECT_NE(v.output.find("the chain does not match this disk"), std::string::npos) << v.output;
  EXPECT_NE(v.output.find("as backup " + full_id + " stored it"), std::string::npos) << v.output;
  // A disk that only changed since its one full is told as before.
  Write(b_, "0x77", "3M 64k");  // b now holds disk A
  CommandResult plain = Sh(Barge("verify " + Q(chain) + " --at 0 --against " + Q(b_)));
  EXPECT_EQ(plain.exit_code, 2) << plain.output;
  EXPECT_EQ(plain.output.find("the chain does not match this disk"), std::string::npos) << plain.output;
}

// A policy whose image file was swapped under its path: the planned
// incremental is a full, and the run says why.
TEST_F(ReplacedDiskTest, PolicyRunTakesAFullSayingWhy) {
  const std::string policy = dir_path_ + "/p.yaml", cat = dir_path_ + "/catalog.db";
  WriteText(policy, "name: nightly\nsources:\n  - image: " + a_ + "\n    name: disk\n    bitmap: cbt0\n"
                    "targets: [" + target_ + "]\n");
  fs::create_directories(target_);
  auto run = [&] {
    CommandResult r = Sh("BARGE_CATALOG=" + Q(cat) + " " + Barge("run --force --policy " + Q(policy) + " --json"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ResultOf(r.stdout_text).at("sources").at(0);
  };
  EXPECT_EQ(run().at("type"), "full");
  Write(b_, "0x44", "3M 64k");
  Swap();
  json second = run();
  EXPECT_EQ(second.at("type"), "full") << second.dump(2);
  EXPECT_NE(second.at("type_reason").get<std::string>().find("disk replaced"), std::string::npos) << second.dump(2);
  ExpectRestoresTo("nightly/disk", 1, a_);
}

}  // namespace
}  // namespace barge::testing
