// Issue 25's smaller findings on checkpoints and plans, against the real
// libvirtd and QEMU (TCG, paused domains, no guest OS): `checkpoint
// redefine` after every checkpoint's metadata was deleted, the offline
// backup after a crashed QEMU, and doctor's forecast against what `vm
// backup` then does.
#include <algorithm>
#include <filesystem>
#include <chrono>
#include <fstream>
#include <thread>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class VmRedefineTest : public VmTestBase {
 protected:
  std::vector<std::string> CheckpointNames(const std::string& domain) {
    std::istringstream in(RunOk(std::string(kVirsh) + "checkpoint-list " + domain + " --name"));
    std::vector<std::string> names;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) names.push_back(line);
    }
    return names;
  }
  // `virsh checkpoint-delete --metadata` of every checkpoint of `domain`
  // (what a libvirtd that lost its metadata looks like); the bitmaps stay.
  void DeleteAllCheckpointMetadata(const std::string& domain) {
    for (const auto& n : CheckpointNames(domain)) {
      RunOk(std::string(kVirsh) + "checkpoint-delete " + domain + " " + n + " --metadata");
    }
    EXPECT_TRUE(CheckpointNames(domain).empty());
  }
  // `doctor --target` then `vm backup` (--skip-quiesce, `extra`): the
  // forecast's mode and, per disk, backup type and reason must be what the
  // backup then did. Returns the backup's result; `doctor` the forecast.
  json ExpectForecastMatches(TestDomain& dom, json* doctor = nullptr, const std::string& extra = "") {
    json doc = BargeJson("doctor --domain " + dom.name() + " --target " + ShellQuote(target_));
    if (doctor != nullptr) *doctor = doc;
    json b = Backup(dom.name(), extra);
    EXPECT_EQ(doc["next_refusal"], "") << doc.dump();
    EXPECT_EQ(doc["next_mode"], b["mode"]) << doc.dump() << "\n" << b.dump();
    EXPECT_EQ(doc["next_backup"].size(), b["disks"].size()) << doc.dump() << "\n" << b.dump();
    for (const auto& d : b["disks"]) {
      json forecast;
      for (const auto& f : doc["next_backup"]) {
        if (f["disk"] == d["disk"]) forecast = f;
      }
      EXPECT_EQ(forecast["backup_type"], d["backup_type"]) << doc.dump() << "\n" << b.dump();
      EXPECT_EQ(forecast["reason"], d["reason"]) << doc.dump() << "\n" << b.dump();
    }
    return b;
  }
  // The top node of the running domain's first disk (query-block).
  std::string DiskNode(TestDomain& dom) {
    json r = json::parse(
        RunOk(std::string(kVirsh) + "qemu-monitor-command " + dom.name() + " '{\"execute\":\"query-block\"}'"));
    return r["return"][0]["inserted"]["node-name"];
  }
  // The disk's contents now (a running domain's qcow2 read by qemu-img,
  // after a flush), as a raw file.
  std::string FlatNow(TestDomain& dom, const std::string& disk, const std::string& name) {
    dom.Flush();
    std::string out = dir_ / name;
    RunOk("qemu-img convert -U -O raw " + ShellQuote(disk) + " " + ShellQuote(out));
    return out;
  }
};

