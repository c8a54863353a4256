// What a killed `vm backup` leaves in libvirt (its backup job, checkpoint,
// scratch folder and socket) and checkpoints whose bitmaps are gone (issue
// 25): doctor reports them, the next vm backup cleans up barge's own and
// runs normally, and what is not barge's is left alone with a clear error.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "orchestrate/vm/vm_backup.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The VM backup's fault seam in a child process: once every disk was read
// (the job still runs, nothing committed), tells the parent through `fd`
// and waits to be killed.
class StopAfterRead final : public orchestrate::VmBackupFaults {
 public:
  explicit StopAfterRead(int fd) : fd_(fd) {}
  Status At(Point point) override {
    if (point != Point::kAfterRead) return OkStatus();
    char c = 'r';
    (void)!::write(fd_, &c, 1);
    for (;;) ::pause();
  }

 private:
  int fd_;
};

class VmOrphanTest : public VmTestBase {};

// A vm backup SIGKILLed mid-run (every disk read, its job still running)
// leaves the job, its checkpoint, scratch folder and socket. doctor reports
// the orphaned job; the next vm backup aborts it, removes them and the
// uncommitted checkpoint, and is a prompt incremental from the tracker's
// checkpoint that restores to the disk as it is (before the fix it waited
// 30 s and failed "cannot acquire state change lock").
TEST_F(VmOrphanTest, KilledBackupIsAbortedAndCleanedUpByTheNextRun) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("orphan", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  const std::string cp0 = b0["checkpoint"];
  dom.Write(0xaa, "10M", "1M");

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    StopAfterRead stop(fds[1]);
    orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
    req.faults = &stop;
    (void)orchestrate::RunVmBackup(Env::Default(), req);
    ::_exit(3);  // the run ended without reaching the seam
  }
  ::close(fds[1]);
  pollfd p{fds[0], POLLIN, 0};
  char c = 0;
  bool reached = ::poll(&p, 1, 180 * 1000) == 1 && ::read(fds[0], &c, 1) == 1;
  ::close(fds[0]);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(reached) << "the child's backup never reached the point after reading";

  // What the killed run left: its job, its checkpoint, its scratch folder.
  EXPECT_NE(RunOk(std::string(kVirsh) + "domjobinfo " + dom.name()).find("Backup"), std::string::npos);
  std::string before = Checkpoints(dom.name());
  EXPECT_NE(before.find(cp0), std::string::npos) << before;
  EXPECT_EQ(std::count(before.begin(), before.end(), '\n'), 2) << before;
  const std::string scratch_prefix = "barge-scratch-" + dom.name() + "-";
  EXPECT_EQ(EntriesStartingWith(orchestrate::kDefaultScratchRoot, scratch_prefix).size(), 1u);
  const std::string socket_prefix = "barge-backup-" + dom.name() + "-";
  EXPECT_EQ(EntriesStartingWith("/tmp", socket_prefix).size(), 1u);

  json doc = BargeJson("doctor --domain " + dom.name());
  EXPECT_EQ(doc["backup_job"]["state"], "orphaned") << doc.dump();
  EXPECT_EQ(doc["backup_job"]["job_active"], true) << doc.dump();
  EXPECT_EQ(doc["backup_job"]["owner_pid"], child) << doc.dump();
  std::string text = RunOk(Barge("doctor --domain " + dom.name()));
  EXPECT_NE(text.find("backup job: orphaned"), std::string::npos) << text;

  auto t0 = std::chrono::steady_clock::now();
  CommandResult run = ::barge::testing::Run(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                                " --skip-quiesce --json"));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LT(seconds, 25) << run.output;
  EXPECT_NE(run.stderr_text.find("was killed"), std::string::npos) << run.stderr_text;
  json b1 = json::parse(run.stdout_text.substr(run.stdout_text.rfind("{\"event\":\"result\"")));
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], cp0) << b1.dump();

  // Nothing of the killed run is left; the tracker's checkpoint is the new run's.
  EXPECT_EQ(Checkpoints(dom.name()), b1["checkpoint"].get<std::string>() + "\n");
  EXPECT_TRUE(EntriesStartingWith(orchestrate::kDefaultScratchRoot, scratch_prefix).empty());
  EXPECT_TRUE(EntriesStartingWith("/tmp", socket_prefix).empty());
  EXPECT_EQ(BargeJson("doctor --domain " + dom.name())["backup_job"]["state"], "none");
  json backups = BargeJson("vm backups --domain " + dom.name())["backups"];
  ASSERT_EQ(backups.size(), 3u) << backups.dump();
  EXPECT_EQ(backups[1]["result"], "failed") << backups.dump();

  dom.Destroy();  // graceful: the disk file is now complete
  std::string flat = dir_ / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 1, flat);
}

