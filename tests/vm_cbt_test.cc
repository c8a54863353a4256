// `cbt enable` / `cbt disable` against a real libvirtd (TCG, paused
// domains): disable switches back only the disks enable moved, on the
// definition as it is now, and refuses what it cannot undo; both refuse a
// running domain, and a domain enabled while shut off starts (and restarts)
// on its overlay.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class VmCbtTest : public VmTestBase {
 protected:
  std::string MakeRaw(const std::string& name) {
    std::string p = dir_ / name;
    RunOk("truncate -s 64M " + ShellQuote(p) + " && chmod 644 " + ShellQuote(p));
    return p;
  }
  // target -> source of the domain's disks (persistent or live definition).
  std::map<std::string, std::string> Disks(const std::string& domain, bool inactive) {
    std::istringstream in(RunOk(std::string(kVirsh) + "domblklist " + domain + (inactive ? " --inactive" : "")));
    std::map<std::string, std::string> m;
    std::string target, source;
    while (in >> target >> source) m[target] = source;
    return m;
  }
  std::string InactiveXml(const std::string& domain) {
    return RunOk(std::string(kVirsh) + "dumpxml --inactive " + domain);
  }
  void Redefine(const std::string& xml) {
    std::string f = dir_ / "redefine.xml";
    std::ofstream(f) << xml;
    RunOk(std::string(kVirsh) + "define " + ShellQuote(f));
    fs::remove(f);
  }
  CommandResult Cbt(const std::string& verb, const std::string& domain) {
    return ::barge::testing::Run(Barge("cbt " + verb + " --domain " + domain) + " 2>&1");
  }
};

