// A `vm backup` killed while it copies (issue 20 §3): the next run keeps the
// killed run's checkpoint, asks libvirt what changed since it, keeps the
// staged clusters below the first change (checked against their digests)
// and reads only the rest; the point restores to the disk as it is then.
// Without the killed run's checkpoint, or with --no-resume, it starts over,
// saying why.
#include <chrono>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "formats/manifest.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_runner.h"
#include "orchestrate/vm/vm_backup.h"
#include "orchestrate/vm/vm_orphans.h"
#include "tests/testing/testing.h"
#include "tests/vm_libvirt_env.h"

namespace barge::testing {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;

class VmResumeTest : public VmTestBase {
 protected:
  // Defines `dom`, starts it paused, makes tracker t1 for it and writes
  // `data` bytes of 0x11 from its start.
  void Prepare(TestDomain& dom, const std::string& data) {
    ASSERT_NO_FATAL_FAILURE(dom.Define(dir_.path().string()));
    dom.StartPaused();
    RunOk(Barge("tracker create t1 --domain " + dom.name()));
    dom.Write(0x11, "0", data);
    dom.Flush();
  }
  // Runs `vm backup` of `domain` in a child process, slowed down (each
  // progress report waits), and SIGKILLs it once half of its work was
  // copied and the journal had a moment to catch up. Returns the checkpoint
  // the killed run made (libvirt's list without `known`).
  std::string KillMidCopy(const std::string& domain, const std::string& known) {
    KillHalfway(domain);
    std::string all = Checkpoints(domain);
    std::string made;
    size_t pos = 0;
    while (pos < all.size()) {
      size_t end = all.find('\n', pos);
      std::string name = all.substr(pos, end - pos);
      if (name != known) made = name;
      pos = end + 1;
    }
    EXPECT_FALSE(made.empty()) << all;
    return made;
  }
  // Runs `vm backup` of `domain` in a child process, slowed down, and
  // SIGKILLs it once half of its work was copied and journalled.
  void KillHalfway(const std::string& domain) {
    orchestrate::VmBackupRequest req = VmRequest(domain, target_);
    req.copy.chunk_bytes = 1 << 20;
    HeldVmBackup run(req, 1, 2);
    // The destination consumes what was handed to it and journals it.
    const bool reached = run.WaitHeld(std::chrono::milliseconds(2500));
    run.Kill();
    EXPECT_TRUE(reached) << "the child's backup never copied half of its work";
  }
  // A 64 MiB raw disk `raw` for `dom` under CBT (its overlay returned), the
  // domain started paused, tracker t1, `data` bytes of 0x11 written.
  std::string PrepareCbt(TestDomain& dom, const std::string& raw, const std::string& data) {
    RunOk("truncate -s 64M " + ShellQuote(raw) + " && chmod 644 " + ShellQuote(raw));
    dom.Define(dir_.path().string());
    json st = BargeJson("cbt enable --domain " + dom.name() + " --state-dir " + ShellQuote(dir_ / "cbt"));
    EXPECT_EQ(st["state"], "Enabled") << st.dump();
    OpenForQemu(dir_ / "cbt");
    dom.StartPaused();
    RunOk(Barge("tracker create t1 --domain " + dom.name()));
    dom.Write(0x11, "0", data);
    dom.Flush();
    return st["disks"][0]["overlay"];
  }
  // The CBT overlay's bitmaps as qemu-img lists them: name -> flags.
  std::map<std::string, std::set<std::string>> OverlayBitmaps(const std::string& overlay) {
    json info = json::parse(RunOk("qemu-img info -U --output=json " + ShellQuote(overlay)));
    std::map<std::string, std::set<std::string>> out;
    const json& data = info["format-specific"]["data"];
    if (!data.contains("bitmaps")) return out;
    for (const auto& b : data["bitmaps"]) {
      std::set<std::string> flags;
      for (const auto& f : b["flags"]) flags.insert(f.get<std::string>());
      out[b["name"].get<std::string>()] = flags;
    }
    return out;
  }
  // The names of `bitmaps` other than CBT's own and `known`.
  static std::vector<std::string> Others(const std::map<std::string, std::set<std::string>>& bitmaps,
                                         const std::set<std::string>& known) {
    std::vector<std::string> out;
    for (const auto& [name, flags] : bitmaps) {
      if (name != "barge-cbt" && !known.count(name)) out.push_back(name);
    }
    return out;
  }
  // After a committed backup with checkpoint `cp` of a shut-off CBT domain:
  // libvirt and the overlay hold `cp` only (with CBT's bitmap), the overlay
  // checks clean, and point `at` of the chain is the raw disk.
  void ExpectOfflineCommitted(TestDomain& dom, const std::string& raw, const std::string& overlay,
                              const std::string& cp, int at, const std::string& image) {
    EXPECT_EQ(Checkpoints(dom.name()), cp + "\n");
    auto bitmaps = OverlayBitmaps(overlay);
    EXPECT_EQ(bitmaps.size(), 2u);
    EXPECT_TRUE(bitmaps.count(cp));
    EXPECT_TRUE(bitmaps.count("barge-cbt"));
    EXPECT_TRUE(bitmaps[cp].count("auto")) << "the new checkpoint's bitmap is enabled";
    RunOk("qemu-img check -q " + ShellQuote(overlay));
    RunOk("qemu-img check -q " + ShellQuote(image));
    ExpectRestores(target_ + "/" + dom.name() + "/vda", at, raw);
  }
  // Disk 0 of the run `b` resumed what an interrupted run staged: `staged`
  // bytes kept (0: some), the cut at the changes since checkpoint `since`
  // ("" = not asked), and no more than `max_read` bytes read.
  void ExpectResumed(const json& b, uint64_t staged, const std::string& since, uint64_t max_read) {
    const json& d = b["disks"][0];
    ASSERT_TRUE(d.contains("resume")) << b.dump();
    EXPECT_EQ(d["resume"]["resumed"], true) << b.dump();
    if (staged == 0) {
      EXPECT_GT(d["resume"]["staged_bytes"].get<uint64_t>(), 0u) << b.dump();
    } else {
      EXPECT_EQ(d["resume"]["staged_bytes"].get<uint64_t>(), staged) << b.dump();
    }
    if (!since.empty()) {
      EXPECT_NE(d["resume"]["problem"].get<std::string>().find("changed since checkpoint " + since),
                std::string::npos)
          << b.dump();
    }
    EXPECT_LE(d["bytes_read"].get<uint64_t>(), max_read) << b.dump();
    std::cerr << "resumed: " << d["resume"].dump() << ", read " << d["bytes_read"] << "\n";
  }
  json BackupRun(const std::string& domain, CommandResult& run) {
    run = ::barge::testing::Run(Barge("vm backup --domain " + domain + " --target " + ShellQuote(target_) +
                                      " --skip-quiesce --json"));
    EXPECT_EQ(run.exit_code, 0) << run.output;
    if (run.exit_code != 0) return json::object();
    return json::parse(run.stdout_text.substr(run.stdout_text.rfind("{\"event\":\"result\"")));
  }
  // The full `b` did not resume: nothing staged kept, all 56 MiB read, only
  // its own checkpoint left, and it is the disk.
  void ExpectStartedOver(TestDomain& dom, const std::string& disk, const json& b) {
    const json& d = b["disks"][0];
    ASSERT_TRUE(d.contains("resume")) << b.dump();
    EXPECT_EQ(d["resume"]["resumed"], false) << b.dump();
    EXPECT_EQ(d["resume"]["staged_bytes"], 0) << b.dump();
    EXPECT_GE(d["bytes_read"].get<uint64_t>(), 56 * kMiB) << b.dump();
    EXPECT_EQ(Checkpoints(dom.name()), b["checkpoint"].get<std::string>() + "\n");
    ExpectPointIsDisk(dom, disk, 0, d["image"]);
  }
  // Shuts the domain off (gracefully: the disk file is complete) and
  // compares point `at` of its vda chain with the disk; checks the image.
  // `chain`: the vda chain folder ("" = the one vm backup --target makes).
  void ExpectPointIsDisk(TestDomain& dom, const std::string& disk, int at, const std::string& image,
                         const std::string& chain = "") {
    dom.Destroy();
    std::string flat = dir_ / "flat.raw";
    RunOk("qemu-img convert -O raw " + ShellQuote(disk) + " " + ShellQuote(flat));
    ExpectRestores(chain.empty() ? target_ + "/" + dom.name() + "/vda" : chain, at, flat);
    RunOk("qemu-img check -q " + ShellQuote(image));
    fs::remove(flat);
  }
};

// The first (full) backup killed halfway; a write below and one beyond
// what it staged; the next run resumes the full: staged bytes kept, less
// than the disk read, the point is the disk as it is now, the killed run's
// checkpoint is gone and the next incremental continues from the new one.
TEST_F(VmResumeTest, KilledFullResumesWithTheChangesSince) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("resume-full", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom, "56M"));
  const std::string c1 = KillMidCopy(dom.name(), "");
  ASSERT_FALSE(c1.empty());
  ASSERT_TRUE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  ASSERT_TRUE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume-work"));
  // Changed since the killed run: one cluster it staged, one it did not reach.
  dom.Write(0x22, "12M", "64k");
  dom.Write(0x33, "60M", "1M");
  dom.Flush();

  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_NE(run.stderr_text.find("kept its checkpoint " + c1), std::string::npos) << run.stderr_text;
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  // Kept: the staged clusters below the first changed one (12 MiB).
  ASSERT_NO_FATAL_FAILURE(ExpectResumed(b1, 12 * kMiB, c1, 64 * kMiB - 12 * kMiB));
  // The tracker is on the new checkpoint; the killed run's is gone.
  const std::string c2 = b1["checkpoint"];
  EXPECT_EQ(Checkpoints(dom.name()), c2 + "\n");
  EXPECT_FALSE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  EXPECT_FALSE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume-work"));
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 0, b1["disks"][0]["image"]));

  dom.StartPaused();
  dom.Write(0x44, "30M", "1M");
  dom.Flush();
  CommandResult run2;
  json b2 = BackupRun(dom.name(), run2);
  ASSERT_FALSE(b2.empty());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], c2) << b2.dump();
  EXPECT_FALSE(b2["disks"][0].contains("resume")) << b2.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 1, b2["disks"][0]["image"]));
}