// A backup job barge did not start (an administrator's, another tool's) is
// never touched: vm backup fails at once saying so, the job runs on.
TEST_F(VmOrphanTest, ForeignBackupJobIsLeftAloneWithAClearError) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("foreign", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  std::string sock = dir_ / "other.sock";
  std::string xml = dir_ / "backup.xml";
  RunOk("printf '%s' " +
        ShellQuote("<domainbackup mode='pull'><server transport='unix' socket='" + sock +
                   "'/><disks><disk name='vda' backup='yes' type='file'><scratch file='" +
                   (dir_ / "other-scratch.qcow2") + "'/></disk></disks></domainbackup>") +
        " > " + ShellQuote(xml));
  RunOk(std::string(kVirsh) + "backup-begin " + dom.name() + " " + ShellQuote(xml));

  auto t0 = std::chrono::steady_clock::now();
  CommandResult run = ::barge::testing::Run(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                                " --skip-quiesce"));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_LT(seconds, 25) << run.output;
  EXPECT_NE(run.output.find("did not start"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(sock), std::string::npos) << run.output;
  json doc = BargeJson("doctor --domain " + dom.name());
  EXPECT_EQ(doc["backup_job"]["state"], "foreign") << doc.dump();
  // The job runs on, its scratch file in place.
  EXPECT_NE(RunOk(std::string(kVirsh) + "domjobinfo " + dom.name()).find("Backup"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir_ / "other-scratch.qcow2"));
  RunOk(std::string(kVirsh) + "domjobabort " + dom.name());
}

// Checkpoints whose bitmaps are gone (removed behind libvirt's back here)
// and that no tracker names: doctor flags them; the next vm backup warns,
// removes the one barge made (its naming; metadata only) and keeps the
// administrator's; the backup itself is incremental from the tracker's
// checkpoint and restores right. Before, they were kept forever, silently.
TEST_F(VmOrphanTest, CheckpointsWithoutBitmapsAreFlaggedAndBargesRemoved) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("stale", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
  dom.StartPaused();
  RunOk(Barge("tracker create t1 --domain " + dom.name()));
  dom.Write(0xee, "1M", "4M");
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  const std::string cp0 = b0["checkpoint"];

  const std::string barges = "t1-20200101T000000Z";  // as barge names them
  const std::string admins = "admin-cp";
  for (const std::string& name : {barges, admins}) {
    std::string xml = dir_ / (name + ".xml");
    RunOk("printf '%s' " +
          ShellQuote("<domaincheckpoint><name>" + name +
                     "</name><disks><disk name='vda' checkpoint='bitmap'/></disks></domaincheckpoint>") +
          " > " + ShellQuote(xml));
    RunOk(std::string(kVirsh) + "checkpoint-create " + dom.name() + " " + ShellQuote(xml));
    RunOk(std::string(kVirsh) + "qemu-monitor-command " + dom.name() + " " +
          ShellQuote(R"({"execute":"block-dirty-bitmap-remove","arguments":{"node":"libvirt-1-format","name":")" +
                     name + R"("}})"));
  }

  json doc = BargeJson("doctor --domain " + dom.name());
  ASSERT_EQ(doc["stale_checkpoints"].size(), 2u) << doc.dump();
  for (const auto& c : doc["stale_checkpoints"]) {
    EXPECT_EQ(c["barge"], c["name"] == barges) << doc.dump();
    EXPECT_EQ(c["disks"], json::array({"vda"})) << doc.dump();
  }
  std::string text = RunOk(Barge("doctor --domain " + dom.name()));
  EXPECT_NE(text.find("checkpoint " + barges + ": STALE"), std::string::npos) << text;

  dom.Write(0xaa, "10M", "1M");
  CommandResult run = ::barge::testing::Run(Barge("vm backup --domain " + dom.name() + " --target " + ShellQuote(target_) +
                                " --skip-quiesce --json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.stderr_text.find(barges + " of domain '" + dom.name() + "' has lost its bitmaps; barge made it and removed it"),
            std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find(admins + " of domain '" + dom.name() + "' has lost its bitmaps; barge did not make it"),
            std::string::npos) << run.stderr_text;
  json b1 = json::parse(run.stdout_text.substr(run.stdout_text.rfind("{\"event\":\"result\"")));
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], cp0) << b1.dump();

  std::string left = Checkpoints(dom.name());
  EXPECT_EQ(left.find(barges), std::string::npos) << left;
  EXPECT_NE(left.find(admins), std::string::npos) << left;
  EXPECT_NE(left.find(b1["checkpoint"].get<std::string>()), std::string::npos) << left;
  json after = BargeJson("doctor --domain " + dom.name());
  ASSERT_EQ(after["stale_checkpoints"].size(), 1u) << after.dump();
  EXPECT_EQ(after["stale_checkpoints"][0]["name"], admins);

  dom.Destroy();
  std::string flat = dir_ / "flat.raw";
  RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
  ExpectRestores(target_ + "/" + dom.name() + "/vda", 1, flat);
}

}  // namespace
}  // namespace barge::testing
