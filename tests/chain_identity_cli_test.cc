// Issue 18, section 1: a chain is one disk. Through the real binary: an
// incremental of another disk into a chain is refused (manual) or starts a
// new chain (policy, the reason recorded); verify fails on a chain whose
// points record different disks, and still passes chains written before
// barge recorded identities.
#include <gtest/gtest.h>

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

class ChainIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveTool("qemu-img") || !HaveTool("qemu-io")) {
      if (ToolsRequired()) FAIL() << "qemu-img and qemu-io are required";
      GTEST_SKIP() << "qemu-img or qemu-io missing";
    }
    // Two disks of one size, each with an enabled persistent bitmap cbt0.
    a_ = fs::canonical(dir_.path()).string() + "/a.qcow2";
    b_ = fs::canonical(dir_.path()).string() + "/b.qcow2";
    for (const auto& [disk, pattern] : {std::pair{a_, "0x11"}, std::pair{b_, "0x22"}}) {
      RunOk("qemu-img create -q -f qcow2 " + Q(disk) + " 8M && qemu-io -f qcow2 -c 'write -P " + pattern +
            " 0 2M' " + Q(disk) + " >/dev/null && qemu-img bitmap --add --enable " + Q(disk) + " cbt0");
    }
    target_ = dir_ / "t";
  }
  void Change(const std::string& disk, const std::string& pattern) {
    RunOk("qemu-io -f qcow2 -c 'write -P " + pattern + " 1M 64k' " + Q(disk) + " >/dev/null");
  }
  std::string Backup(const std::string& source, const std::string& extra) {
    return Barge("backup --source " + Q(source) + " --target " + Q(target_) + " --name disk " + extra);
  }
  TempDir dir_;
  std::string a_, b_, target_;
};