// An incremental killed halfway resumes as an incremental from the
// tracker's checkpoint: its work is what it had plus what changed since
// (a write outside the killed run's work lands in the point too).
TEST_F(VmResumeTest, KilledIncrementalResumesWithTheChangesSince) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("resume-inc", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom, "8M"));
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  const std::string c0 = b0["checkpoint"];
  dom.Write(0x22, "8M", "48M");
  dom.Flush();
  const std::string c1 = KillMidCopy(dom.name(), c0);
  ASSERT_FALSE(c1.empty());
  // The writes come a second after the kill (times have one-second
  // resolution), the resumed run a second after them.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string written_at = formats::NowRfc3339();
  dom.Write(0x33, "12M", "64k");  // staged by the killed run: changed since
  dom.Write(0x44, "60M", "1M");   // not in the killed run's work at all
  dom.Flush();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));

  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], c0) << b1.dump();
  // The work: 8M..56M and 60M..61M; the first 4 MiB came from the staged image.
  ASSERT_NO_FATAL_FAILURE(ExpectResumed(b1, 4 * kMiB, "", 46 * kMiB));
  const std::string c2 = b1["checkpoint"];
  EXPECT_EQ(Checkpoints(dom.name()), c2 + "\n");
  // Issue 36, item 2: the point holds the disk as of c2, so its time and id
  // are the resumed run's; a restore at the writes' time gets point 0.
  std::ifstream manifest(b1["disks"][0]["manifest"].get<std::string>());
  const json m1 = json::parse(manifest, nullptr, false);
  const std::string started = m1["started_at"];
  EXPECT_GT(started, written_at) << m1.dump();
  EXPECT_EQ(m1["id"].get<std::string>().substr(0, 5), "0001-");
  EXPECT_EQ(m1["image"], m1["id"].get<std::string>() + ".qcow2");
  std::string compact;
  for (char c : started) {
    if (c != '-' && c != ':') compact += c;
  }
  EXPECT_EQ(m1["id"], "0001-" + compact);
  const json at = RunResult(BargeBinary() + " restore --json " + ShellQuote(target_ + "/" + dom.name() + "/vda") +
                            " --at " + written_at + " --to " + ShellQuote(dir_ / "at.raw") + " --no-sync");
  EXPECT_EQ(at["position"], 0) << at.dump();
  fs::remove(dir_ / "at.raw");
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 1, b1["disks"][0]["image"]));

  dom.StartPaused();
  dom.Write(0x55, "30M", "1M");
  dom.Flush();
  CommandResult run2;
  json b2 = BackupRun(dom.name(), run2);
  ASSERT_FALSE(b2.empty());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], c2) << b2.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 2, b2["disks"][0]["image"]));
}

