// Backup of a running libvirt domain: pull-mode backup job with a new
// checkpoint, every selected disk's NBD export read through the backup
// pipeline into TARGET/<domain>/<disk>/, the tracker advanced together with
// the catalog record. Offline domains with a CBT overlay are read directly.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/nbd_ports.h"
#include "orchestrate/vm/tracker.h"
#include "pipeline/backup.h"
#include "pipeline/file_access.h"
#include "pipeline/nbd_endpoint.h"

namespace barge::orchestrate {

// Where a test makes a VM backup fail, injected through the request as the
// filesystem's faults are through the Env (blockio/env.h). The points are
// libvirt's and the guest agent's, which no Env sees. Each At() is called
// from the run's thread.
class VmBackupFaults {
 public:
  enum class Point : uint8_t {
    kAfterFreeze,  // the guest's filesystems were just frozen, no job yet
    kThaw,         // instead of one thaw of the guest (its error: why the thaw failed)
    kAfterRead,    // every disk was read, nothing committed yet
  };
  virtual ~VmBackupFaults() = default;
  // OkStatus: go on; an error: the run fails at `point` with it.
  virtual Status At(Point point) = 0;
};

// The scratch root of a run without --scratch-dir: /var/tmp, as
// virtnbdbackup's -S default (docs/orchestration.md says why). QEMU sees it
// (libvirt's mount namespace for QEMU replaces only /dev), every user may
// traverse it (world-writable, sticky), and it is on disk where /tmp may be
// RAM; the target may be a volume QEMU does not see.
inline constexpr const char* kDefaultScratchRoot = "/var/tmp";

struct VmBackupRequest {
  std::string domain;
  std::string tracker;      // "" = the domain's only tracker, if it has exactly one
  std::string target;       // chains go to target/<domain>/<disk>/
  // Who may read the chains (pipeline::BackupRequest::access): unset, new
  // folders are private; set (`--group`), the domain's chains are shared.
  std::optional<pipeline::FileAccess> access;
  std::string catalog_path;
  std::string libvirt_uri;  // "" = ResolveLibvirtUri
  bool force_full = false;
  bool skip_quiesce = false;
  std::vector<std::string> disks;  // empty = every disk of the domain
  // Where libvirt puts the pull job's scratch files (copy-before-write):
  // an existing folder that QEMU can see and reach; each run makes its own
  // folder in it (barge-scratch-<domain>) and removes it when it ends.
  // "" = kDefaultScratchRoot.
  std::string scratch_dir;
  // A remote domain's disks over NBD on TCP with TLS (qemu+tls://, or
  // qemu+ssh:// with TLS asked for): libvirt is asked for a TCP export with
  // tls='yes' on a port of `nbd_ports` on the URI's host, leased under
  // `nbd_port_lock_dir` for the job's life; barge reads it with the client
  // certificates of nbd.tls_certificates (ca-cert.pem, client-cert.pem,
  // client-key.pem), TLS required. Over qemu+ssh:// without it, the job's
  // unix socket is forwarded through ssh. nbd.connections: per disk.
  pipeline::NbdAccess nbd;
  PortRange nbd_ports;
  std::string nbd_port_lock_dir = kDefaultNbdPortLockDir;
  // Called per disk from that disk's copy thread, about every 100 ms and
  // once at the end (pipeline::CopyOptions::progress with the disk's name).
  std::function<void(const std::string& disk, uint64_t done_bytes, uint64_t total_bytes)> progress;
  pipeline::CopyOptions copy;      // pipeline knobs (per disk)
  formats::Compression compression = formats::Compression::kZstd;
  int compression_level = formats::kDefaultZstdLevel;
  // Resume what a killed run of this backup staged (docs/formats/resume.md,
  // "vm backup"); false (--no-resume): its staged data and checkpoint go.
  bool resume = true;
  VmBackupFaults* faults = nullptr;  // tests only; must outlive the run
};

struct VmBackupDisk {
  std::string disk;
  bool incremental = false;
  std::string reason;
  std::string chain_dir;
  std::string image_path;
  std::string manifest_path;
  uint64_t virtual_size = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  // When a killed run had staged data for this disk: resumed from it, or
  // why not (the run started over).
  std::optional<pipeline::ResumeNote> resume;
};

struct VmBackupResult {
  std::string backup_type;  // "Full" (any disk full) or "Incremental"
  std::string reason;
  std::string checkpoint;   // created by this run ("" without a tracker)
  std::string parent_checkpoint;
  std::string tracker;
  std::string mode;         // "pull" (libvirt job) or "offline" (CBT overlay)
  // How the pull job's export was read: "unix" (this machine's socket),
  // "ssh" (the remote socket through ssh), "tls" (TCP with TLS); "" offline.
  std::string transport;
  int nbd_port = 0;         // with "tls": the port leased on the host
  int64_t record_id = 0;
  std::vector<VmBackupDisk> disks;
  double seconds = 0;
  // What the run found and cleaned up before it started (an orphaned
  // backup job of a killed run), for the user; the run itself succeeded.
  std::vector<std::string> warnings;
};

// Runs one VM backup. Refuses at once (nothing started, nothing created)
// when the target folder does not exist (kNotFound: an unmounted backup
// volume), the scratch folder does not exist (kNotFound), a remote domain
// that needs TLS (not qemu+ssh://) has no client certificates or TLS is
// asked for a local one (kInvalidArgument), the certificates are missing or
// readable by others (pipeline::NbdOptionsFor's errors), the domain has
// several trackers and none is named
// (kInvalidArgument, MultipleTrackersMessage), another backup, CBT change
// or state migration of the domain holds its lock (kBusy, DomainLockPath), the
// guest agent is missing for the quiesce (unless skip_quiesce), or the
// target's free space is below the estimate (kNoSpace). On any later failure
// the job is aborted, this run's checkpoint deleted, the new backup files
// removed, the tracker left as it was, and the catalog record says why.
// Before anything else (under the lock) a backup job of barge's whose
// process is gone (RecoverOrphanedBackupJob, orchestrate/vm/vm_orphans.h) is
// aborted and its files and uncommitted checkpoint removed (a warning in the
// result); a live job barge did not start, or whose owner lives, is kBusy,
// nothing touched. Then the metadata of barge's checkpoints whose bitmaps
// are gone (RemoveStaleCheckpoints) is deleted, each with a warning, and the
// others are named in warnings.
// request.faults, when set, can fail the run at the points VmBackupFaults
// names (the failure paths must thaw a frozen guest and commit nothing).
// Chain folders, lock files and overlays are handled through `env`.
Result<VmBackupResult> RunVmBackup(Env& env, const VmBackupRequest& request);

// What `vm backup` with `req` (its domain, target, disks, force_full and
// resume) continuing `tracker` (nullptr: none) would do now, planned by the
// very function RunVmBackup plans with (vm_steps::PlanVmRun): doctor's
// forecast and `vm backup --dry-run`. The run's first step is foreseen
// without being done: a killed run's leftovers (ForeseeOrphanRecovery: the
// checkpoints kept for a resume, the uncommitted points removed) and the
// stale checkpoints removed. `mode` "pull" for an active domain (running
// or paused), "offline" for a shut-off one, and per disk incremental or
// full with the reason RunVmBackup would give, and whether it resumes what
// a killed run staged (DiskPlan::staged; only with a target); or, in
// `refusal`, the error it would stop with before starting anything (a
// target that is not a folder, another run's live job, a shut-off domain
// without CBT, a disk not on its overlay, too little free space). Only
// what happens between the forecast and the run, or libvirt's own finding
// at job start (a bitmap that turns inconsistent), can still change a
// disk's plan, and the pipeline may still find a staged point unusable (a
// journal it cannot read, staged data whose digests do not check).
// Changes nothing: no lock, checkpoint, file or record.
struct VmBackupForecast {
  std::string tracker;  // "" = none
  std::string mode;
  std::string refusal;
  std::vector<DiskPlan> disks;
};
Result<VmBackupForecast> ForecastVmBackup(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                          const VmBackupRequest& req, const TrackerRecord* tracker);

// `vm backup --dry-run`: RunVmBackup's checks of the request, then the
// tracker it would continue and ForecastVmBackup. The refusals RunVmBackup
// would give (a bad request, several trackers and none named) come back in
// `refusal`; an error only when the catalog or libvirt cannot be read or
// the domain does not exist.
Result<VmBackupForecast> DryRunVmBackup(Env& env, const VmBackupRequest& req);

// "domain 'D' has N trackers (a, b): name one with --tracker".
std::string MultipleTrackersMessage(const std::string& domain, const std::vector<TrackerRecord>& trackers);

// Which tracker a backup of `domain` continues: the one named by
// `tracker_name` (kNotFound; kInvalidArgument when it belongs to another
// domain), else the domain's only tracker, else none. With several and none
// named, which chain to continue is the caller's choice: `ambiguous` holds
// MultipleTrackersMessage (a usage error; RunVmBackup refuses it with
// kInvalidArgument). The CLI calls it before the hooks run.
struct TrackerChoice {
  std::optional<TrackerRecord> tracker;
  std::string ambiguous;
};
Result<TrackerChoice> ResolveTracker(BackupCatalog& catalog, const std::string& domain,
                                     const std::string& tracker_name);

}  // namespace barge::orchestrate
