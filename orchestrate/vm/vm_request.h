// `vm backup`'s request settled before the run: what the command line left
// open that the catalog decides (which tracker the backup continues).
#pragma once

#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/vm/vm_backup.h"

namespace barge::orchestrate {

// Sets req.tracker to the tracker a backup of req.domain continues
// (ResolveTracker over the catalog at req.catalog_path: the one named, else
// the domain's only one; unchanged when it has none). Called before the
// hooks run, so a refused request runs no hook.
// Returns "" when settled, or the usage text when the domain has several
// trackers and none is named (MultipleTrackersMessage: which chain to
// continue is the caller's choice); the catalog's and ResolveTracker's
// errors (kNotFound, kInvalidArgument: the named tracker is another
// domain's).
Result<std::string> SettleTracker(Env& env, VmBackupRequest& req);

}  // namespace barge::orchestrate