// The killed run's checkpoint deleted by hand: what changed since it cannot
// be known, so the next run starts over (a warning says why) and reads all.
TEST_F(VmResumeTest, StartsOverWhenTheKilledRunsCheckpointIsGone) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("resume-gone", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom, "56M"));
  const std::string c1 = KillMidCopy(dom.name(), "");
  ASSERT_FALSE(c1.empty());
  RunOk(std::string(kVirsh) + "domjobabort " + dom.name());
  RunOk(std::string(kVirsh) + "checkpoint-delete " + dom.name() + " " + c1);
  dom.Write(0x22, "12M", "64k");
  dom.Flush();

  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_NE(run.stderr_text.find("staged data not reusable: checkpoint " + c1 + " of the interrupted run is gone"),
            std::string::npos)
      << run.stderr_text;
  ASSERT_NO_FATAL_FAILURE(ExpectStartedOver(dom, disk, b1));
}

// --no-resume: the killed run's checkpoint and staged data go, the run
// reads everything and says why it did not resume.
TEST_F(VmResumeTest, NoResumeStartsOver) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("resume-no", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom, "56M"));
  const std::string c1 = KillMidCopy(dom.name(), "");
  ASSERT_FALSE(c1.empty());

  CommandResult run = ::barge::testing::Run(Barge("vm backup --domain " + dom.name() + " --target " +
                                                  ShellQuote(target_) + " --skip-quiesce --no-resume --json"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  json b1 = json::parse(run.stdout_text.substr(run.stdout_text.rfind("{\"event\":\"result\"")));
  EXPECT_NE(run.stderr_text.find("deleted its uncommitted checkpoint " + c1), std::string::npos) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("disk vda: staged data not reusable: resuming is off, starting over"),
            std::string::npos)
      << run.stderr_text;
  ASSERT_NO_FATAL_FAILURE(ExpectStartedOver(dom, disk, b1));
}

