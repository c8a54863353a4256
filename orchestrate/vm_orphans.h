// What a killed `vm backup` leaves behind: how barge recognises its own
// leftovers in libvirt, how `vm backup` cleans them up before it starts, and
// what `doctor` reports of them.
#pragma once

#include <libvirt/libvirt.h>

#include <cstdint>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/backup_catalog.h"

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
};

// <catalog folder>/locks/<domain>.backup-job
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

// Before a backup of `domain` starts (the caller holds the domain's lock):
// for an "orphaned" state, aborts the job (virDomainAbortJob, waiting until
// libvirt has no job), removes its socket and scratch folder, deletes its
// checkpoint when no tracker names it (it was never committed: the next
// incremental continues from the tracker's checkpoint) and the points the
// run wrote for that checkpoint at the end of its chain folders, marks its catalog
// record failed and removes the run record. Returns what it did (a warning
// for the user), "" when there was nothing to do. "running" and "foreign"
// are kBusy with the state's message, nothing touched.
Result<std::string> RecoverOrphanedBackupJob(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                             const std::string& domain);

}  // namespace barge::orchestrate
