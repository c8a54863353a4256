// barge state migrate against a real libvirtd: a state folder (CBT
// overlays) that a running or paused domain uses is not moved.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/state/state_repoint.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class VmStateMigrateTest : public VmTestBase {
 protected:
  // Names and sizes of everything under `dir`, sorted.
  static std::vector<std::string> Listing(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      out.push_back(e.path().string() + (e.is_regular_file() ? " " + std::to_string(e.file_size()) : ""));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

// The domain runs (paused) on a CBT overlay in the state folder: the
// migration is refused with Busy naming the domain, and nothing is touched
// (the old folder as it was, no new folder, the overlay still opens in QEMU
// and the domain's XML still names it).
TEST_F(VmStateMigrateTest, RunningDomainRefusedNothingTouched) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string raw = dir_ / "disk.raw";
  RunOk("truncate -s 64M " + ShellQuote(raw));
  TestDomain dom("migrate", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  const std::string state = dir_ / "cbt";
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(state));
  ASSERT_EQ(st["state"], "Enabled");
  const std::string overlay = st["disks"][0]["overlay"];
  OpenForQemu(state);
  const std::string to = dir_ / "newvol/cbt";

  for (const char* how : {"paused", "running"}) {
    SCOPED_TRACE(how);
    if (std::string(how) == "paused") {
      dom.StartPaused();
    } else {
      RunOk(std::string(kVirsh) + "resume " + dom.name());
    }
    dom.Write(0xee, "1M", "1M");
    const auto before = Listing(state);
    auto r = ::barge::testing::Run(BargeBinary() + " state migrate --from " + ShellQuote(state) + " --to " +
                                   ShellQuote(to));
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_NE(r.output.find("Busy"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("domain '" + dom.name() + "' is " + how), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "newvol"));
    EXPECT_EQ(Listing(state), before);
    EXPECT_NE(RunOk(std::string(kVirsh) + "domblklist " + dom.name()).find(overlay), std::string::npos);
    // QEMU still writes through the overlay it has open.
    dom.Write(0x11, "2M", "1M");
  }
  dom.Destroy();
  EXPECT_TRUE(fs::exists(overlay));
}

// Shut off, the folder moves and the domain's persistent XML and the
// catalog's CBT record name the new copy (switched inside the journaled
// step): the domain starts on the moved overlay, and the next backup is an
// incremental from the checkpoint whose bitmap moved with it.
TEST_F(VmStateMigrateTest, ShutOffDomainAndCatalogFollowTheFolder) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string raw = dir_ / "disk.raw";
  RunOk("truncate -s 64M " + ShellQuote(raw));
  TestDomain dom("follow", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  const std::string state = dir_ / "cbt";
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(state));
  ASSERT_EQ(st["state"], "Enabled");
  OpenForQemu(state);
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full");
  dom.Destroy();

  fs::create_directories(dir_ / "newvol");
  OpenForQemu(dir_ / "newvol");
  const std::string to = dir_ / "newvol/cbt";
  json m = ::barge::testing::RunResult(BargeBinary() + " state migrate --json --from " + ShellQuote(state) +
                                       " --to " + ShellQuote(to) + " --catalog " + ShellQuote(catalog_));
  EXPECT_EQ(m["outcome"], "migrated");
  EXPECT_FALSE(fs::exists(state));
  const std::string new_overlay = to + "/vda.qcow2";
  std::string blk = RunOk(std::string(kVirsh) + "domblklist " + dom.name());
  EXPECT_NE(blk.find(new_overlay), std::string::npos) << blk;
  EXPECT_EQ(blk.find(state + "/"), std::string::npos) << blk;
  json cbt = BargeJson("cbt status --domain " + dom.name());
  EXPECT_EQ(cbt["state_dir"], to) << cbt.dump();
  EXPECT_EQ(cbt["disks"][0]["overlay"], new_overlay) << cbt.dump();

  OpenForQemu(to);
  dom.StartPaused();
  dom.Write(0x33, "20M", "1M");
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], b0["checkpoint"]);
  dom.Destroy();
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 1, raw);
}