// A run whose connection to the export is lost for good (QEMU's NBD server
// stopped halfway, so reconnecting fails until the few retries are spent)
// fails, keeping what a killed run keeps: its checkpoint, the staged
// image, journal and work set, and its run record. The next run resumes
// from them as from a killed run's (issue 20 §3: "connection lost for good").
TEST_F(VmResumeTest, LostConnectionResumesOnTheNextRun) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("resume-lost", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom, "56M"));

  orchestrate::VmBackupRequest req = VmRequest(dom.name(), target_);
  req.copy.chunk_bytes = 1 << 20;
  req.copy.nbd_retry.attempts = 2;
  req.copy.nbd_retry.max_time = std::chrono::milliseconds(3000);
  req.copy.nbd_retry.stall_timeout = std::chrono::milliseconds(2000);
  HeldVmBackup held(req, 1, 2);
  // The destination consumes what was handed to it and journals it.
  const bool reached = held.WaitHeld(std::chrono::milliseconds(2500));
  ASSERT_TRUE(reached) << "the child's backup never copied half of its work";
  // QEMU's NBD server goes (libvirt's job stays): for good, as far as the
  // run can tell.
  RunOk(std::string(kVirsh) + "qemu-monitor-command " + dom.name() + " --hmp nbd_server_stop");
  bool failed = false;
  const std::string message = held.Release(&failed);
  ASSERT_TRUE(failed) << message;
  std::cerr << "lost-connection run: " << message << "\n";
  EXPECT_NE(message.find("NBD connection lost"), std::string::npos) << message;
  EXPECT_NE(message.find("the next vm backup of domain '" + dom.name() + "' resumes from them"), std::string::npos)
      << message;
  const std::string c1 = Checkpoints(dom.name());
  ASSERT_FALSE(c1.empty());
  ASSERT_EQ(c1.find('\n'), c1.size() - 1) << c1;
  EXPECT_NE(message.find("checkpoint " + c1.substr(0, c1.size() - 1) + " are kept"), std::string::npos) << message;
  ASSERT_TRUE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  ASSERT_TRUE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume-work"));
  EXPECT_EQ(RunOk(std::string(kVirsh) + "domjobinfo " + dom.name()).find("Backup"), std::string::npos);
  // Not committed: the tracker has no checkpoint yet.
  const json t = BargeJson("tracker show t1")["tracker"];
  EXPECT_FALSE(t.contains("latest_checkpoint") && t["latest_checkpoint"].is_object() &&
               t["latest_checkpoint"].contains("name"))
      << t.dump();
  // doctor sees what the next run resumes from.
  const json job = BargeJson("doctor --domain " + dom.name())["backup_job"];
  EXPECT_EQ(job["state"], "orphaned") << job.dump();
  EXPECT_NE(job["message"].get<std::string>().find("resumes from them"), std::string::npos) << job.dump();
  dom.Write(0x22, "40M", "64k");  // beyond what was staged
  dom.Flush();

  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_NE(run.stderr_text.find("lost its NBD connection and kept what it staged"), std::string::npos)
      << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("kept its checkpoint " + c1.substr(0, c1.size() - 1)), std::string::npos)
      << run.stderr_text;
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectResumed(b1, 0, "", 56 * kMiB - 1));
  const std::string c2 = b1["checkpoint"];
  EXPECT_EQ(Checkpoints(dom.name()), c2 + "\n");
  EXPECT_FALSE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 0, b1["disks"][0]["image"]));

  dom.StartPaused();
  dom.Write(0x44, "30M", "1M");
  dom.Flush();
  CommandResult run2;
  json b2 = BackupRun(dom.name(), run2);
  ASSERT_FALSE(b2.empty());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], c2) << b2.dump();
  EXPECT_EQ(Checkpoints(dom.name()), b2["checkpoint"].get<std::string>() + "\n");
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 1, b2["disks"][0]["image"]));
}

