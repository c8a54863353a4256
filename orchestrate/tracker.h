// Backup trackers over libvirt checkpoints: checkpoint names, redefinition
// after libvirt lost its checkpoint metadata, and the doctor's report of
// what the next backup will do.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "formats/manifest.h"
#include "orchestrate/backup_catalog.h"
#include "orchestrate/libvirt_conn.h"

namespace barge::orchestrate {

// "<tracker>-<UTC compact timestamp>", e.g. "t1-20261122T150102Z".
std::string NewCheckpointName(const std::string& tracker);

// Per disk of a libvirt checkpoint XML (untrusted: libvirt's reply, or the
// copy kept in the catalog): disk name -> (checkpoint kind, size attribute).
std::map<std::string, std::pair<std::string, std::string>> CheckpointDisks(const std::string& xml);

struct RedefineOutcome {
  std::string tracker;
  std::string checkpoint;
  // "present" (libvirt still had it), "redefined", "dropped" (needs full),
  // "none" (empty tracker).
  std::string action;
  std::string reason;  // with "dropped": why
};

// For every tracker of `domain`: if libvirt lacks its checkpoint, redefines
// it from the stored XML with REDEFINE | REDEFINE_VALIDATE. A checkpoint that
// libvirt refuses (bitmap missing or inconsistent) is dropped from the
// tracker, which is marked so the next backup is full, with the reason.
Result<std::vector<RedefineOutcome>> RedefineCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                         const std::string& domain);

// Per disk: what the next backup of `disk` will be and why.
struct DiskPlan {
  std::string disk;
  bool incremental = false;
  std::string reason;
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
  bool running = false;
  std::vector<TrackerRecord> trackers;
  std::vector<std::string> libvirt_checkpoints;
  std::vector<CheckpointState> tracker_checkpoints;
  std::vector<DiskPlan> next_backup;  // for the tracker a plain backup would use
  std::string next_tracker;
};

Result<DoctorReport> Diagnose(BackupCatalog& catalog, virDomainPtr dom, const std::string& domain);

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
// target); the chain folders are read through `env`, once per disk.
Result<std::vector<DiskPlan>> PlanDisks(Env& env, const TrackerRecord* tracker, virDomainPtr dom,
                                        const std::vector<DomainDisk>& disks,
                                        const std::map<std::string, formats::DiskIdentity>& identities,
                                        bool force_full, const std::string& target_dir, const std::string& domain);

}  // namespace barge::orchestrate
