// The vm texts a person reads: doctor, a disk's plan, a backup's summary,
// trackers, checkpoint redefinition (and its failures), CBT, instant restore.
#include "orchestrate/vm/vm_text.h"

#include <gtest/gtest.h>

#include "formats/units.h"

namespace barge::orchestrate {
namespace {

bool Has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(VmTextTest, DiskPlanSaysWhatBecomesOfStagedData) {
  DiskPlan p;
  p.disk = "vda";
  p.incremental = true;
  p.reason = "bitmap ok";
  EXPECT_EQ(DiskPlanText(p), "  vda: incremental (bitmap ok)\n");
  p.staged = "resume";
  p.resume_from = "cp1";
  EXPECT_EQ(DiskPlanText(p), "  vda: incremental (bitmap ok), resumes the data staged by an interrupted run "
                             "(checkpoint cp1)\n");
  p.staged = "start over";
  p.resume_refused = "journal unreadable";
  EXPECT_TRUE(Has(DiskPlanText(p), ", starts over: staged data not reusable: journal unreadable\n"));
}

TEST(VmTextTest, DoctorNamesStaleCheckpointsAndTheNextBackup) {
  DoctorReport r;
  r.domain = "vm1";
  r.state = "running";
  r.trackers.resize(1);
  r.trackers[0].name = "t1";
  r.trackers[0].needs_full = true;
  r.trackers[0].needs_full_reason = "new disk";
  r.tracker_checkpoints.resize(1);
  r.tracker_checkpoints[0].name = "t1-x";
  r.tracker_checkpoints[0].disks = {{"vda", "no"}};
  r.next_mode = "pull";
  r.next_tracker = "t1";
  r.next_backup.resize(1);
  r.next_backup[0].disk = "vda";
  r.next_backup[0].reason = "new disk";
  BackupJobState job;
  std::vector<StaleCheckpoint> stale(2);
  stale[0].name = "other";
  stale[1].name = "t1-y";
  stale[1].barges = true;
  EXPECT_EQ(DoctorText(r, job, stale),
            "domain vm1 (running)\n"
            "tracker t1: checkpoint (none), needs full: new disk\n"
            "libvirt checkpoints: (none)\n"
            "checkpoint t1-x: MISSING in libvirt\n"
            "  vda: no\n"
            "checkpoint other: STALE, its bitmaps are gone (not barge's: 'virsh checkpoint-delete vm1 other "
            "--metadata')\n"
            "checkpoint t1-y: STALE, its bitmaps are gone (barge's: the next vm backup removes it)\n"
            "next backup (tracker t1), pull mode:\n"
            "  vda: full (new disk)\n");
  job.state = "orphaned";
  job.message = "a killed run's job";
  EXPECT_TRUE(Has(DoctorText(r, job, {}), "backup job: orphaned: a killed run's job\n"));
}

TEST(VmTextTest, DryRunPlanWithAndWithoutRefusal) {
  VmBackupForecast f;
  f.tracker = "t1";
  f.mode = "offline";
  f.disks.resize(1);
  f.disks[0].disk = "vda";
  f.disks[0].reason = "r";
  EXPECT_EQ(VmBackupPlanText("vm1", f),
            "vm backup of vm1 (dry run), tracker t1, offline, from the CBT overlays:\n  vda: full (r)\n");
  VmBackupForecast refused;
  refused.refusal = "no target";
  EXPECT_EQ(VmBackupPlanText("vm1", refused), "vm backup of vm1 (dry run): refused: no target\n");
}

TEST(VmTextTest, BackupSummarySaysAResume) {
  VmBackupResult r;
  r.backup_type = "Full";
  r.reason = "first";
  VmBackupDisk d;
  d.disk = "vda";
  d.image_path = "/b/vda/1.qcow2";
  d.bytes_read = 2048;
  d.resume = pipeline::ResumeNote{};
  d.resume->resumed = true;
  d.resume->staged_bytes = 1024;
  r.disks = {d};
  const std::string text = VmBackupResultText("vm1", r);
  EXPECT_EQ(text.rfind("Full backup of vm1 (first)\n  checkpoint: (none, no tracker)\n", 0), 0u) << text;
  EXPECT_TRUE(Has(text, "  vda: full, read " + formats::HumanBytes(2048))) << text;
  EXPECT_TRUE(Has(text, "    resumed from " + formats::HumanBytes(1024) + " staged by an interrupted run\n")) << text;
}

TEST(VmTextTest, Trackers) {
  TrackerRecord t;
  t.name = "t1";
  t.domain = "vm1";
  t.latest_checkpoint = "cp";
  t.checkpoint_created_at = "2026-01-02T00:00:00Z";
  t.host = "qemu+ssh://h/system";
  EXPECT_EQ(TrackerLine(t), "t1\tvm1\tcp\n");
  EXPECT_TRUE(Has(TrackerText(t), "latest checkpoint: cp at 2026-01-02T00:00:00Z on qemu+ssh://h/system\n"));
  t.latest_checkpoint.clear();
  t.needs_full = true;
  t.needs_full_reason = "why";
  EXPECT_EQ(TrackerLine(t), "t1\tvm1\t-\tneeds full: why\n");
  EXPECT_TRUE(Has(TrackerText(t), "latest checkpoint: (none)\n"));
  EXPECT_TRUE(Has(TrackerText(t), "next backup:       full (why)\n"));
}

TEST(VmTextTest, RedefineFailuresAreOneSentence) {
  const std::vector<RedefineOutcome> ok = {{"t1", "cp1", "present", ""}, {"t2", "", "none", ""}};
  EXPECT_EQ(RedefineText(ok), "t1: cp1 present\nt2: (no checkpoint) none\n");
  EXPECT_EQ(RedefineFailures(ok), "");
  const std::vector<RedefineOutcome> bad = {{"t1", "cp1", "failed", "no XML"}, {"t2", "cp2", "failed", "refused"}};
  EXPECT_EQ(RedefineText(bad), "t1: cp1 failed (no XML; its next backup is full)\n"
                               "t2: cp2 failed (refused; its next backup is full)\n");
  EXPECT_EQ(RedefineFailures(bad), "t1 cp1: no XML; t2 cp2: refused");
}

TEST(VmTextTest, CbtAndInstantRestore) {
  CbtStatus s;
  s.domain = "vm1";
  s.state = "Enabled";
  s.disks.resize(1);
  s.disks[0].disk = "vda";
  s.disks[0].data_file = "/d.raw";
  s.disks[0].overlay = "/o.qcow2";
  EXPECT_EQ(CbtStatusText(s), "CBT for vm1: Enabled\n  vda: /o.qcow2 over /d.raw\n");
  InstantRestoreResult r;
  r.point_id = "p1";
  r.disk = "/new.raw";
  r.target = "vda";
  r.abandoned = true;
  EXPECT_EQ(InstantRestoreText("vm1", r), "abandoned the instant restore of vm1: vda is back on its original disk; "
                                          "the overlay and /new.raw are removed\n");
  r.abandoned = false;
  EXPECT_TRUE(Has(InstantRestoreText("vm1", r), "domain vm1 runs on /new.raw (vda, point p1; "));
}

}  // namespace
}  // namespace barge::orchestrate
