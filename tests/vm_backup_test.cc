// VM backups through libvirt (TCG, paused domains, no guest OS): trackers,
// checkpoints, full/incremental, fallbacks, refusals and failure cleanup,
// every point restored and compared with the disk at that point.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

class VmBackupTest : public VmTestBase {
 protected:
  // The disk's bytes now (the domain's writes flushed first).
  std::string Snapshot(TestDomain& dom, const std::string& raw, const std::string& name) {
    dom.Flush();
    std::string copy = dir_ / name;
    RunOk("cp --sparse=always " + ShellQuote(raw) + " " + ShellQuote(copy));
    return copy;
  }
};

// CBT on a raw disk: full, then two incrementals, every point byte-identical.
TEST_F(VmBackupTest, CbtRawDiskFullThenIncrementalsRestoreEveryPoint) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string raw = dir_ / "disk.raw";
  // Owned by root, 0644: `cbt enable` must give QEMU's user access itself.
  RunOk("truncate -s 64M " + ShellQuote(raw) + " && chmod 644 " + ShellQuote(raw));
  TestDomain dom("cbt", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
  EXPECT_EQ(st["state"], "Enabled");
  OpenForQemu(dir_ / "cbt");
  dom.StartPaused();
  EXPECT_EQ(BargeJson("cbt status --domain " + dom.name())["state"], "Enabled");
  RunOk(Barge("tracker create t1 --domain " + dom.name()));

  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  EXPECT_EQ(b0["backup_type"], "full");
  EXPECT_EQ(b0["reason"], "tracker empty");
  std::string p0 = Snapshot(dom, raw, "p0.raw");
  json t = BargeJson("tracker show t1");
  EXPECT_EQ(t["tracker"]["latest_checkpoint"]["name"], b0["checkpoint"]);
  EXPECT_EQ(t["tracker"]["latest_checkpoint"]["disks"][0]["name"], "vda");

  dom.Write(0xaa, "10M", "1M");
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_LE(b1["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20);
  std::string p1 = Snapshot(dom, raw, "p1.raw");

  dom.Write(0x55, "2M", "64k");
  dom.Write(0x00, "40M", "1M");
  json b2 = Backup(dom.name());
  EXPECT_EQ(b2["backup_type"], "incremental");
  std::string p2 = Snapshot(dom, raw, "p2.raw");

  std::string chain = target_ + "/" + dom.name() + "/vda";
  ExpectRestores(chain, 0, p0);
  ExpectRestores(chain, 1, p1);
  ExpectRestores(chain, 2, p2);
  // libvirt keeps only the tracker's latest checkpoint.
  std::string cps = RunOk(std::string(kVirsh) + "checkpoint-list " + dom.name() + " --name");
  EXPECT_NE(cps.find(b2["checkpoint"].get<std::string>()), std::string::npos) << cps;
  EXPECT_EQ(cps.find(b0["checkpoint"].get<std::string>()), std::string::npos) << cps;

  json recs = BargeJson("vm backups --domain " + dom.name())["backups"];
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[2]["result"], "success");
  // The catalog can be rebuilt from the manifests alone.
  RunOk(Barge("catalog rebuild --target " + ShellQuote(target_)));
  json rebuilt = BargeJson("vm backups --domain " + dom.name())["backups"];
  ASSERT_EQ(rebuilt.size(), 3u);
  EXPECT_EQ(rebuilt[1]["type"], "incremental");
  EXPECT_EQ(rebuilt[1]["checkpoint"], b1["checkpoint"]);

  // Disable gives the raw disk back to its owner from before enable.
  struct stat before_disable {};
  ASSERT_EQ(::stat(raw.c_str(), &before_disable), 0);
  dom.Destroy();
  EXPECT_EQ(BargeJson("cbt disable --domain " + dom.name())["state"], "Disabled");
  struct stat after {};
  ASSERT_EQ(::stat(raw.c_str(), &after), 0);
  EXPECT_EQ(after.st_uid, ::getuid());
  EXPECT_EQ(after.st_gid, ::getgid());
  if (::getuid() == 0) {
    EXPECT_NE(before_disable.st_uid, 0u) << "enable should have handed the disk to QEMU's user";
  }
}

// A shut-off domain with CBT: the offline backup reads the overlay's
// checkpoint bitmap directly, rotates it in place (qemu-img check clean) and
// defines the new checkpoint, so the next online backup is incremental.
TEST_F(VmBackupTest, OfflineBackupFromCbtOverlayThenOnlineIncremental) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string raw = dir_ / "disk.raw";
  // Owned by root, 0644: `cbt enable` must give QEMU's user access itself.
  RunOk("truncate -s 64M " + ShellQuote(raw) + " && chmod 644 " + ShellQuote(raw));
  TestDomain dom("offline", {{"vda", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
  ASSERT_EQ(st["state"], "Enabled");
  std::string overlay = st["disks"][0]["overlay"];
  OpenForQemu(dir_ / "cbt");
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full");
  std::string p0 = Snapshot(dom, raw, "p0.raw");

  dom.Write(0x77, "20M", "2M");
  std::string p1 = Snapshot(dom, raw, "p1.raw");
  dom.Destroy();  // SIGTERM first: QEMU stores its bitmaps on the way out
  // A failure after reading changes nothing: no files, same tracker, the
  // overlay keeps the old checkpoint's bitmap (the new one's, added before
  // the reads, is removed again; the file may keep the clusters it took).
  auto bitmaps_of = [&overlay] {
    return json::parse(RunOk("qemu-img info --output=json " + ShellQuote(overlay)))["format-specific"]["data"]
        ["bitmaps"];
  };
  json bitmaps_before = bitmaps_of();
  std::string failed = VmBackupFailingAt(orchestrate::VmBackupFaults::Point::kAfterRead, dom.name(), target_,
                                         /*skip_quiesce=*/false);
  EXPECT_NE(failed, "");
  EXPECT_NE(failed.find("injected"), std::string::npos) << failed;
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["name"], b0["checkpoint"]);
  EXPECT_EQ(bitmaps_of(), bitmaps_before);
  RunOk("qemu-img check -q " + ShellQuote(overlay));
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["mode"], "offline") << b1.dump();
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_LE(b1["disks"][0]["bytes_read"].get<uint64_t>(), 3u << 20);
  EXPECT_EQ(b1["parent_checkpoint"], b0["checkpoint"]);
  // Rotated in place: the new checkpoint's bitmap only, image still clean.
  RunOk("qemu-img check -q " + ShellQuote(overlay));
  json info = json::parse(RunOk("qemu-img info --output=json " + ShellQuote(overlay)));
  std::vector<std::string> names;
  for (const auto& b : info["format-specific"]["data"]["bitmaps"]) names.push_back(b["name"]);
  EXPECT_NE(std::find(names.begin(), names.end(), b1["checkpoint"].get<std::string>()), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), b0["checkpoint"].get<std::string>()), names.end());
  std::string cps = RunOk(std::string(kVirsh) + "checkpoint-list " + dom.name() + " --name");
  EXPECT_NE(cps.find(b1["checkpoint"].get<std::string>()), std::string::npos) << cps;
  EXPECT_EQ(cps.find(b0["checkpoint"].get<std::string>()), std::string::npos) << cps;
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["name"], b1["checkpoint"]);

  dom.StartPaused();
  dom.Write(0x99, "30M", "1M");
  json b2 = Backup(dom.name());
  EXPECT_EQ(b2["mode"], "pull");
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_LE(b2["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20);
  std::string p2 = Snapshot(dom, raw, "p2.raw");
  dom.Destroy();

  std::string chain = target_ + "/" + dom.name() + "/vda";
  ExpectRestores(chain, 0, p0);
  ExpectRestores(chain, 1, p1);
  ExpectRestores(chain, 2, p2);
}

// libvirt lost the checkpoint metadata (what a restarted libvirtd without
// its metadata looks like): redefine from the catalog, next backup incremental.
// A real restart of libvirtd: VmLibvirtdRestartTest (vm_libvirtd_restart_test.cc).
TEST_F(VmBackupTest, CheckpointRedefineAfterMetadataLoss) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("redef", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  std::string cp = b0["checkpoint"];
  RunOk(std::string(kVirsh) + "checkpoint-delete " + dom.name() + " " + cp + " --metadata");
  json doc = BargeJson("doctor --domain " + dom.name());
  EXPECT_EQ(doc["tracker_checkpoints"][0]["in_libvirt"], false);
  EXPECT_EQ(doc["next_backup"][0]["backup_type"], "full");

  json re = BargeJson("checkpoint redefine --domain " + dom.name());
  EXPECT_EQ(re["checkpoints"][0]["action"], "redefined") << re.dump();
  dom.Write(0x11, "20M", "1M");
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  dom.Destroy();  // graceful: the disk file is now complete
  std::string chain = target_ + "/" + dom.name() + "/vda";
  std::string flat = dir_ / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  ExpectRestores(chain, 1, flat);
}

// Two same-size disks swap files between backups (issue 25): the target
// names stay, the files behind them changed. Each disk's next backup is a
// full with the reason, restores to the disk's current content, and every
// chain verifies; never an incremental onto the other disk's chain.
TEST_F(VmBackupTest, SwappedDisksTakeFullsNotMixedChains) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string a = MakeQcow2("a.qcow2");
  std::string b = MakeQcow2("b.qcow2");
  TestDomain dom("swap", {{"vda", a, "qcow2"}, {"vdb", b, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xaa, "1M", "4M", 0);
  dom.Write(0xbb, "8M", "2M", 1);
  json b0 = Backup(dom.name());
  EXPECT_EQ(b0["backup_type"], "full");
  std::map<std::string, std::string> b0_id;  // disk -> its point's id
  for (const auto& d : b0["disks"]) {
    std::ifstream in(d["manifest"].get<std::string>());
    b0_id[d["disk"]] = json::parse(in)["id"];
  }
  // Each disk then gets writes its bitmap records.
  dom.Write(0x11, "20M", "1M", 0);
  dom.Write(0x22, "30M", "1M", 1);
  dom.Destroy();

  // Swap the files behind vda and vdb in the (shut-off) definition.
  std::string xml = RunOk(std::string(kVirsh) + "dumpxml --inactive " + dom.name());
  const std::string fa = "file='" + a + "'", fb = "file='" + b + "'";
  size_t pa = xml.find(fa), pb = xml.find(fb);
  ASSERT_NE(pa, std::string::npos) << xml;
  ASSERT_NE(pb, std::string::npos) << xml;
  ASSERT_LT(pa, pb);
  xml.replace(pb, fb.size(), fa);
  xml.replace(pa, fa.size(), fb);
  std::string swapped = dir_ / "swapped.xml";
  std::ofstream(swapped) << xml;
  RunOk(std::string(kVirsh) + "define " + ShellQuote(swapped));
  dom.StartPaused();
  dom.Write(0x33, "40M", "1M", 0);  // now on b.qcow2
  dom.Write(0x44, "50M", "1M", 1);  // now on a.qcow2

  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  const std::string ca = fs::canonical(a).string(), cb = fs::canonical(b).string();
  ASSERT_EQ(b1["disks"].size(), 2u) << b1.dump();
  for (const auto& d : b1["disks"]) {
    const bool vda = d["disk"] == "vda";
    const std::string now = vda ? cb : ca, was = vda ? ca : cb;
    EXPECT_EQ(d["backup_type"], "full") << d.dump();
    EXPECT_EQ(d["reason"], "disk " + d["disk"].get<std::string>() + " is now " + now + ", was " + was +
                               " (backup " + b0_id[d["disk"]] + "): a new chain starts")
        << d.dump();
    std::ifstream in(d["manifest"].get<std::string>());
    json m = json::parse(in);
    EXPECT_EQ(m["type"], "full") << m.dump();
    EXPECT_EQ(m["reason"], d["reason"]);
    EXPECT_EQ(m["disk_identity"]["source"], now) << m.dump();
  }
  dom.Destroy();  // graceful: the disk files are now complete

  std::string flat_a = dir_ / "flat-a.raw", flat_b = dir_ / "flat-b.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(a) + " " + ShellQuote(flat_a));
  RunOk("qemu-img convert -O raw " + ShellQuote(b) + " " + ShellQuote(flat_b));
  std::string vda = target_ + "/" + dom.name() + "/vda", vdb = target_ + "/" + dom.name() + "/vdb";
  ExpectRestores(vda, 1, flat_b);
  ExpectRestores(vdb, 1, flat_a);
  RunOk(BargeBinary() + " verify " + ShellQuote(vda) + " --all");
  RunOk(BargeBinary() + " verify " + ShellQuote(vdb) + " --all");
  fs::remove(flat_a);
  fs::remove(flat_b);
}

// Issue 36: the same disks' files swapped under their paths while the
// domain is shut off (mv a tmp; mv b a; mv tmp b). The paths behind vda and
// vdb stay, and each file carries its checkpoint's bitmap, so the plan is
// incremental; the sample of the clusters the bitmap calls unchanged finds
// the other disk, and each disk's point is a full naming the replacement,
// restoring to the disk's current content.
TEST_F(VmBackupTest, FilesSwappedUnderTheirPathsTakeFulls) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string a = MakeQcow2("a.qcow2");
  std::string b = MakeQcow2("b.qcow2");
  TestDomain dom("swapf", {{"vda", a, "qcow2"}, {"vdb", b, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xaa, "1M", "4M", 0);
  dom.Write(0xbb, "8M", "2M", 1);
  EXPECT_EQ(Backup(dom.name())["backup_type"], "full");
  dom.Write(0x11, "20M", "1M", 0);
  dom.Write(0x22, "30M", "1M", 1);
  dom.Destroy();
  const std::string tmp = dir_ / "swap.tmp";
  RunOk("mv " + ShellQuote(a) + " " + ShellQuote(tmp) + " && mv " + ShellQuote(b) + " " + ShellQuote(a) +
        " && mv " + ShellQuote(tmp) + " " + ShellQuote(b));
  dom.StartPaused();
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  ASSERT_EQ(b1["disks"].size(), 2u) << b1.dump();
  for (const auto& d : b1["disks"]) {
    EXPECT_EQ(d["backup_type"], "full") << d.dump();
    EXPECT_NE(d["reason"].get<std::string>().find("disk replaced"), std::string::npos) << d.dump();
    std::ifstream in(d["manifest"].get<std::string>());
    json m = json::parse(in);
    EXPECT_EQ(m["type"], "full") << m.dump();
    EXPECT_TRUE(m["parent"].is_null()) << m.dump();
  }
  dom.Destroy();
  std::string flat_a = dir_ / "flat-a.raw", flat_b = dir_ / "flat-b.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(a) + " " + ShellQuote(flat_a));
  RunOk("qemu-img convert -O raw " + ShellQuote(b) + " " + ShellQuote(flat_b));
  std::string vda = target_ + "/" + dom.name() + "/vda", vdb = target_ + "/" + dom.name() + "/vdb";
  ExpectRestores(vda, 1, flat_a);  // path a: the file that was b's
  ExpectRestores(vdb, 1, flat_b);
  RunOk(BargeBinary() + " verify " + ShellQuote(vda) + " --all");
  RunOk(BargeBinary() + " verify " + ShellQuote(vdb) + " --all");
  fs::remove(flat_a);
  fs::remove(flat_b);
}

// QEMU killed: bitmaps inconsistent, the next backup is full with the reason.
TEST_F(VmBackupTest, CrashMakesNextBackupFullBitmapInconsistent) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("crash", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  EXPECT_EQ(Backup(dom.name())["backup_type"], "full");
  dom.Write(0x22, "8M", "1M");
  dom.Kill9();
  dom.StartPaused();
  json doc = BargeJson("doctor --domain " + dom.name());
  EXPECT_EQ(doc["next_backup"][0]["backup_type"], "full") << doc.dump();
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "full");
  EXPECT_EQ(b1["reason"], "bitmap inconsistent");
  dom.Write(0x33, "30M", "1M");
  json b2 = Backup(dom.name());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  dom.Destroy();
  std::string flat = dir_ / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 2, flat);
}

// Force-full, the per-domain lock, quiesce without an agent, a target that
// is too small, and a failure after reading: each leaves the tracker as is.
TEST_F(VmBackupTest, RefusalsAndFailuresLeaveTrackerUnchanged) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("refuse", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "8M");

  // No guest agent: refused unless --skip-quiesce.
  std::string target = ShellQuote(target_);
  auto r = ::barge::testing::Run(Barge("vm backup --domain " + dom.name() + " --target " + target));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--skip-quiesce"), std::string::npos) << r.output;
  EXPECT_TRUE(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"].is_null());

  json b0 = Backup(dom.name());
  std::string cp0 = b0["checkpoint"];
  // Consistency hooks bracket the run (RunWithHooks, as snapshot create).
  const std::string log = dir_ / "hooks.log";
  const std::string hook =
      ShellQuote("echo \"$BARGE_HOOK_PHASE $BARGE_OPERATION $BARGE_DOMAIN $BARGE_HOOK_STATUS\" >> " + ShellQuote(log));
  json b1 = Backup(dom.name(), "--force-full --pre-hook " + hook + " --post-hook " + hook);
  EXPECT_EQ(b1["backup_type"], "full");
  EXPECT_EQ(b1["reason"], "--force-full");
  ASSERT_EQ(b1["hooks"].size(), 2u);
  EXPECT_EQ(RunOk("cat " + ShellQuote(log)),
            "pre vm-backup " + dom.name() + " \npost vm-backup " + dom.name() + " ok\n");
  std::string cp1 = b1["checkpoint"];
  // A failing pre-hook: no backup, the post-hook told so, the tracker as it was.
  fs::remove(log);
  auto aborted = ::barge::testing::Run(Barge("vm backup --skip-quiesce --domain " + dom.name() + " --target " +
                                             ShellQuote(target_) + " --pre-hook 'exit 5' --post-hook " + hook));
  EXPECT_EQ(aborted.exit_code, 1) << aborted.output;
  EXPECT_NE(aborted.output.find("pre-hook"), std::string::npos) << aborted.output;
  EXPECT_EQ(RunOk("cat " + ShellQuote(log)), "post vm-backup " + dom.name() + " aborted\n");
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["name"], cp1);

  // A second backup of the same domain while one runs: refused at once.
  {
    std::string lock = dir_ / ("state/locks/domains/" + dom.name() + ".lock");
    int fd = ::open(lock.c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    auto busy = ::barge::testing::Run("timeout 30 " + Barge("vm backup --skip-quiesce --domain " + dom.name() + " --target " + target));
    ::close(fd);
    EXPECT_NE(busy.exit_code, 0);
    EXPECT_NE(busy.output.find("already running"), std::string::npos) << busy.output;
  }

  // Target too small: refused before anything starts.
  std::string small = dir_ / "small";
  fs::create_directories(small);
  RunOk("mount -t tmpfs -o size=1M tmpfs " + ShellQuote(small));
  auto full = ::barge::testing::Run(Barge("vm backup --skip-quiesce --force-full --domain " + dom.name() + " --target " +
                        ShellQuote(small)));
  ::barge::testing::Run("umount " + ShellQuote(small));
  EXPECT_NE(full.exit_code, 0);
  EXPECT_NE(full.output.find("NoSpace"), std::string::npos) << full.output;

  // A failure after every disk was read: nothing committed, nothing left.
  dom.Write(0x44, "20M", "1M");
  auto before = fs::directory_iterator(target_ + "/" + dom.name() + "/vda");
  size_t files_before = std::distance(before, fs::directory_iterator());
  std::string fail = VmBackupFailingAt(orchestrate::VmBackupFaults::Point::kAfterRead, dom.name(), target_,
                                       /*skip_quiesce=*/true);
  EXPECT_NE(fail, "");
  EXPECT_NE(fail.find("injected"), std::string::npos) << fail;
  auto after = fs::directory_iterator(target_ + "/" + dom.name() + "/vda");
  EXPECT_EQ(static_cast<size_t>(std::distance(after, fs::directory_iterator())), files_before);
  EXPECT_EQ(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"]["name"], cp1);
  std::string cps = RunOk(std::string(kVirsh) + "checkpoint-list " + dom.name() + " --name");
  EXPECT_EQ(cps.find('\n'), cps.rfind('\n')) << "one checkpoint expected: " << cps;
  json recs = BargeJson("vm backups --domain " + dom.name())["backups"];
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.back()["result"], "failed");
  EXPECT_NE(recs.back()["error"].get<std::string>().find("injected"), std::string::npos);

  // And the next backup is a correct incremental from cp1.
  json b2 = Backup(dom.name());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], cp1);
  dom.Destroy();
  std::string flat = dir_ / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 2, flat);
}