// Two trackers of one domain, several backups each: every checkpoint's
// stored XML names a parent barge itself deleted afterwards (a tracker's
// previous checkpoint). After `virsh checkpoint-delete --metadata` of all,
// `checkpoint redefine` redefines every one (without the missing parent),
// exits 0, and both trackers' next backups are incremental and restore.
TEST_F(VmRedefineTest, RedefineAfterAllMetadataDeletedRedefinesEveryTracker) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("redefall", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create a --domain " + dom.name()));
  RunOk(Barge("tracker create b --domain " + dom.name()));
  const std::string ta = target_ + "/a", tb = target_ + "/b";
  fs::create_directories(ta);
  fs::create_directories(tb);
  auto backup = [&](const std::string& tracker) {
    return BargeJson("vm backup --domain " + dom.name() + " --tracker " + tracker + " --skip-quiesce --target " +
                     ShellQuote(tracker == "a" ? ta : tb));
  };
  dom.Write(0xa1, "1M", "2M");
  ASSERT_EQ(backup("a")["backup_type"], "full");
  dom.Write(0xb1, "4M", "1M");
  ASSERT_EQ(backup("b")["backup_type"], "full");
  dom.Write(0xa2, "8M", "1M");
  ASSERT_EQ(backup("a")["backup_type"], "incremental");
  dom.Write(0xa3, "12M", "1M");
  json a3 = backup("a");
  ASSERT_EQ(a3["backup_type"], "incremental");
  json b1 = BargeJson("tracker show b");
  ASSERT_EQ(CheckpointNames(dom.name()).size(), 2u);

  DeleteAllCheckpointMetadata(dom.name());
  json re = BargeJson("checkpoint redefine --domain " + dom.name());
  ASSERT_EQ(re["checkpoints"].size(), 2u) << re.dump();
  for (const auto& c : re["checkpoints"]) EXPECT_EQ(c["action"], "redefined") << re.dump();
  auto names = CheckpointNames(dom.name());
  EXPECT_EQ(names.size(), 2u);
  EXPECT_NE(std::find(names.begin(), names.end(), a3["checkpoint"].get<std::string>()), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(),
                      b1["tracker"]["latest_checkpoint"]["name"].get<std::string>()),
            names.end());
  EXPECT_FALSE(BargeJson("tracker show a")["tracker"]["needs_full"].get<bool>());
  EXPECT_FALSE(BargeJson("tracker show b")["tracker"]["needs_full"].get<bool>());

  dom.Write(0x44, "20M", "1M");
  json a4 = backup("a");
  EXPECT_EQ(a4["backup_type"], "incremental") << a4.dump();
  EXPECT_EQ(a4["parent_checkpoint"], a3["checkpoint"]);
  json b2 = backup("b");
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  std::string flat = FlatNow(dom, disk, "flat.raw");
  ExpectRestores(ta + "/" + dom.name() + "/vda", 3, flat);
  ExpectRestores(tb + "/" + dom.name() + "/vda", 1, flat);
}

// A checkpoint libvirt refuses to redefine (its bitmap is gone from QEMU):
// `checkpoint redefine` prints its result, then an error naming the tracker
// and checkpoint, exits 1, and leaves the tracker as it was (not marked for
// a full). The next vm backup is full and its reason names the command.
TEST_F(VmRedefineTest, RedefineFailureExitsNonZeroAndKeepsTracker) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("redeffail", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "2M");
  json b0 = Backup(dom.name());
  const std::string cp = b0["checkpoint"];
  DeleteAllCheckpointMetadata(dom.name());
  RunOk(std::string(kVirsh) + "qemu-monitor-command " + dom.name() + " " +
        ShellQuote("{\"execute\":\"block-dirty-bitmap-remove\",\"arguments\":{\"node\":\"libvirt-1-format\","
                   "\"name\":\"" + cp + "\"}}"));

  auto r = ::barge::testing::Run(Barge("checkpoint redefine --domain " + dom.name() + " --json"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  json result = ResultOf(r.stdout_text);
  ASSERT_EQ(result["checkpoints"].size(), 1u) << r.output;
  EXPECT_EQ(result["checkpoints"][0]["action"], "failed") << r.output;
  EXPECT_NE(result["checkpoints"][0]["reason"].get<std::string>(), "") << r.output;
  json error = ErrorOf(r.stdout_text);
  EXPECT_NE(error["message"].get<std::string>().find("t1 " + cp), std::string::npos) << error.dump();
  json t = BargeJson("tracker show t1")["tracker"];
  EXPECT_FALSE(t["needs_full"].get<bool>()) << t.dump();
  EXPECT_EQ(t["latest_checkpoint"]["name"], cp);

  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "full");
  EXPECT_NE(b1["reason"].get<std::string>().find("checkpoint " + cp + " missing in libvirt"), std::string::npos)
      << b1.dump();
  EXPECT_NE(b1["reason"].get<std::string>().find("barge checkpoint redefine --domain " + dom.name()),
            std::string::npos)
      << b1.dump();
}