// A pull-mode full killed halfway, then the domain shut down cleanly (SIGTERM:
// QEMU stores the killed run's checkpoint bitmap C1 in the CBT overlay, as
// on a host's reboot). The next run is offline and resumes from what was
// staged: the changes since C1 come from the overlay's bitmap. At its
// commit C1 is gone from libvirt and the overlay; the next offline
// incremental follows.
TEST_F(VmResumeTest, KilledPullRunResumesOfflineAfterShutdown) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string raw = dir_ / "disk.raw";
  TestDomain dom("resume-off", {{"vda", raw, "raw"}});
  const std::string overlay = PrepareCbt(dom, raw, "56M");
  ASSERT_FALSE(overlay.empty());
  const std::string c1 = KillMidCopy(dom.name(), "");
  ASSERT_FALSE(c1.empty());
  ASSERT_TRUE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  dom.Write(0x22, "12M", "64k");  // staged by the killed run: changed since
  dom.Write(0x33, "60M", "1M");   // not reached by it
  dom.Flush();
  dom.Destroy();  // SIGTERM: QEMU stores its bitmaps on the way out
  auto before = OverlayBitmaps(overlay);
  ASSERT_TRUE(before.count(c1)) << "QEMU stored the killed run's bitmap";
  EXPECT_FALSE(before[c1].count("in-use"));

  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_NE(run.stderr_text.find("kept its checkpoint " + c1), std::string::npos) << run.stderr_text;
  EXPECT_EQ(b1["mode"], "offline") << b1.dump();
  EXPECT_EQ(b1["backup_type"], "full") << b1.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectResumed(b1, 12 * kMiB, c1, 64 * kMiB - 12 * kMiB));
  EXPECT_FALSE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  const std::string c2 = b1["checkpoint"];
  ASSERT_NO_FATAL_FAILURE(ExpectOfflineCommitted(dom, raw, overlay, c2, 0, b1["disks"][0]["image"]));

  dom.StartPaused();
  dom.Write(0x44, "30M", "1M");
  dom.Flush();
  dom.Destroy();
  CommandResult run2;
  json b2 = BackupRun(dom.name(), run2);
  ASSERT_FALSE(b2.empty());
  EXPECT_EQ(b2["mode"], "offline") << b2.dump();
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], c2) << b2.dump();
  EXPECT_FALSE(b2["disks"][0].contains("resume")) << b2.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectOfflineCommitted(dom, raw, overlay, b2["checkpoint"], 1, b2["disks"][0]["image"]));
}