// A target folder that does not exist (an unmounted backup volume) is
// refused: NotFound naming it, nothing created, the tracker unchanged, no
// checkpoint in libvirt.
TEST_F(VmBackupTest, MissingTargetRefusedNothingCreated) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("notarget", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "1M");
  const std::string mount = dir_ / "mnt";
  const std::string missing = mount + "/backups";
  auto r = ::barge::testing::Run(Barge("vm backup --skip-quiesce --domain " + dom.name() + " --target " +
                                       ShellQuote(missing)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("NotFound: " + missing + ":"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(mount));
  EXPECT_TRUE(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"].is_null());
  EXPECT_EQ(RunOk(std::string(kVirsh) + "checkpoint-list " + dom.name() + " --name"), "");
  EXPECT_TRUE(BargeJson("vm backups --domain " + dom.name())["backups"].empty());
  // A file where the folder should be: refused as well.
  RunOk("touch " + ShellQuote(mount));
  r = ::barge::testing::Run(Barge("vm backup --skip-quiesce --domain " + dom.name() + " --target " +
                                  ShellQuote(mount)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("not a folder"), std::string::npos) << r.output;
  EXPECT_TRUE(BargeJson("tracker show t1")["tracker"]["latest_checkpoint"].is_null());
}

// Two trackers on one domain and no --tracker: a usage error naming both;
// nothing backed up, no checkpoint. With --tracker the named one advances.
TEST_F(VmBackupTest, TwoTrackersWithoutTrackerFlagIsUsageError) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("twotrackers", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create daily --domain " + dom.name()));
  RunOk(Barge("tracker create weekly --domain " + dom.name()));
  dom.Write(0xee, "1M", "1M");
  auto r = ::barge::testing::Run(Barge("vm backup --skip-quiesce --domain " + dom.name() + " --target " +
                                       ShellQuote(target_)));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_NE(r.output.find("has 2 trackers (daily, weekly)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--tracker"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(target_ + "/" + dom.name()));
  EXPECT_EQ(RunOk(std::string(kVirsh) + "checkpoint-list " + dom.name() + " --name"), "");
  EXPECT_TRUE(BargeJson("vm backups --domain " + dom.name())["backups"].empty());

  json b = Backup(dom.name(), "--tracker weekly");
  EXPECT_EQ(b["tracker"], "weekly");
  EXPECT_EQ(BargeJson("tracker show weekly")["tracker"]["latest_checkpoint"]["name"], b["checkpoint"]);
  EXPECT_TRUE(BargeJson("tracker show daily")["tracker"]["latest_checkpoint"].is_null());
}

// Tracker names are global: a clash names the domain that owns the name.
// A domain libvirt does not know is named as such by cbt disable.
TEST_F(VmBackupTest, TrackerClashNamesOwnerAndUnknownDomainSaysSo) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TestDomain a("owner", {{"vda", MakeQcow2("a.qcow2"), "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(a.Define(dir_.path().string()));
  TestDomain b("other", {{"vda", MakeQcow2("b.qcow2"), "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(b.Define(dir_.path().string()));
  RunOk(Barge("tracker create nightly --domain " + a.name()));
  auto r = ::barge::testing::Run(Barge("tracker create nightly --domain " + b.name()));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tracker 'nightly' exists for domain '" + a.name() + "'"), std::string::npos) << r.output;
  EXPECT_EQ(BargeJson("tracker show nightly")["tracker"]["domain"], a.name());

  const std::string nosuch = "barge-test-" + std::to_string(::getpid()) + "-nosuch";
  r = ::barge::testing::Run(Barge("cbt disable --domain " + nosuch));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("NotFound"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("domain '" + nosuch + "' does not exist"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not enabled"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace barge::testing