// The migrated folder holds the raw disk under a CBT overlay (the state
// folder is elsewhere): the catalog's CBT record follows the raw disk, and
// cbt disable puts the domain back on the moved raw disk, not on the
// removed old path that the definition named before enable.
TEST_F(VmStateMigrateTest, DisableAfterMovingTheRawDiskGoesToTheNewPath) {
  fs::create_directories(dir_ / "vol");
  const std::string raw = dir_ / "vol/disk.raw";
  RunOk("truncate -s 64M " + ShellQuote(raw));
  TestDomain dom("rawmove", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  const std::string state = dir_ / "cbt";
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(state));
  ASSERT_EQ(st["state"], "Enabled");

  const std::string to = dir_ / "newvol/vol";
  json m = ::barge::testing::RunResult(BargeBinary() + " state migrate --json --from " + ShellQuote(dir_ / "vol") +
                                       " --to " + ShellQuote(to) + " --catalog " + ShellQuote(catalog_));
  ASSERT_EQ(m["outcome"], "migrated") << m.dump();
  const std::string new_raw = to + "/disk.raw";
  json cbt = BargeJson("cbt status --domain " + dom.name());
  EXPECT_EQ(cbt["disks"][0]["data_file"], new_raw) << cbt.dump();

  EXPECT_EQ(BargeJson("cbt disable --domain " + dom.name())["state"], "Disabled");
  std::string blk = RunOk(std::string(kVirsh) + "domblklist " + dom.name());
  EXPECT_NE(blk.find(new_raw), std::string::npos) << blk;
  EXPECT_EQ(blk.find(raw), std::string::npos) << blk;
}

// The repoint itself (the migration's switch, after the copy) sees a domain
// that names the folder only in its live XML (here a transient one, as one
// started during the copy would be) and refuses it; and it takes the lock
// of each domain it switches, so a domain whose lock a backup or CBT change
// holds is refused, and while the migration holds the locks, cbt enable of
// such a domain is refused.
TEST_F(VmStateMigrateTest, RepointSeesLiveOnlyUsersAndTakesTheDomainLocks) {
  fs::create_directories(dir_ / "vol");
  const std::string vol = dir_ / "vol";
  const std::string to = dir_ / "newvol/vol";
  {
    const std::string raw = dir_ / "vol/live.raw";
    RunOk("truncate -s 64M " + ShellQuote(raw));
    TestDomain live("liveonly", {{"vda", raw, "raw"}});
    const std::string xml_path = dir_ / "liveonly.xml";
    { std::ofstream(xml_path) << live.Xml(); }
    RunOk(std::string(kVirsh) + "create " + ShellQuote(xml_path) + " --paused");
    orchestrate::DomainRepoint repoint(Env::Default(), "", catalog_);
    Status s = repoint.Repoint(vol, to);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kBusy) << s.error().ToString();
    EXPECT_NE(s.error().message().find(live.name()), std::string::npos) << s.error().ToString();
  }

  const std::string raw = dir_ / "vol/disk.raw";
  RunOk("truncate -s 64M " + ShellQuote(raw));
  TestDomain dom("locked", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  {
    auto held = orchestrate::TryLockFile(Env::Default(), orchestrate::DomainLockPath(catalog_, dom.name()), "test");
    ASSERT_TRUE(held.ok()) << held.error().ToString();
    orchestrate::DomainRepoint repoint(Env::Default(), "", catalog_);
    Status s = repoint.Repoint(vol, to);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kBusy) << s.error().ToString();
    Status l = repoint.LockUsers(vol);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.error().code(), ErrorCode::kBusy) << l.error().ToString();
    EXPECT_EQ(RunOk(std::string(kVirsh) + "domblklist " + dom.name()).find(to), std::string::npos);
  }
  orchestrate::DomainRepoint repoint(Env::Default(), "", catalog_);
  ASSERT_TRUE(repoint.LockUsers(vol).ok());
  auto r = ::barge::testing::Run(Barge("cbt enable --domain " + dom.name()));
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_NE(r.output.find("already running"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace barge::testing
