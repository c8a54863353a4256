// A real libvirtd restart under a running domain (not the simulation in
// VmBackupTest.CheckpointRedefineAfterMetadataLoss): the daemon is stopped
// with SIGTERM while QEMU keeps running, started again, and the next backups
// are checked. Restarting the daemon disturbs every other libvirt test, so
// tests/CMakeLists.txt registers VmLibvirtdRestartTest.* with RUN_SERIAL.
#include <signal.h>

#include <filesystem>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/testing/barge_child.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Where the QEMU driver keeps checkpoint metadata (one folder per domain,
// one XML per checkpoint).
constexpr const char* kCheckpointStateDir = "/var/lib/libvirt/qemu/checkpoint/";

bool QemuRunning(const std::string& domain) {
  return Run("kill -0 $(cat /var/run/libvirt/qemu/" + domain + ".pid)").exit_code == 0;
}

// Starts libvirtd again on scope exit, whatever happened in between, and
// waits until it has probed QEMU, so a failed test does not leave the daemon
// down for the tests after it.
struct LibvirtdBackOnExit {
  ~LibvirtdBackOnExit() {
    ::testing::AssertionResult up = EnsureLibvirtd();
    if (!up) ADD_FAILURE() << up.message();
  }
};

class VmLibvirtdRestartTest : public VmTestBase {
 protected:
  void SetUp() override {
    VmTestBase::SetUp();
    BARGE_REQUIRE_TOOL("qemu-img");
  }
  // The disk's bytes now, as raw: the domain's writes flushed first, the
  // image read beside the running QEMU (-U: no lock taken).
  std::string FlatNow(TestDomain& dom, const std::string& disk, const std::string& name) {
    dom.Flush();
    std::string flat = dir_ / name;
    RunOk("qemu-img convert -U -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
    return flat;
  }
  std::string CheckpointNames(const std::string& domain) {
    return RunOk(std::string(kVirsh) + "checkpoint-list " + domain + " --name");
  }
};

// libvirtd restarted after its checkpoint metadata was lost: the running
// QEMU still has the bitmap, libvirt no longer knows the checkpoint; barge
// redefines it from the catalog and the next backup is incremental. Then a
// plain restart (metadata kept): incremental again, no redefine needed.
TEST_F(VmLibvirtdRestartTest, RestartWithCheckpointMetadataLostThenRedefine) {
  std::string disk = dir_ / "d.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 64M");
  TestDomain dom("restart", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  LibvirtdBackOnExit back_on_exit;  // destroyed before `dom`, which needs libvirtd
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  std::string cp0 = b0["checkpoint"];
  dom.Write(0x11, "20M", "1M");

  // Stop libvirtd; QEMU keeps running. Remove the checkpoint metadata. The
  // lock keeps other test processes from starting the daemon meanwhile.
  std::string meta_dir = kCheckpointStateDir + dom.name();
  ASSERT_TRUE(fs::exists(meta_dir + "/" + cp0 + ".xml")) << "checkpoint metadata not where expected: " << meta_dir;
  {
    LibvirtdLock lock;
    ASSERT_TRUE(lock.held()) << lock.error();
    ASSERT_TRUE(StopLibvirtd(lock));
    EXPECT_TRUE(QemuRunning(dom.name()));
    fs::remove_all(meta_dir);
    ASSERT_TRUE(EnsureLibvirtd(lock)) << "libvirtd did not start again";
  }
  EXPECT_TRUE(QemuRunning(dom.name()));
  EXPECT_NE(RunOk(std::string(kVirsh) + "domstate " + dom.name()).find("paused"), std::string::npos);
  EXPECT_EQ(CheckpointNames(dom.name()).find(cp0), std::string::npos) << "libvirt should have lost " << cp0;
  json doc = BargeJson("doctor --domain " + dom.name());
  EXPECT_EQ(doc["tracker_checkpoints"][0]["in_libvirt"], false) << doc.dump();

  json re = BargeJson("checkpoint redefine --domain " + dom.name());
  ASSERT_EQ(re["checkpoints"].size(), 1u) << re.dump();
  EXPECT_EQ(re["checkpoints"][0]["action"], "redefined") << re.dump();
  EXPECT_NE(CheckpointNames(dom.name()).find(cp0), std::string::npos);
  json b1 = Backup(dom.name());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], cp0);
  EXPECT_LE(b1["disks"][0]["bytes_read"].get<uint64_t>(), 2u << 20) << b1.dump();
  std::string chain = target_ + "/" + dom.name() + "/vda";
  std::string p1 = FlatNow(dom, disk, "p1.raw");
  ExpectRestores(chain, 1, p1);

  // A plain restart, metadata kept: libvirt reloads the checkpoint itself.
  std::string cp1 = b1["checkpoint"];
  dom.Write(0x22, "30M", "2M");
  {
    LibvirtdLock lock;
    ASSERT_TRUE(lock.held()) << lock.error();
    ASSERT_TRUE(StopLibvirtd(lock));
    EXPECT_TRUE(QemuRunning(dom.name()));
    ASSERT_TRUE(EnsureLibvirtd(lock)) << "libvirtd did not start again";
  }
  EXPECT_NE(CheckpointNames(dom.name()).find(cp1), std::string::npos);
  json b2 = Backup(dom.name());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], cp1);
  EXPECT_LE(b2["disks"][0]["bytes_read"].get<uint64_t>(), 3u << 20) << b2.dump();
  dom.Destroy();  // graceful: the disk file is complete
  std::string flat = dir_ / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  ExpectRestores(chain, 2, flat);
  ExpectRestores(chain, 1, p1);
}

