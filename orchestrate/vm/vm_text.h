// What a person reads about a domain's backups: doctor's findings, a
// disk's planned backup (doctor, `vm backup --dry-run`), a VM backup's
// summary, trackers, checkpoint redefinition, CBT state and an instant
// restore's end, each rendered from the orchestrate struct it describes.
// The cli prints these strings; --json is the cli's own.
#pragma once

#include <string>
#include <vector>

#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/vm/instant_restore.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/vm_backup.h"
#include "orchestrate/vm/vm_orphans.h"

namespace barge::orchestrate {

// "  DISK: full|incremental (reason)", and whether it resumes the data a
// killed run staged or starts over (and why), one line.
std::string DiskPlanText(const DiskPlan& p);

// doctor's text: the domain and its state, trackers, libvirt's and the
// trackers' checkpoints (per disk), the backup job when there is one,
// stale checkpoints with how to remove one that is not barge's, and the
// next backup per disk (or its refusal).
std::string DoctorText(const DoctorReport& r, const BackupJobState& job, const std::vector<StaleCheckpoint>& stale);

// `vm backup --dry-run`'s text of `domain`'s forecast.
std::string VmBackupPlanText(const std::string& domain, const VmBackupForecast& f);

// A VM backup's summary: type and reason, checkpoint, per disk what was
// read and written where (and what a resume took), the duration.
std::string VmBackupResultText(const std::string& domain, const VmBackupResult& r);

// `tracker list`'s line and `tracker show`'s text of one tracker.
std::string TrackerLine(const TrackerRecord& t);
std::string TrackerText(const TrackerRecord& t);

// `checkpoint redefine`: a line per tracker, and the failures as one
// sentence ("" when every checkpoint is present or redefined): the run's
// error after the result.
std::string RedefineText(const std::vector<RedefineOutcome>& outcomes);
std::string RedefineFailures(const std::vector<RedefineOutcome>& outcomes);

// `cbt enable|disable|status`: the state, then each disk's overlay.
std::string CbtStatusText(const CbtStatus& s);

// How `vm instant-restore` of `domain` ended: running on DISK (what was
// verified and what the guest wrote meanwhile), or abandoned.
std::string InstantRestoreText(const std::string& domain, const InstantRestoreResult& r);

}  // namespace barge::orchestrate