// An offline incremental killed halfway: it had added its checkpoint's
// bitmap C to the overlay before reading, so the next offline run resumes
// from C, also after the domain ran and wrote below and beyond what was
// staged (QEMU records the writes in C too).
TEST_F(VmResumeTest, KilledOfflineRunResumesOffline) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string raw = dir_ / "disk.raw";
  TestDomain dom("resume-offoff", {{"vda", raw, "raw"}});
  const std::string overlay = PrepareCbt(dom, raw, "8M");
  ASSERT_FALSE(overlay.empty());
  json b0 = Backup(dom.name());
  ASSERT_EQ(b0["backup_type"], "full") << b0.dump();
  const std::string c0 = b0["checkpoint"];
  dom.Write(0x22, "8M", "48M");
  dom.Flush();
  dom.Destroy();

  // Killed, nothing runs in between: resumed as it was.
  KillHalfway(dom.name());
  std::vector<std::string> made = Others(OverlayBitmaps(overlay), {c0});
  ASSERT_EQ(made.size(), 1u) << "the killed run's bitmap C in the overlay";
  EXPECT_EQ(Checkpoints(dom.name()), c0 + "\n") << "libvirt learns of C only at the commit";
  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_NE(run.stderr_text.find("kept its checkpoint " + made[0]), std::string::npos) << run.stderr_text;
  EXPECT_EQ(b1["mode"], "offline") << b1.dump();
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(b1["parent_checkpoint"], c0) << b1.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectResumed(b1, 0, "", 48 * kMiB - 1));
  const std::string c1 = b1["checkpoint"];
  ASSERT_NO_FATAL_FAILURE(ExpectOfflineCommitted(dom, raw, overlay, c1, 1, b1["disks"][0]["image"]));

  // Killed again; the domain runs and writes in between, then shuts down.
  dom.StartPaused();
  dom.Write(0x33, "8M", "48M");
  dom.Flush();
  dom.Destroy();
  KillHalfway(dom.name());
  made = Others(OverlayBitmaps(overlay), {c1});
  ASSERT_EQ(made.size(), 1u);
  dom.StartPaused();
  dom.Write(0x44, "12M", "64k");  // staged by the killed run: changed since
  dom.Write(0x55, "60M", "1M");   // not in its work at all
  dom.Flush();
  dom.Destroy();
  CommandResult run2;
  json b2 = BackupRun(dom.name(), run2);
  ASSERT_FALSE(b2.empty());
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  EXPECT_EQ(b2["parent_checkpoint"], c1) << b2.dump();
  // The work: 8M..56M and 60M..61M; the first 4 MiB came from the staged image.
  ASSERT_NO_FATAL_FAILURE(ExpectResumed(b2, 4 * kMiB, made[0], 46 * kMiB));
  ASSERT_NO_FATAL_FAILURE(ExpectOfflineCommitted(dom, raw, overlay, b2["checkpoint"], 2, b2["disks"][0]["image"]));
}