// libvirtd killed (SIGKILL) while a vm backup runs (barge held still
// meanwhile, so the kill lands mid-backup whatever the machine's speed).
// Returns barge's exit code and writes its output to `log`.
int BackupWithLibvirtdKilled(const std::string& domain, const std::vector<std::string>& args, const std::string& log) {
  LibvirtdLock lock;
  BargeChild run(args, log);
  const bool seen = run.WaitFor([&] {
    return ::barge::testing::Run(std::string(kVirsh) + "domjobinfo " + domain).output.find("Backup") !=
           std::string::npos;
  });
  EXPECT_TRUE(seen) << "the backup ended before its job was seen: " << Slurp(log);
  ::kill(run.pid(), SIGSTOP);
  EXPECT_TRUE(KillLibvirtd(lock));
  ::kill(run.pid(), SIGCONT);
  const int code = run.Wait();
  std::cerr << "libvirtd killed mid-backup; barge exited " << code << "\n" << Slurp(log) << "\n";
  ::testing::AssertionResult up = EnsureLibvirtd(lock);
  EXPECT_TRUE(up) << up.message();
  return code;
}

// With a tracker, the run needs libvirtd after the copy (its checkpoint):
// barge's call to the dead daemon fails and barge exits 1 with its error
// line; it does not die of SIGPIPE on the closed socket. Nothing
// half-written: no staged file, no point left, and the next backup (daemon
// back) ends the orphaned job and succeeds.
TEST_F(VmLibvirtdRestartTest, LibvirtdKilledMidBackupFailsCleanly) {
  std::string disk = dir_ / "k.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 256M && qemu-io -f qcow2 -c 'write -P 0x3c 0 192M' " +
        ShellQuote(disk) + " >/dev/null");
  TestDomain dom("lvkill", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  const std::string log = dir_ / "backup.log";
  LibvirtdBackOnExit back;
  const int code = BackupWithLibvirtdKilled(
      dom.name(),
      {"vm", "backup", "--domain", dom.name(), "--target", target_, "--skip-quiesce", "--catalog", catalog_, "--json"},
      log);
  EXPECT_EQ(code, 1) << "128+13 is SIGPIPE: " << Slurp(log);
  EXPECT_NE(Slurp(log).find("barge: "), std::string::npos) << Slurp(log);
  const std::string chain = target_ + "/" + dom.name() + "/vda";
  for (const auto& e : fs::recursive_directory_iterator(target_)) {
    if (e.path().filename() == ".lock") continue;  // the chain folder's lock file stays by design
    EXPECT_FALSE(e.is_regular_file()) << "left by the failed run: " << e.path();
  }
  json next = Backup(dom.name());
  EXPECT_EQ(next["backup_type"], "full") << next.dump();
  RunOk(BargeBinary() + " verify " + ShellQuote(chain));
  dom.Destroy();
}

// Without a tracker the copy is all the run needs: the point is complete and
// committed (exit 0), but the job libvirt could not end is left; its run
// record stays, so the next backup ends it as an orphan instead of
// refusing a "foreign" job.
TEST_F(VmLibvirtdRestartTest, LibvirtdKilledMidBackupJobEndedByNextRun) {
  std::string disk = dir_ / "n.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + ShellQuote(disk) + " 256M && qemu-io -f qcow2 -c 'write -P 0x3c 0 192M' " +
        ShellQuote(disk) + " >/dev/null");
  TestDomain dom("lvkilln", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  const std::string log = dir_ / "backup.log";
  LibvirtdBackOnExit back;
  const int code = BackupWithLibvirtdKilled(
      dom.name(),
      {"vm", "backup", "--domain", dom.name(), "--target", target_, "--skip-quiesce", "--catalog", catalog_, "--json"},
      log);
  EXPECT_TRUE(code == 0 || code == 1) << "128+13 is SIGPIPE: " << Slurp(log);
  const std::string chain = target_ + "/" + dom.name() + "/vda";
  if (fs::exists(chain)) RunOk(BargeBinary() + " verify " + ShellQuote(chain));
  json next = Backup(dom.name());
  EXPECT_EQ(next["disks"][0]["virtual_size"].get<uint64_t>(), 256u << 20) << next.dump();
  RunOk(BargeBinary() + " verify " + ShellQuote(chain));
  dom.Destroy();
}

}  // namespace
}  // namespace barge::testing