// Issue 25: disable restored the whole XML saved at enable, undoing the
// administrator's later changes (memory back to 64 MiB, a changed disk back
// to its old file). Now only the disks enable moved go back, and a disk no
// longer on barge's overlay makes disable refuse, naming it.
TEST_F(VmCbtTest, DisableKeepsLaterChangesAndRefusesAChangedDisk) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string vda = MakeRaw("vda.raw");
  std::string vdb = MakeRaw("vdb.raw");
  TestDomain dom("cbtkeep", {{"vda", vda, "raw"}, {"vdb", vdb, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
  ASSERT_EQ(st["state"], "Enabled") << st.dump();
  ASSERT_EQ(st["disks"].size(), 2u);
  std::string ov_a = st["disks"][0]["overlay"], ov_b = st["disks"][1]["overlay"];
  EXPECT_EQ(Disks(dom.name(), true), (std::map<std::string, std::string>{{"vda", ov_a}, {"vdb", ov_b}}));

  // The administrator's change after enable: 64 -> 96 MiB.
  RunOk(std::string(kVirsh) + "setmaxmem " + dom.name() + " 96M --config");
  RunOk(std::string(kVirsh) + "setmem " + dom.name() + " 96M --config");
  EXPECT_EQ(BargeJson("cbt disable --domain " + dom.name())["state"], "Disabled");
  std::string xml = InactiveXml(dom.name());
  EXPECT_NE(xml.find("<memory unit='KiB'>98304</memory>"), std::string::npos) << xml;
  EXPECT_NE(xml.find("<currentMemory unit='KiB'>98304</currentMemory>"), std::string::npos) << xml;
  EXPECT_EQ(Disks(dom.name(), true), (std::map<std::string, std::string>{{"vda", vda}, {"vdb", vdb}}));
  EXPECT_EQ(xml.find("qcow2"), std::string::npos) << xml;
  EXPECT_FALSE(fs::exists(ov_a));
  EXPECT_FALSE(fs::exists(ov_b));

  // Enabled again; then vdb is moved to another image by the administrator.
  st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
  ASSERT_EQ(st["state"], "Enabled") << st.dump();
  std::string other = dir_ / "other.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(other) + " 64M");
  xml = InactiveXml(dom.name());
  size_t at = xml.find(ov_b);
  ASSERT_NE(at, std::string::npos) << xml;
  xml.replace(at, ov_b.size(), other);
  Redefine(xml);
  std::string before = InactiveXml(dom.name());
  auto refused = Cbt("disable", dom.name());
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("disk vdb"), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find(other), std::string::npos) << refused.output;
  EXPECT_NE(refused.output.find(ov_b), std::string::npos) << refused.output;
  // Nothing changed: the definition, the record, the overlays.
  EXPECT_EQ(InactiveXml(dom.name()), before);
  EXPECT_EQ(BargeJson("cbt status --domain " + dom.name())["state"], "Enabled");
  EXPECT_TRUE(fs::exists(ov_a));
  EXPECT_TRUE(fs::exists(ov_b));
}

// Issue 25: enable on a running domain left it unable to start after its
// next restart (libvirt gives the raw disk back to root at shut-off), and
// disable on a running domain said "Disabled" while QEMU still ran on the
// overlay. Both now refuse a running domain and change nothing; enabled
// while shut off, the domain starts on its overlay, restarts, backs up, and
// after disable starts on its raw disk again.
TEST_F(VmCbtTest, RunningDomainRefusedShutOffEnableSurvivesRestarts) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string raw = MakeRaw("disk.raw");
  TestDomain dom("cbtrun", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  std::string state_dir = dir_ / "cbt";
  std::string xml0 = InactiveXml(dom.name());

  dom.StartPaused();
  auto r = ::barge::testing::Run(Barge("cbt enable --domain " + dom.name() + " --state-dir " +
                                       ShellQuote(state_dir)) + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is running"), std::string::npos) << r.output;
  EXPECT_EQ(InactiveXml(dom.name()), xml0);
  EXPECT_FALSE(fs::exists(state_dir + "/vda.qcow2"));
  EXPECT_EQ(BargeJson("cbt status --domain " + dom.name())["state"], "Disabled");
  dom.Destroy();
  // libvirt gave the raw disk back to its owner at shut-off.
  struct stat s {};
  ASSERT_EQ(::stat(raw.c_str(), &s), 0);
  EXPECT_EQ(s.st_uid, ::getuid());

  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(state_dir));
  ASSERT_EQ(st["state"], "Enabled") << st.dump();
  std::string overlay = st["disks"][0]["overlay"];
  OpenForQemu(state_dir);
  dom.StartPaused();
  EXPECT_EQ(Disks(dom.name(), false)["vda"], overlay);
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  EXPECT_EQ(Backup(dom.name())["backup_type"], "full");

  r = Cbt("disable", dom.name());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is running"), std::string::npos) << r.output;
  EXPECT_EQ(Disks(dom.name(), true)["vda"], overlay);
  EXPECT_TRUE(fs::exists(overlay));
  EXPECT_EQ(BargeJson("cbt status --domain " + dom.name())["state"], "Enabled");

  // Two restarts on the overlay: the raw disk stays usable by QEMU.
  for (int i = 0; i < 2; ++i) {
    dom.Destroy();
    dom.StartPaused();
    EXPECT_EQ(Disks(dom.name(), false)["vda"], overlay);
  }
  dom.Write(0xaa, "10M", "1M");
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  dom.Destroy();

  EXPECT_EQ(BargeJson("cbt disable --domain " + dom.name())["state"], "Disabled");
  EXPECT_FALSE(fs::exists(overlay));
  dom.StartPaused();
  EXPECT_EQ(Disks(dom.name(), false)["vda"], raw);
  dom.Destroy();
  ASSERT_EQ(::stat(raw.c_str(), &s), 0);
  EXPECT_EQ(s.st_uid, ::getuid());
  // Enable works again: nothing was left behind.
  EXPECT_EQ(BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(state_dir))["state"],
            "Enabled");
}

}  // namespace
}  // namespace barge::testing