// `barge backup --source B --incremental --dirty-bitmap cbt0` into disk A's
// chain was accepted: the point restored to neither disk.
TEST_F(ChainIdentityTest, IncrementalOfAnotherDiskIsRefusedNamingBoth) {
  RunOk(Backup(a_, ""));
  const std::string chain = target_ + "/disk";
  Change(b_, "0x33");
  CommandResult r = Sh(Backup(b_, "--incremental --dirty-bitmap cbt0"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("barge: InvalidArgument: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("file " + a_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("file " + b_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--name"), std::string::npos) << r.output;
  EXPECT_EQ(PointIds(chain).size(), 1u);

  const json fm = ReadJson(ManifestPath(chain, PointIds(chain).at(0)));
  ASSERT_TRUE(fm.contains("disk_identity")) << fm.dump(2);
  EXPECT_EQ(fm["disk_identity"]["kind"], "file");
  EXPECT_EQ(fm["disk_identity"]["location"], a_);
  EXPECT_EQ(fm["disk_identity"]["virtual_size"], 8u << 20);
  ASSERT_TRUE(fm.contains("chain_id"));
  EXPECT_EQ(fm["chain_id"].get<std::string>().size(), 32u);

  // The chain's own disk, named through a symbolic link and a relative
  // path, extends it; the incremental carries the chain's id.
  fs::create_symlink(a_, dir_ / "link.qcow2");
  Change(a_, "0x44");
  RunOk("cd " + Q(dir_.path().string()) + " && " + Backup("link.qcow2", "--incremental --dirty-bitmap cbt0"));
  ASSERT_EQ(PointIds(chain).size(), 2u);
  const json im = ReadJson(ManifestPath(chain, PointIds(chain).at(1)));
  EXPECT_EQ(im["type"], "incremental");
  EXPECT_EQ(im["disk_identity"], fm["disk_identity"]);
  EXPECT_EQ(im["chain_id"], fm["chain_id"]);
  RunOk(Barge("verify --all " + Q(chain)));
}

// A full of another disk of the same size under an existing --name was
// taken without a word: the chain's earlier points silently became another
// disk's history. It is taken (a full may start a chain over), with a
// warning naming both disks, in text and in --json.
TEST_F(ChainIdentityTest, FullOfAnotherDiskUnderAnExistingNameWarns) {
  RunOk(Backup(a_, ""));
  CommandResult r = Sh(Backup(b_, ""));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("file " + a_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("file " + b_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--name"), std::string::npos) << r.output;

  // The same disk again: no warning.
  r = Sh(Backup(b_, "--json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("\"warning\""), std::string::npos) << r.output;
  // Back to A, as NDJSON: one warning event naming the chain folder.
  r = Sh(Backup(a_, "--json") + " 2>/dev/null");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int warnings = 0;
  for (const json& e : Events(r.output)) {
    if (e.value("event", "") != "warning") continue;
    ++warnings;
    EXPECT_NE(e.dump().find("another disk"), std::string::npos) << e.dump();
  }
  EXPECT_EQ(warnings, 1) << r.output;
  EXPECT_EQ(PointIds(target_ + "/disk").size(), 4u);
}

// Two policy files of one name and one target (or a policy whose image
// changed) appended the second disk's bitmap to the first disk's chain.
TEST_F(ChainIdentityTest, PolicyWhoseSourceChangedDiskStartsANewChainSayingWhy) {
  const std::string policy = dir_ / "p.yaml", cat = dir_ / "catalog.db";
  auto write_policy = [&](const std::string& image) {
    WriteText(policy, "name: nightly\nsources:\n  - image: " + image + "\n    name: disk\n    bitmap: cbt0\n"
                      "targets: [" + target_ + "]\n");
  };
  auto run = [&] {
    CommandResult r = Sh("BARGE_CATALOG=" + Q(cat) + " " + Barge("run --force --policy " + Q(policy) + " --json"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return ResultOf(r.stdout_text).at("sources").at(0);
  };
  fs::create_directories(target_);
  write_policy(a_);
  json first = run();
  EXPECT_EQ(first.at("type"), "full") << first.dump(2);
  Change(a_, "0x55");
  json second = run();
  EXPECT_EQ(second.at("type"), "incremental") << second.dump(2);

  write_policy(b_);
  Change(b_, "0x66");
  json third = run();
  ASSERT_EQ(third.at("result"), "success") << third.dump(2);
  EXPECT_EQ(third.at("type"), "full") << third.dump(2);
  const std::string reason = third.at("type_reason");
  EXPECT_NE(reason.find("file " + a_), std::string::npos) << reason;
  EXPECT_NE(reason.find("file " + b_), std::string::npos) << reason;
  EXPECT_NE(reason.find("a new chain starts"), std::string::npos) << reason;

  // The run's record says so too.
  CommandResult listed = Sh("BARGE_CATALOG=" + Q(cat) + " " + Barge("runs list --json"));
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_NE(listed.stdout_text.find("a new chain starts"), std::string::npos) << listed.stdout_text;

  const std::string chain = target_ + "/nightly/disk";
  const auto ids = PointIds(chain);
  ASSERT_EQ(ids.size(), 3u);
  const json newest = ReadJson(ManifestPath(chain, ids[2]));
  EXPECT_EQ(newest["type"], "full");
  EXPECT_TRUE(newest["parent"].is_null());
  EXPECT_EQ(newest["disk_identity"]["location"], b_);
  EXPECT_NE(newest["chain_id"], ReadJson(ManifestPath(chain, ids[0]))["chain_id"]);
  RunOk(Barge("verify --all " + Q(chain)));
  // The new chain restores to disk B as it is now.
  const std::string out = dir_ / "restored.raw";
  RunOk(Barge("restore " + Q(chain) + " --to " + Q(out)));
  RunOk("qemu-img compare -q -U -f raw -F qcow2 " + Q(out) + " " + Q(b_));
}

// A chain whose points record two disks verified OK; one written before
// barge recorded identities must still verify.
TEST_F(ChainIdentityTest, VerifyFailsOnAChainThatMixesDisksNamingTheFirstForeignPoint) {
  RunOk(Backup(a_, ""));
  for (const char* pattern : {"0x71", "0x72"}) {
    Change(a_, pattern);
    RunOk(Backup(a_, "--incremental --dirty-bitmap cbt0"));
  }
  const std::string chain = target_ + "/disk";
  const auto ids = PointIds(chain);
  ASSERT_EQ(ids.size(), 3u);
  std::vector<std::string> manifests;
  std::vector<json> original;
  for (const auto& id : ids) {
    manifests.push_back(ManifestPath(chain, id));
    original.push_back(ReadJson(manifests.back()));
  }
  RunOk(Barge("verify --all " + Q(chain)));

  // Point 1 (and so 2 above it) claims disk B.
  json foreign = original[1];
  foreign["disk_identity"]["location"] = b_;
  WriteJson(manifests[1], foreign);
  CommandResult r = Sh(Barge("verify --all " + Q(chain)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("barge: Corruption: " + manifests[1]), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mixes disks: backup " + ids[1]), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("file " + b_), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("file " + a_), std::string::npos) << r.output;
  // The full before it still verifies on its own; a restore of the mixed
  // point is refused the same way.
  RunOk(Barge("verify " + Q(chain) + " --at 0"));
  EXPECT_EQ(Sh(Barge("restore " + Q(chain) + " --to " + Q(dir_ / "r.raw"))).exit_code, 2);
  EXPECT_FALSE(fs::exists(dir_ / "r.raw"));

  // The same disk, but the newest point carries another chain's id.
  WriteJson(manifests[1], original[1]);
  json other_chain = original[2];
  other_chain["chain_id"] = "00000000000000000000000000000000";
  WriteJson(manifests[2], other_chain);
  r = Sh(Barge("verify --all " + Q(chain)));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("barge: Corruption: " + manifests[2]), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("mixes disks: backup " + ids[2]), std::string::npos) << r.output;

  // Written before this change: no identity, no chain id. Verifies, and an
  // incremental still extends it (recording identity and a chain id).
  for (size_t i = 0; i < manifests.size(); ++i) {
    json old = original[i];
    old.erase("disk_identity");
    old.erase("chain_id");
    WriteJson(manifests[i], old);
  }
  RunOk(Barge("verify --all " + Q(chain)));
  Change(a_, "0x73");
  RunOk(Backup(a_, "--incremental --dirty-bitmap cbt0"));
  const auto now = PointIds(chain);
  ASSERT_EQ(now.size(), 4u);
  const json newest = ReadJson(ManifestPath(chain, now[3]));
  EXPECT_EQ(newest["disk_identity"]["location"], a_);
  EXPECT_EQ(newest["chain_id"].get<std::string>().size(), 32u);
  RunOk(Barge("verify --all " + Q(chain)));
  // From now on the chain is disk A's.
  Change(b_, "0x74");
  EXPECT_EQ(Sh(Backup(b_, "--incremental --dirty-bitmap cbt0")).exit_code, 1);
}

}  // namespace
}  // namespace barge::testing
