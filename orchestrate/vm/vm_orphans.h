// What a killed `vm backup` leaves behind, and checkpoints whose bitmaps are
// gone: how barge recognises its own leftovers in libvirt, how `vm backup`
// cleans them up before it starts, and what `doctor` reports of them.
#pragma once

#include <libvirt/libvirt.h>

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/catalog/backup_catalog.h"

namespace barge::orchestrate {

// The run record of a pull-mode backup job: written (atomically, through the
// Env) just before virDomainBackupBegin, removed once the job has ended. It
// names the job's owner (ProcessOwner::Encode(), pid and start time), the
// NBD socket and scratch folder the job was started with, the checkpoint
// the job creates and the catalog's "running" record. A record whose owner
// is gone is what a killed run left.
struct BackupJobRecord {
  std::string owner;
  std::string socket;
  std::string scratch_dir;
  std::string checkpoint;  // "" without a tracker
  std::string chains_dir;  // TARGET/<domain>: the run's chain folders are <chains_dir>/<disk>
  int64_t record_id = 0;
  // The hypervisor's host (LibvirtHostKey) when it is not this machine:
  // socket and scratch paths are then on that host; only the socket's
  // folder is removed, through that host's libvirt (RemoveRemoteJobSocketDir).
  std::string host;
  // Checkpoints of earlier killed runs that this run resumes from (kept
  // until it commits; comma-separated), "" for none.
  std::string resumed_checkpoints;
  // The run failed, its NBD connection lost for good, and kept what it
  // staged, its job ended: the record stays for the next run, which treats
  // it as a killed run's (whether or not this process still lives).
  bool kept_after_failure = false;
};

// A job's NBD socket is this name in a folder of its own, which vm backup
// makes fresh in /tmp for QEMU's user: locally barge-backup-DOMAIN-XXXXXX
// (mkdtemp), on a remote host MakeRemoteJobSocketDir's.
inline constexpr const char* kJobSocketName = "nbd.sock";
// Removes a job's socket, and the folder vm backup made for it (a socket
// an older barge put straight into /tmp goes alone). Gone is not an error.
Status RemoveJobSocket(Env& env, const std::string& socket);

// A remote job's NBD socket: kJobSocketName in a folder of its own in the
// host's /tmp, barge-backup-DOMAIN-<128 random bits>, made fresh there by
// the host's libvirt (mkdir, which refuses a name that exists; barge
// cannot mkdtemp there) with mode 0750 and QEMU's user and group
// (`qemu_owner`, QemuDacOwner; libvirt's own when nullopt): QEMU binds the
// socket in it, and only root and QEMU's group (the ssh forward's user)
// reach it. Returns the socket's path on the host.
Result<std::string> MakeRemoteJobSocketDir(virConnectPtr conn, const std::string& domain,
                                           const std::optional<std::pair<uid_t, gid_t>>& qemu_owner);
// Removes the folder MakeRemoteJobSocketDir made for `socket` on the
// connection's host (QEMU removes the socket when the job ends); a socket
// of another shape (an older barge's, straight in /tmp) or a folder
// already gone is left alone.
Status RemoveRemoteJobSocketDir(virConnectPtr conn, const std::string& socket);

// <catalog folder>/locks/domains/<domain>.backup-job
std::string BackupJobRecordPath(const std::string& catalog_path, const std::string& domain);
Status WriteBackupJobRecord(Env& env, const std::string& path, const BackupJobRecord& record);

// What doctor and vm backup see of a domain's backup job.
struct BackupJobState {
  // "none" (no job, no record), "orphaned" (barge's run record names a
  // process that is gone: the job, if libvirt still has one, is the one that
  // record started), "running" (the record's owner still lives), "foreign"
  // (libvirt has a backup job that no record of this catalog started).
  std::string state = "none";
  bool job_active = false;  // libvirt has a backup job for the domain
  std::string job_socket;   // that job's NBD socket, from libvirt
  BackupJobRecord record;   // with "orphaned" and "running"
  // One sentence for the user ("" with "none").
  std::string message;
};

// Reads the run record under `catalog_path` and asks libvirt for the
// domain's backup job (virDomainBackupGetXMLDesc). A record whose socket is
// not the live job's socket is "foreign" when the job is live (the job is
// not the record's); a record with no live job is "orphaned" when its owner
// is gone (its checkpoint, scratch folder or socket may remain).
Result<BackupJobState> InspectBackupJob(Env& env, const std::string& catalog_path, virDomainPtr dom,
                                        const std::string& domain);

// What RecoverOrphanedBackupJob did.
struct OrphanRecovery {
  std::string warning;  // for the user; "" when there was nothing to do
  // The killed run's checkpoints kept for a resume: a chain folder's resume
  // journal (pipeline/backup_resume.h) names each, so the next run's job
  // can ask libvirt what changed since it (docs/formats/resume.md, "vm
  // backup"). The run that resumes deletes them once it commits.
  std::vector<std::string> kept_checkpoints;
};

// What RecoverOrphanedBackupJob will do with the checkpoints and points of
// an orphaned run's record `r`, decided without changing anything (the
// forecast of doctor and `vm backup --dry-run` asks it too, so that it
// plans with what the run will find): the checkpoints it keeps for a
// resume, those it deletes (never committed, no journal names them), and
// the checkpoint whose points at the end of the run's chain folders it
// removes ("" = none: the run committed before it was killed).
struct OrphanOutlook {
  std::vector<std::string> kept_checkpoints;
  std::vector<std::string> deleted_checkpoints;
  std::string uncommitted_checkpoint;
};
Result<OrphanOutlook> ForeseeOrphanRecovery(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                            const std::string& domain, const BackupJobRecord& r,
                                            bool keep_resumable);

// Before a backup of `domain` starts (the caller holds the domain's lock):
// for an "orphaned" state, aborts the job (virDomainAbortJob, waiting until
// libvirt has no job), removes its socket and scratch folder, deletes its
// checkpoint (and those of earlier killed runs it was resuming from) when
// no tracker names it (it was never committed: the next incremental
// continues from the tracker's checkpoint) unless `keep_resumable` and a
// resume journal in one of the run's chain folders names it (an offline
// run's checkpoint, which libvirt does not know before its commit, is kept
// that way too; else its bitmaps are left to the next offline backup, which
// removes strays), of a shut-off domain its metadata only (libvirt deletes
// bitmaps only from a running domain; the next offline backup removes them
// from the CBT overlays), removes the
// points the run wrote for that checkpoint at the end of its chain folders,
// marks its catalog record failed and removes the run record. "running"
// and "foreign" are kBusy with the state's message, nothing touched.
Result<OrphanRecovery> RecoverOrphanedBackupJob(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                                const std::string& domain, bool keep_resumable = false);

// A libvirt checkpoint of the domain whose bitmaps QEMU no longer has on any
// of its disks (removed behind libvirt's back, or lost with a disk that was
// replaced): no backup can be incremental from it, and libvirt cannot delete
// it normally (the delete fails on the missing bitmap), so it stays.
struct StaleCheckpoint {
  std::string name;
  bool barges = false;             // named as barge names checkpoints (IsBargeCheckpointName)
  std::vector<std::string> disks;  // the disks whose bitmap is gone
};

// "<tracker name>-YYYYMMDDTHHMMSSZ" (NewCheckpointName's form).
bool IsBargeCheckpointName(const std::string& name);

// The running domain's checkpoints that no tracker of `domain` names and
// whose every bitmap (per disk of the checkpoint XML with checkpoint='bitmap')
// is missing from QEMU's list for that disk (query-block). Empty for a
// domain that is not running (its bitmaps are not asked for).
Result<std::vector<StaleCheckpoint>> FindStaleCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                          const std::string& domain);

// Before a backup (under the domain's lock): deletes the metadata of every
// stale checkpoint barge made (nothing of it is left in QEMU), and returns
// one warning per stale checkpoint: removed, or kept because barge did not
// make it (with the command to remove it), or kept because libvirt refused.
Result<std::vector<std::string>> RemoveStaleCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                        const std::string& domain);

}  // namespace barge::orchestrate