// A QEMU killed while its domain ran on CBT overlays leaves every bitmap it
// loaded from the overlay marked in use (barge-cbt and the checkpoint's,
// stored there by a clean stop before). The offline
// backup after it is a full with the reason (the flag, as the online path
// has it), re-creates the bitmaps so that the next offline backup is
// incremental, and both points restore to the disk as it was.
TEST_F(VmRedefineTest, OfflineBackupAfterCrashFullThenIncremental) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  std::string raw = dir_ / "disk.raw";
  RunOk("truncate -s 64M " + ShellQuote(raw));
  std::string other = dir_ / "other.raw";
  RunOk("truncate -s 64M " + ShellQuote(other));
  TestDomain dom("offcrash", {{"vda", other, "raw"}, {"vdb", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
  ASSERT_EQ(st["state"], "Enabled");
  std::string overlay;
  for (const auto& d : st["disks"]) {
    if (d["disk"] == "vdb") overlay = d["overlay"];
  }
  ASSERT_NE(overlay, "") << st.dump();
  OpenForQemu(dir_ / "cbt");
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M", 1);
  json b0 = Backup(dom.name(), "--disks vdb");
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  // QEMU stores a checkpoint's bitmap in the overlay when it closes it: a
  // clean stop and start, so that the kill leaves that bitmap in use too.
  dom.Destroy();
  dom.StartPaused();
  dom.Write(0x22, "8M", "1M", 1);
  dom.Flush(1);
  dom.Kill9();
  std::string info = RunOk("qemu-img info -U --output=json " + ShellQuote(overlay));
  ASSERT_NE(info.find("in-use"), std::string::npos) << "the kill should leave the bitmaps in use: " << info;
  std::string p1 = dir_ / "p1.raw";
  RunOk("cp --sparse=always " + ShellQuote(raw) + " " + ShellQuote(p1));

  json b1 = Backup(dom.name(), "--disks vdb");
  EXPECT_EQ(b1["mode"], "offline") << b1.dump();
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  EXPECT_EQ(b1["reason"], "bitmap inconsistent") << b1.dump();
  // No bitmap left in use; CBT's own bitmap and the new checkpoint's exist.
  RunOk("qemu-img check -q " + ShellQuote(overlay));
  json after = json::parse(RunOk("qemu-img info --output=json " + ShellQuote(overlay)));
  std::vector<std::string> names;
  for (const auto& b : after["format-specific"]["data"]["bitmaps"]) {
    names.push_back(b["name"]);
    EXPECT_EQ(b["flags"], json::array({"auto"})) << after.dump();
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "barge-cbt"), names.end()) << after.dump();
  EXPECT_NE(std::find(names.begin(), names.end(), b1["checkpoint"].get<std::string>()), names.end())
      << after.dump();

  // A write while the domain is shut off (through the overlay, as QEMU
  // would), then the second offline backup: incremental.
  RunOk("qemu-io -f qcow2 -c 'write -P 0x5a 30M 1M' " + ShellQuote(overlay));
  std::string p2 = dir_ / "p2.raw";
  RunOk("cp --sparse=always " + ShellQuote(raw) + " " + ShellQuote(p2));
  json b2 = Backup(dom.name(), "--disks vdb");
  EXPECT_EQ(b2["mode"], "offline") << b2.dump();
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], b1["checkpoint"]);
  EXPECT_LE(b2["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20) << b2.dump();
  std::string chain = target_ + "/" + dom.name() + "/vdb";
  ExpectRestores(chain, 1, p1);
  ExpectRestores(chain, 2, p2);
}

// doctor's forecast is what vm backup then does, for each fallback: no
// previous point (a paused domain, which doctor calls paused and forecasts a
// pull-mode job for), a bitmap gone from QEMU, checkpoint metadata missing
// in libvirt, a bitmap left
// inconsistent by a killed QEMU (online and offline), and a CBT overlay
// without the checkpoint's bitmap (offline; doctor used to forecast an
// incremental). The last point restores to the disk.
TEST_F(VmRedefineTest, DoctorForecastMatchesVmBackupInEveryFallback) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  std::string raw = dir_ / "disk.raw";
  RunOk("truncate -s 64M " + ShellQuote(raw));
  TestDomain dom("forecast", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
  ASSERT_EQ(st["state"], "Enabled");
  const std::string overlay = st["disks"][0]["overlay"];
  OpenForQemu(dir_ / "cbt");
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));

  // No previous point, on a paused domain.
  dom.Write(0xee, "1M", "4M");
  json doc;
  json b = ExpectForecastMatches(dom, &doc);
  EXPECT_EQ(doc["state"], "paused") << doc.dump();
  EXPECT_EQ(doc["running"], false) << doc.dump();
  EXPECT_EQ(b["mode"], "pull");
  EXPECT_EQ(b["disks"][0]["reason"], "tracker empty");
  dom.Write(0x11, "10M", "1M");
  b = ExpectForecastMatches(dom);
  EXPECT_EQ(b["backup_type"], "incremental") << b.dump();

  // The checkpoint's bitmap removed from QEMU (libvirt then gives no size).
  std::string cp = b["checkpoint"];
  RunOk(std::string(kVirsh) + "qemu-monitor-command " + dom.name() + " " +
        ShellQuote("{\"execute\":\"block-dirty-bitmap-remove\",\"arguments\":{\"node\":\"" + DiskNode(dom) +
                   "\",\"name\":\"" + cp + "\"}}"));
  b = ExpectForecastMatches(dom);
  EXPECT_EQ(b["disks"][0]["reason"], "bitmap inconsistent") << b.dump();

  // Checkpoint metadata missing in libvirt.
  dom.Write(0x22, "12M", "1M");
  cp = b["checkpoint"];
  RunOk(std::string(kVirsh) + "checkpoint-delete " + dom.name() + " " + cp + " --metadata");
  // Checkpoint names have one-second resolution, and QEMU still has the
  // bitmap of the name libvirt forgot.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  b = ExpectForecastMatches(dom);
  EXPECT_EQ(b["backup_type"], "full") << b.dump();
  EXPECT_NE(b["disks"][0]["reason"].get<std::string>().find("checkpoint " + cp + " missing in libvirt"),
            std::string::npos)
      << b.dump();

  // QEMU killed, domain started again: the bitmap is inconsistent.
  dom.Write(0x33, "14M", "1M");
  dom.Flush();
  dom.Kill9();
  dom.StartPaused();
  b = ExpectForecastMatches(dom);
  EXPECT_EQ(b["disks"][0]["reason"], "bitmap inconsistent") << b.dump();

  // Stopped cleanly (the bitmap stored in the overlay), started, killed
  // and left shut off: offline, the overlay's bitmap in use.
  dom.Destroy();
  dom.StartPaused();
  dom.Write(0x44, "16M", "1M");
  dom.Flush();
  dom.Kill9();
  b = ExpectForecastMatches(dom, &doc);
  EXPECT_EQ(doc["state"], "shut off") << doc.dump();
  EXPECT_EQ(b["mode"], "offline") << b.dump();
  EXPECT_EQ(b["disks"][0]["reason"], "bitmap inconsistent") << b.dump();

  // The overlay lacks the checkpoint's bitmap: doctor used to say incremental.
  cp = b["checkpoint"];
  RunOk("qemu-img bitmap --remove " + ShellQuote(overlay) + " " + ShellQuote(cp));
  b = ExpectForecastMatches(dom);
  EXPECT_EQ(b["disks"][0]["reason"], "bitmap " + cp + " missing in the CBT overlay") << b.dump();

  // And the plain case offline: incremental, forecast as such.
  RunOk("qemu-io -f qcow2 -c 'write -P 0x5a 30M 1M' " + ShellQuote(overlay));
  b = ExpectForecastMatches(dom);
  EXPECT_EQ(b["backup_type"], "incremental") << b.dump();
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 7, raw);
}

}  // namespace
}  // namespace barge::testing
