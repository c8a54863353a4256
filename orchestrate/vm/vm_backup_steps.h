// The steps of a vm backup, shared by its files (internal to
// orchestrate/vm): resolve the domain and tracker (vm_backup.cc), plan per
// disk (vm_backup_plan.cc), prepare and copy, which differ by where the data
// comes from (vm_backup_pull.cc: a libvirt pull job; vm_backup_offline.cc: a
// shut-off domain's CBT overlays), then commit and clean up
// (vm_backup_commit.cc).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/vm_backup.h"
#include "pipeline/backup.h"

namespace barge::orchestrate::vm_steps {

// ---- plan (vm_backup_plan.cc) ----

// Everything a run decides before it starts anything, from the domain as it
// is now: PlanVmRun's result, shared by RunVmBackup and ForecastVmBackup.
struct RunPlan {
  std::string mode;  // "pull" (active domain: running or paused) or "offline"
  std::vector<DomainDisk> all_disks;
  std::vector<DomainDisk> disks;  // selected
  std::set<std::string> selected;
  // The selected disks that hold the new checkpoint's bitmap: offline every
  // one (its overlay), pull the qcow2 ones (CanHoldBitmap).
  std::set<std::string> with_bitmap;
  std::optional<std::vector<CbtDisk>> cbt;
  std::map<std::string, CbtDisk> overlay_of;  // offline: the selected disks' overlays
  std::map<std::string, formats::DiskIdentity> identities;
  std::map<std::string, std::vector<formats::BitmapInfo>> bitmaps;  // offline: each overlay's bitmaps
  std::map<std::string, bool> incremental;
  std::map<std::string, std::string> reasons;
  std::vector<DiskPlan> plans;  // per selected disk, in domain order
  // The disks that resume a killed run's staged point (PlanResumes), and
  // why the others with staged data cannot.
  std::map<std::string, pipeline::BackupRequest::StagedEarlier> resumes;
  std::map<std::string, std::string> resume_refused;
  // The killed runs' checkpoints this run resumes from (kept for it by
  // RecoverOrphanedBackupJob; deleted once it commits or fails).
  std::vector<std::string> kept;
};

// What one plan is made of: the request's domain, disks, force_full,
// target ("" skips the chain checks) and resume; the killed runs'
// checkpoints kept for a resume; a killed run's uncommitted checkpoint
// whose points are (to be) removed (PlanDisks' `uncommitted`).
struct PlanInputs {
  std::string domain;
  std::vector<std::string> want;  // disks; empty = all
  bool force_full = false;
  std::string target;
  bool resume = true;
  std::vector<std::string> kept;
  std::string uncommitted;
};

// THE planner of vm backup, asked by the run, doctor's forecast and
// --dry-run alike: an active domain (running or paused) is backed up by a
// pull-mode job, a shut-off one from its CBT overlays (refused without CBT
// on every selected disk). Per disk PlanDisks, and offline also the
// overlay's own bitmap: a disk is incremental only if its overlay holds
// the tracker checkpoint's bitmap (libvirt names a checkpoint's bitmap
// after the checkpoint), enabled and not in use; a running domain's disk
// that cannot hold a bitmap is full every time. Then PlanResumes. The
// per-disk outcome is in plan.plans, with the resumes filled in.
Result<RunPlan> PlanVmRun(Env& env, BackupCatalog& catalog, virDomainPtr dom, const TrackerRecord* tracker,
                          const PlanInputs& in);

// The refusal of a shut-off domain without a CBT overlay: nothing to read
// its changes from.
Error NotRunningWithoutCbt(const std::string& domain);

// The target must exist: creating it would put a backup meant for an
// unmounted backup volume on the file system beneath its mount point.
Status CheckTarget(Env& env, const std::string& target);

// The bitmaps of a CBT overlay, read directly (the domain is shut off).
Result<std::vector<formats::BitmapInfo>> OverlayBitmaps(Env& env, const CbtDisk& d);

// The target's free space against the size estimate of `disks` (kNoSpace),
// before a pull run starts (vm_backup_pull.cc).
Status CheckFreeSpace(Env& env, virDomainPtr dom, const std::vector<DomainDisk>& disks, const VmBackupRequest& req);

// ---- the run (shared by pull and offline) ----

// What a run's steps share: the request, the catalog, the domain, the
// tracker it continues (nullptr: none) and when it started.
struct RunContext {
  Env& env;
  const VmBackupRequest& req;
  BackupCatalog& catalog;
  virDomainPtr dom;
  const TrackerRecord* tracker;
  std::string started;  // RFC 3339
  std::chrono::steady_clock::time_point t0;
};

// Whether a pull job's export is read over TCP with TLS: a remote domain,
// unless the URI is qemu+ssh:// and no TLS is asked for (then through ssh).
bool ExportOverTls(const LibvirtUri& uri, const VmBackupRequest& req);

// "nbds://HOST[:PORT]" (an IPv6 address in brackets): a TCP export's URI.
std::string NbdTcpUri(const std::string& host, int port);

// The pull-mode run (vm_backup_pull.cc) and the offline one
// (vm_backup_offline.cc) from a plan; their contracts are RunVmBackup's.
// `uri`: the connection's, parsed.
Result<VmBackupResult> RunPullBackup(const RunContext& ctx, const LibvirtUri& uri, RunPlan plan);
Result<VmBackupResult> RunOfflineBackup(const RunContext& ctx, RunPlan plan);

// ---- copy and commit (vm_backup_commit.cc) ----

// The error the request's fault seam injects at `point`, if any.
Status InjectedFault(const VmBackupRequest& req, VmBackupFaults::Point point);

// "a,b" (BackupJobRecord::resumed_checkpoints).
std::string JoinNames(const std::vector<std::string>& names);

// The start of a run: tracker and parent checkpoint in `res`, a new
// checkpoint name (with a tracker; returned), and the catalog's "running"
// record (its id in res.record_id).
Result<std::string> StartRun(const RunContext& ctx, VmBackupResult& res);

// One backup per disk of the plan, all in parallel (each RunBackup is
// itself parallel). `set_source` fills in where a disk is read from and its
// dirty set; the rest of each request is common (resumes from the plan).
// The disks that succeeded are added to `res` and their new files to
// `new_files`; returns the first disk's error, if any.
std::optional<Error> CopyDisks(const RunContext& ctx, const RunPlan& plan, const std::string& checkpoint,
                               const std::function<void(const std::string& disk, pipeline::BackupRequest&)>& set_source,
                               VmBackupResult& res, std::vector<std::string>& new_files);

// After the copy: the run's type and reason from its disks, its checkpoint
// and duration.
void SumUp(const RunContext& ctx, const std::string& checkpoint, VmBackupResult& res);

// The commit: the catalog gets the new checkpoint's record (holding the XML
// libvirt now stores for it, for a later redefine) and the backup record,
// and the tracker moves on, in one transaction.
Status CommitRun(const RunContext& ctx, const std::string& checkpoint, VmBackupResult& res);

// A failed run's catalog record: its error `e` (a failure to record it
// is added to `e`).
void RecordFailure(const RunContext& ctx, const std::string& checkpoint, VmBackupResult& res, Error& e);

// After the commit: the killed runs' checkpoints kept for this run's
// resume (`kept`) are no longer needed (of a shut-off domain only the
// metadata goes: `metadata_only`), and the user is told which disks'
// staged data could not be taken.
void DropKeptCheckpoints(virDomainPtr dom, const std::vector<std::string>& kept, const std::string& checkpoint,
                         bool metadata_only);
void WarnOfStartingOver(VmBackupResult& res);

}  // namespace barge::orchestrate::vm_steps