// An offline run killed, then the domain started: the pull-mode run cannot
// ask libvirt what changed since C (it never defined it) and starts over,
// saying why; the stray bitmap C does not disturb libvirt's checkpoint.
// The next offline backup removes the stray.
TEST_F(VmResumeTest, KilledOfflineRunThenPullStartsOverAndStrayGoes) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string raw = dir_ / "disk.raw";
  TestDomain dom("resume-offpull", {{"vda", raw, "raw"}});
  const std::string overlay = PrepareCbt(dom, raw, "56M");
  ASSERT_FALSE(overlay.empty());
  dom.Destroy();
  KillHalfway(dom.name());
  std::vector<std::string> made = Others(OverlayBitmaps(overlay), {});
  ASSERT_EQ(made.size(), 1u);
  dom.StartPaused();
  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_EQ(b1["mode"], "pull") << b1.dump();
  EXPECT_NE(run.stderr_text.find("staged data not reusable: checkpoint " + made[0] + " of the interrupted run is gone"),
            std::string::npos)
      << run.stderr_text;
  ASSERT_NO_FATAL_FAILURE(ExpectStartedOver(dom, raw, b1));  // shuts it off
  auto bitmaps = OverlayBitmaps(overlay);
  EXPECT_TRUE(bitmaps.count(made[0])) << "the stray stays while QEMU runs";
  EXPECT_FALSE(bitmaps[made[0]].count("in-use"));

  CommandResult run2;
  json b2 = BackupRun(dom.name(), run2);
  ASSERT_FALSE(b2.empty());
  EXPECT_EQ(b2["mode"], "offline") << b2.dump();
  EXPECT_EQ(b2["backup_type"], "incremental") << b2.dump();
  ASSERT_NO_FATAL_FAILURE(ExpectOfflineCommitted(dom, raw, overlay, b2["checkpoint"], 1, b2["disks"][0]["image"]));
}

// An offline run that fails (an error, not a kill) leaves no bitmap it
// added, no run record and no staged data; the next run is a plain one.
TEST_F(VmResumeTest, FailedOfflineRunLeavesNoBitmap) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string raw = dir_ / "disk.raw";
  TestDomain dom("resume-offfail", {{"vda", raw, "raw"}});
  const std::string overlay = PrepareCbt(dom, raw, "8M");
  ASSERT_FALSE(overlay.empty());
  json b0 = Backup(dom.name());
  const std::string c0 = b0["checkpoint"];
  dom.Write(0x22, "8M", "8M");
  dom.Flush();
  dom.Destroy();
  auto before = OverlayBitmaps(overlay);
  std::string failed = VmBackupFailingAt(orchestrate::VmBackupFaults::Point::kAfterRead, dom.name(), target_, true);
  EXPECT_NE(failed.find("injected"), std::string::npos) << failed;
  EXPECT_EQ(OverlayBitmaps(overlay), before);
  RunOk("qemu-img check -q " + ShellQuote(overlay));
  EXPECT_EQ(Checkpoints(dom.name()), c0 + "\n");
  EXPECT_FALSE(fs::exists(target_ + "/" + dom.name() + "/vda/.backup.barge-resume"));
  EXPECT_FALSE(fs::exists(orchestrate::BackupJobRecordPath(catalog_, dom.name())));
  CommandResult run;
  json b1 = BackupRun(dom.name(), run);
  ASSERT_FALSE(b1.empty());
  EXPECT_EQ(b1["backup_type"], "incremental") << b1.dump();
  EXPECT_EQ(run.stderr_text.find("earlier backup"), std::string::npos) << run.stderr_text;
  ASSERT_NO_FATAL_FAILURE(ExpectOfflineCommitted(dom, raw, overlay, b1["checkpoint"], 1, b1["disks"][0]["image"]));
}

