// VM backups of running domains (TCG, paused, no guest OS) in the cases of
// issue 25 that the main VM backup test does not cover: a raw disk without
// CBT next to a qcow2 disk, the pull job's scratch files outside a target
// QEMU cannot see or reach (--scratch-dir), and progress events under --json.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kRawReason =
    "raw disk without CBT: full every time (no checkpoint bitmap; 'barge cbt enable' gives incrementals)";

class VmBackupRawTest : public VmTestBase {
 protected:
  std::string MakeRaw(const std::string& name) {
    std::string p = dir_ / name;
    RunOk("truncate -s 64M " + ShellQuote(p));
    return p;
  }
  // A disk's bytes now, as raw (the domain's writes flushed first).
  std::string Flat(TestDomain& dom, int disk, const std::string& image, const std::string& name) {
    dom.Flush(disk);
    std::string out = dir_ / name;
    RunOk("qemu-img convert -U -O raw " + ShellQuote(image) + " " + ShellQuote(out));
    return out;
  }
  static const json& DiskOf(const json& result, const std::string& disk) {
    for (const auto& d : result["disks"]) {
      if (d["disk"] == disk) return d;
    }
    static const json none = json::object();
    ADD_FAILURE() << "no disk " << disk << " in " << result.dump();
    return none;
  }
  // The names of the disks libvirt's checkpoint `cp` holds a bitmap for.
  std::set<std::string> CheckpointBitmapDisks(const std::string& domain, const std::string& cp) {
    std::string xml = RunOk(std::string(kVirsh) + "checkpoint-dumpxml " + domain + " " + cp + " --no-domain");
    std::set<std::string> out;
    for (const char* d : {"vda", "vdb"}) {
      if (xml.find("name='" + std::string(d) + "' checkpoint='bitmap'") != std::string::npos) out.insert(d);
    }
    return out;
  }
};

// A running domain with a qcow2 disk (vda) and a raw disk without CBT
// (vdb): libvirt refuses a checkpoint bitmap on the raw disk, so vdb is read
// in full every time (the reason with the hint in the result, the record
// and the manifest) and left out of the checkpoint, while vda keeps its
// incrementals. A backup of vdb alone makes no checkpoint and leaves the
// tracker where it was. Every point restores to the disk at that point.
TEST_F(VmBackupRawTest, RawDiskWithoutCbtIsFullEveryTimeQcow2StaysIncremental) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string a = MakeQcow2("a.qcow2");
  std::string raw = MakeRaw("b.raw");
  TestDomain dom("raw", {{"vda", a, "qcow2"}, {"vdb", raw, "raw"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xaa, "1M", "4M", 0);
  dom.Write(0xbb, "8M", "2M", 1);

  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["disks"].size(), 2u) << b0.dump();
  EXPECT_EQ(b0["backup_type"], "full");
  EXPECT_EQ(DiskOf(b0, "vda")["reason"], "tracker empty");
  EXPECT_EQ(DiskOf(b0, "vdb")["backup_type"], "full");
  EXPECT_EQ(DiskOf(b0, "vdb")["reason"], kRawReason);
  EXPECT_NE(b0["reason"].get<std::string>().find(kRawReason), std::string::npos) << b0.dump();
  const std::string cp0 = b0["checkpoint"];
  ASSERT_FALSE(cp0.empty());
  EXPECT_EQ(CheckpointBitmapDisks(dom.name(), cp0), std::set<std::string>{"vda"});
  json t = BargeJson("tracker show t1")["tracker"];
  EXPECT_EQ(t["latest_checkpoint"]["name"], cp0);
  ASSERT_EQ(t["latest_checkpoint"]["disks"].size(), 1u) << t.dump();
  EXPECT_EQ(t["latest_checkpoint"]["disks"][0]["name"], "vda");
  {
    std::ifstream in(DiskOf(b0, "vdb")["manifest"].get<std::string>());
    json m = json::parse(in);
    EXPECT_EQ(m["reason"], kRawReason);
  }
  std::string a0 = Flat(dom, 0, a, "a0.raw");
  std::string r0 = Flat(dom, 1, raw, "r0.raw");

  dom.Write(0x11, "20M", "1M", 0);
  dom.Write(0x22, "30M", "1M", 1);
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();  // vdb is full
  EXPECT_EQ(DiskOf(b1, "vda")["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(DiskOf(b1, "vda")["reason"], "incremental since " + cp0);
  EXPECT_LE(DiskOf(b1, "vda")["bytes_read"].get<uint64_t>(), 2u << 20);
  EXPECT_EQ(DiskOf(b1, "vdb")["backup_type"], "full");
  EXPECT_EQ(DiskOf(b1, "vdb")["reason"], kRawReason);
  const std::string cp1 = b1["checkpoint"];
  EXPECT_EQ(CheckpointBitmapDisks(dom.name(), cp1), std::set<std::string>{"vda"});
  std::string a1 = Flat(dom, 0, a, "a1.raw");
  std::string r1 = Flat(dom, 1, raw, "r1.raw");

  // The record says it too.
  json recs = BargeJson("vm backups --domain " + dom.name())["backups"];
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1]["result"], "success");
  bool record_has_reason = false;
  for (const auto& d : recs[1]["disks"]) record_has_reason |= d["disk"] == "vdb" && d["reason"] == kRawReason;
  EXPECT_TRUE(record_has_reason) << recs[1].dump();
  // And the text output.
  std::string text = RunOk(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                                 " --skip-quiesce --disks vdb"));
  EXPECT_NE(text.find("cbt enable"), std::string::npos) << text;

  // vdb alone: no checkpoint; the tracker and its checkpoint stay for vda.
  json t2 = BargeJson("tracker show t1")["tracker"];
  EXPECT_EQ(t2["latest_checkpoint"]["name"], cp1) << t2.dump();
  std::string cps = RunOk(std::string(kVirsh) + "checkpoint-list " + dom.name() + " --name");
  EXPECT_NE(cps.find(cp1), std::string::npos) << cps;
  std::string r2 = Flat(dom, 1, raw, "r2.raw");
  dom.Write(0x33, "40M", "1M", 0);
  json b3 = Backup(dom.name(), "--disks vda");
  EXPECT_EQ(b3["backup_type"], "incremental") << b3.dump();
  EXPECT_EQ(b3["reason"], "incremental since " + cp1);
  std::string a3 = Flat(dom, 0, a, "a3.raw");

  std::string vda = target_ + "/" + dom.name() + "/vda", vdb = target_ + "/" + dom.name() + "/vdb";
  ExpectRestores(vda, 0, a0);
  ExpectRestores(vda, 1, a1);
  ExpectRestores(vda, 2, a3);
  ExpectRestores(vdb, 0, r0);
  ExpectRestores(vdb, 1, r1);
  ExpectRestores(vdb, 2, r2);
  RunOk(BargeBinary() + " verify " + ShellQuote(vda) + " --all");
  RunOk(BargeBinary() + " verify " + ShellQuote(vdb) + " --all");
}

