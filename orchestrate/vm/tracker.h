// Backup trackers over libvirt checkpoints: checkpoint names, redefinition
// after libvirt lost its checkpoint metadata, and the doctor's report of
// what the next backup will do.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "formats/manifest.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {

// "<tracker>-<UTC compact timestamp>", e.g. "t1-20261122T150102Z".
std::string NewCheckpointName(const std::string& tracker);

// Per disk of a libvirt checkpoint XML (untrusted: libvirt's reply, or the
// copy kept in the catalog): disk name -> (checkpoint kind, size attribute).
std::map<std::string, std::pair<std::string, std::string>> CheckpointDisks(const std::string& xml);

struct RedefineOutcome {
  std::string tracker;
  std::string checkpoint;
  // "present" (libvirt still had it), "redefined", "failed" (libvirt
  // refused it or the catalog has no XML for it: the tracker is left as it
  // is, and its next backup is full while libvirt lacks the checkpoint),
  // "none" (empty tracker).
  std::string action;
  // With "failed": why (libvirt's message). With "redefined": "" or what
  // was left out ("without its parent X, which libvirt no longer has").
  std::string reason;
};

// For every tracker of `domain`: if libvirt lacks its checkpoint, redefines
// it from the XML the catalog stored (REDEFINE, with REDEFINE_VALIDATE when
// the domain is active: libvirt checks the bitmaps in QEMU; a shut-off
// domain's bitmaps are checked by the offline backup itself). Parents
// first: the checkpoints are redefined in the order of their <parent>
// links, and a checkpoint whose parent libvirt does not have (barge deletes
// a tracker's previous checkpoint after each backup) is redefined without
// its <parent>, as `virsh checkpoint-create --redefine` accepts. A
// checkpoint that cannot be redefined is reported "failed" with libvirt's
// reason; the tracker is never changed. An error only when the catalog or
// libvirt cannot be read.
Result<std::vector<RedefineOutcome>> RedefineCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                         const std::string& domain);

// The same for one checkpoint `name` of the catalog, missing in libvirt
// (vm backup before it plans): OkStatus when it was redefined, else why not
// (kNotFound: the catalog has no XML for it).
Status RedefineCheckpoint(BackupCatalog& catalog, virDomainPtr dom, const std::string& name);

// A checkpoint XML's <parent><name> ("" when it has none), and the XML
// without that element (untrusted input; only the part before <disks> and
// the embedded <domain> is looked at).
std::string CheckpointParent(const std::string& xml);
std::string WithoutCheckpointParent(const std::string& xml);

// Per disk: what the next backup of `disk` will be and why.
struct DiskPlan {
  std::string disk;
  bool incremental = false;
  std::string reason;
  // Data a killed run staged for the disk (its resume journal): "" none,
  // "resume" (continued from checkpoint `resume_from` of that run: what
  // changed since is read again) or "start over" (`resume_refused` says
  // why; the staged data is swept). Filled by vm backup's planner
  // (PlanVmBackup), not by PlanDisks.
  std::string staged;
  std::string resume_from;
  std::string resume_refused;
};

struct CheckpointState {
  std::string name;
  bool in_libvirt = false;
  // Per disk: "bitmap" with a size libvirt could compute, "bitmap (no size:
  // missing or inconsistent)", or "no".
  std::vector<std::pair<std::string, std::string>> disks;
};

struct DoctorReport {
  std::string domain;
  std::string state;     // DomainStateName: "running", "paused", "shut off", ...
  bool running = false;  // state "running" (a paused domain is active, not running)
  std::vector<TrackerRecord> trackers;
  std::vector<std::string> libvirt_checkpoints;
  std::vector<CheckpointState> tracker_checkpoints;
  // What a plain `vm backup` (the tracker it would use, every disk, into
  // the target given, if any) would do: ForecastVmBackup, the planning
  // vm backup itself runs. next_mode "pull" or "offline"; next_refusal the
  // error it would stop with ("" = none; next_backup is then empty).
  std::vector<DiskPlan> next_backup;
  std::string next_tracker;
  std::string next_mode;
  std::string next_refusal;
};

// The forecast is for `tracker` ("" = the one vm backup would pick:
// ResolveTracker; with several and none named, next_refusal is vm backup's
// usage error). `target` "": the chains are not looked at (a disk with a
// usable bitmap is forecast incremental although its chain there may not
// end at the checkpoint).
Result<DoctorReport> Diagnose(BackupCatalog& catalog, virDomainPtr dom, const std::string& domain,
                              const std::string& target = "", const std::string& tracker = "");

}  // namespace barge::orchestrate

namespace barge::orchestrate {

// Decides per disk whether the next backup of `disks` into `target_dir`
// (chains at target_dir/<domain>/<disk>/) can be incremental from the
// tracker's checkpoint. Full, with the reason, when: no tracker, the
// tracker is empty or marked needs-full, force_full, libvirt lacks the
// checkpoint, the disk's bitmap is inconsistent or missing, the disk is new
// or changed size, or the disk's chain does not end at the checkpoint, or
// the chain holds another disk than `identities` gives for it (disks that
// swapped files keep their targets: pipeline::OtherDiskReason over every
// layer of the chain's latest point; chains that record no disk are not
// compared). `target_dir` "" skips the chain checks (doctor without a
// target); the chain folders are read through `env`, once per disk. A
// chain's latest point at checkpoint `uncommitted` (a killed run's, which
// RecoverOrphanedBackupJob removes before a run plans: the forecast's
// case) is planned as if it were gone.
Result<std::vector<DiskPlan>> PlanDisks(Env& env, const TrackerRecord* tracker, virDomainPtr dom,
                                        const std::vector<DomainDisk>& disks,
                                        const std::map<std::string, formats::DiskIdentity>& identities,
                                        bool force_full, const std::string& target_dir, const std::string& domain,
                                        const std::string& uncommitted = "");

}  // namespace barge::orchestrate
