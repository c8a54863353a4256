// backup and vm backup inside their consistency hooks: each job's hook
// environment and the one runner and rule of orchestrate/base/hooks.h
// (docs/snapshots.md, "Consistency hooks"), so that the cli only passes
// its flags.
#pragma once

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/base/hooks.h"
#include "orchestrate/vm/vm_backup.h"
#include "pipeline/backup.h"

namespace barge::orchestrate {

// pipeline::RunBackup between `hooks`' pre- and post-hook (RunWithHooks).
// The hooks bracket the whole read: the source is the consistent point only
// while the application stays flushed (a snapshot source is one already).
// Hook environment: BARGE_OPERATION=backup, BARGE_IMAGE (the source),
// BARGE_DISK (the disk name, else the source), BARGE_SNAPSHOT (a snapshot
// source's name, when given).
// Returns the backup; or the pre-hook's kCancelled (nothing backed up), or
// the backup's error (with a failed post-hook appended). A failed post-hook
// after a good backup is a warning in `hooked.warnings` (the point kept).
// `hooked.runs` lists the hooks that ran, in either case.
Result<pipeline::BackupResult> RunBackupWithHooks(Env& env, const pipeline::BackupRequest& req, const HookSpec& hooks,
                                                  HookedResult& hooked);

// RunVmBackup between the hooks, the same way. The guest freeze and the
// backup job come inside the pre-hook's flush. Hook environment:
// BARGE_OPERATION=vm-backup, BARGE_DOMAIN.
Result<VmBackupResult> RunVmBackupWithHooks(Env& env, const VmBackupRequest& req, const HookSpec& hooks,
                                            HookedResult& hooked);

}  // namespace barge::orchestrate