// The pull job's scratch files never go into the target: by default into a
// run's folder under /var/tmp, with --scratch-dir into one under that
// folder, removed after the run and after a failed one. A target that
// QEMU's user cannot traverse (0700, root's) and a target that is a mount
// QEMU's mount namespace does not have (mounted by barge's own namespace
// after the domain started: "No such file or directory" before) both back
// up; a missing --scratch-dir is refused before anything starts.
TEST_F(VmBackupRawTest, ScratchDirDefaultsOutsideATargetQemuCannotReach) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("unshare");
  if (::getuid() != 0) GTEST_SKIP() << "needs root (a target QEMU's user cannot reach, a mount namespace)";
  std::string a = MakeQcow2("a.qcow2");
  TestDomain dom("scratch", {{"vda", a, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  const std::string scratch_prefix = "barge-scratch-" + dom.name() + "-";
  auto no_default_scratch = [&] { return EntriesStartingWith(orchestrate::kDefaultScratchRoot, scratch_prefix).empty(); };

  // 1. A target only root can traverse.
  std::string closed = dir_ / "closed";
  fs::create_directories(closed);
  ASSERT_EQ(::chmod(closed.c_str(), 0700), 0);
  dom.Write(0xaa, "1M", "4M");
  json b0 = BargeJson("vm backup --domain " + dom.name() + " --target " + ShellQuote(closed) + " --skip-quiesce");
  EXPECT_EQ(b0["backup_type"], "full") << b0.dump();
  EXPECT_TRUE(no_default_scratch());
  EXPECT_FALSE(fs::exists(closed + "/.barge-scratch-" + dom.name()));
  std::string a0 = dir_ / "a0.raw";
  dom.Flush();
  RunOk("qemu-img convert -U -O raw " + ShellQuote(a) + " " + ShellQuote(a0));
  ExpectRestores(closed + "/" + dom.name() + "/vda", 0, a0);

  // 2. A target mounted after the domain started, in a mount namespace of
  // barge's own (QEMU's sees an empty folder there). Its bind source holds
  // what barge wrote through the mount.
  std::string mount_point = dir_ / "mnt";
  std::string volume = dir_ / "volume";
  fs::create_directories(mount_point);
  fs::create_directories(volume);
  dom.Write(0xbb, "8M", "1M");
  std::string json_out = dir_ / "ns-backup.json";
  std::string in_namespace = "mount --bind " + ShellQuote(volume) + " " + ShellQuote(mount_point) + " && " +
                             Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(mount_point) +
                                   " --skip-quiesce --json");
  CommandResult ns = ::barge::testing::Run("unshare --mount --propagation private sh -c " +
                                           ShellQuote(in_namespace) + " > " + ShellQuote(json_out));
  ASSERT_EQ(ns.exit_code, 0) << ns.output << RunOk("cat " + ShellQuote(json_out));
  std::ifstream in(json_out);
  std::string stdout_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json b1 = ResultOf(stdout_text);
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();  // another target: a new chain
  EXPECT_TRUE(fs::is_empty(mount_point));
  EXPECT_TRUE(fs::exists(volume + "/" + dom.name() + "/vda"));
  EXPECT_TRUE(no_default_scratch());

  // 3. --scratch-dir: a folder of the caller's; the run's folder in it is
  // there during the copy (libvirt's scratch file in it) and gone after, on
  // success and on failure.
  std::string scratch = dir_ / "scratch";
  fs::create_directories(scratch);
  OpenForQemu(scratch);
  for (bool fail : {true, false}) {
    dom.Write(0xcc, "16M", "1M");
    FailVmBackupOnce fault(orchestrate::VmBackupFaults::Point::kAfterRead);
    orchestrate::VmBackupRequest req = VmRequest(dom.name(), closed);
    req.scratch_dir = scratch;
    if (fail) req.faults = &fault;
    bool saw_scratch_file = false;
    req.progress = [&](const std::string& disk, uint64_t, uint64_t) {
      for (const std::string& run_scratch : EntriesStartingWith(scratch, scratch_prefix)) {
        saw_scratch_file |= disk == "vda" && fs::exists(run_scratch + "/vda.qcow2");
      }
    };
    auto run = orchestrate::RunVmBackup(Env::Default(), req);
    EXPECT_EQ(run.ok(), !fail) << (run.ok() ? std::string() : run.error().ToString());
    EXPECT_TRUE(saw_scratch_file) << "no scratch file in " << scratch << "/" << scratch_prefix << "* during the copy";
    EXPECT_TRUE(EntriesStartingWith(scratch, scratch_prefix).empty()) << (fail ? "after the failed run" : "after the run");
    EXPECT_TRUE(fs::exists(scratch));
    EXPECT_TRUE(no_default_scratch());
  }

  // 4. A --scratch-dir that does not exist: refused, nothing created.
  std::string missing = dir_ / "no-such-scratch";
  json e = RunError(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(closed) +
                          " --skip-quiesce --json --scratch-dir " + ShellQuote(missing)),
                    1);
  EXPECT_EQ(e["code"], "NotFound") << e.dump();
  EXPECT_EQ(e["file"], missing) << e.dump();
  EXPECT_FALSE(fs::exists(missing));
}