// A policy run of a domain source (quiesce: false: the test domain has no
// guest agent) killed halfway through its full resumes through the same
// code: the next `barge run` keeps the killed run's checkpoint and the
// staged clusters below the first change, says so on its record, reads
// only the rest, and the point is the disk; the killed checkpoint is gone.
TEST_F(VmResumeTest, KilledPolicyRunOfADomainResumes) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string disk = MakeQcow2("d.qcow2");
  TestDomain dom("resume-policy", {{"vda", disk, "qcow2"}});
  ASSERT_NO_FATAL_FAILURE(Prepare(dom, "24M"));
  const std::string file = dir_ / "p.yaml";
  std::ofstream(file) << "name: nightly\nsources:\n  - domain: " << dom.name()
                      << "\n    tracker: t1\n    quiesce: false\ntargets: [" << target_
                      << "]\nfree_space_multiple: 0\n";
  auto policy = orchestrate::LoadPolicy(Env::Default(), file);
  ASSERT_TRUE(policy.ok()) << policy.error().ToString();
  ASSERT_FALSE(policy->sources[0].quiesce);
  const std::string chain = target_ + "/nightly/" + dom.name() + "/vda";
  {
    // `barge run --policy FILE --force`, in a child, held halfway and killed.
    HeldVmBackup run(
        [&](HeldVmBackup::ProgressFn progress) {
          orchestrate::RunOptions o;
          o.catalog_path = catalog_;
          o.manual = true;
          o.copy.chunk_bytes = 1 << 20;
          o.copy.progress = std::move(progress);
          auto report = orchestrate::RunPolicyOnce(Env::Default(), *policy, o);
          if (!report.ok()) return report.error().ToString();
          return report->failed == 0 ? std::string() : report->sources[0].record.error;
        },
        1, 2);
    const bool reached = run.WaitHeld(std::chrono::milliseconds(2500));
    run.Kill();
    ASSERT_TRUE(reached) << "the child's policy run never copied half of its work";
  }
  const std::string c1 = Checkpoints(dom.name());
  ASSERT_EQ(std::count(c1.begin(), c1.end(), '\n'), 1) << c1;
  ASSERT_TRUE(fs::exists(chain + "/.backup.barge-resume"));
  dom.Write(0x22, "10M", "64k");  // staged by the killed run: changed since
  dom.Flush();

  const auto started = std::chrono::steady_clock::now();
  CommandResult run = ::barge::testing::Run(Barge("run --policy " + ShellQuote(file) + " --force --json"));
  std::cerr << "resumed policy run in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() << " s\n";
  ASSERT_EQ(run.exit_code, 0) << run.output;
  json r = json::parse(run.stdout_text.substr(run.stdout_text.rfind("{\"event\":\"result\"")));
  ASSERT_EQ(r["sources"].size(), 1u) << r.dump();
  const json& s = r["sources"][0];
  EXPECT_EQ(s["result"], "success") << r.dump();
  EXPECT_EQ(s["type"], "full") << r.dump();
  // Kept: the staged clusters below the first changed one (10 MiB of 24).
  const std::string note = s["error"];
  EXPECT_NE(note.find("kept its checkpoint " + c1.substr(0, c1.size() - 1)), std::string::npos) << note;
  EXPECT_NE(note.find("disk vda: resumed from " + std::to_string(10 * kMiB) + " bytes staged"), std::string::npos)
      << note;
  EXPECT_LE(s["bytes_read"].get<uint64_t>(), 15 * kMiB) << r.dump();
  std::cerr << "resumed policy run: " << note << ", read " << s["bytes_read"] << " of 24 MiB data\n";
  // Only the new run's checkpoint is left; the staged files are gone.
  const std::string c2 = Checkpoints(dom.name());
  EXPECT_EQ(std::count(c2.begin(), c2.end(), '\n'), 1) << c2;
  EXPECT_NE(c2, c1);
  EXPECT_FALSE(fs::exists(chain + "/.backup.barge-resume"));
  EXPECT_FALSE(fs::exists(chain + "/.backup.barge-resume-work"));
  ASSERT_EQ(s["points"].size(), 1u) << r.dump();
  const std::string image = chain + "/" + s["points"][0]["id"].get<std::string>() + ".qcow2";
  ASSERT_TRUE(fs::exists(image)) << image;
  ASSERT_NO_FATAL_FAILURE(ExpectPointIsDisk(dom, disk, 0, image, chain));
}

}  // namespace
}  // namespace barge::testing