// `vm backup --json` reports each disk's copy as `progress` events (job
// "vm backup", the disk named), at least one per disk and a last one at
// 100 %, every line valid under docs/json.md (json_schema_test.py --check).
TEST_F(VmBackupRawTest, JsonProgressEventsPerDisk) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("python3");
  std::string a = MakeQcow2("a.qcow2", "256M");
  std::string b = MakeQcow2("b.qcow2");
  TestDomain dom("progress", {{"vda", a, "qcow2"}, {"vdb", b, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  dom.Write(0xaa, "0", "64M", 0);
  dom.Write(0xbb, "1M", "4M", 1);
  CommandResult r = ::barge::testing::Run(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                              " --skip-quiesce --json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, std::vector<json>> by_disk;
  for (const json& e : Events(r.stdout_text)) {
    if (e["event"] != "progress") continue;
    EXPECT_EQ(e["command"], "vm backup") << e.dump();
    EXPECT_EQ(e["job"], "vm backup") << e.dump();
    by_disk[e.value("disk", "")].push_back(e);
    // The rate counts from the job's start, not from a disk's first report
    // (which divided the bytes already done by almost no time): a TCG
    // domain's export on this machine is nowhere near 20 GiB/s.
    EXPECT_LT(e["bytes_per_second"].get<uint64_t>(), uint64_t{20} << 30) << e.dump();
  }
  ASSERT_EQ(by_disk.size(), 2u) << r.stdout_text;
  for (const char* disk : {"vda", "vdb"}) {
    ASSERT_FALSE(by_disk[disk].empty()) << disk << ":\n" << r.stdout_text;
    const json& last = by_disk[disk].back();
    EXPECT_EQ(last["done_bytes"], last["total_bytes"]) << last.dump();
    EXPECT_EQ(last["percent"], 100.0) << last.dump();
  }
  EXPECT_GE(by_disk["vda"].back()["done_bytes"].get<uint64_t>(), 64u << 20);
  // The whole stream against the schemas.
  std::string saved = dir_ / "vm-backup.json";
  std::ofstream(saved) << r.stdout_text;
  RunOk("python3 " + ShellQuote(std::string(BARGE_SOURCE_DIR) + "/tests/json_schema_test.py") +
        " --check 0 vm backup < " + ShellQuote(saved));
}

}  // namespace
}  // namespace barge::testing
