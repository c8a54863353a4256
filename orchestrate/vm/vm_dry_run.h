// `vm backup --dry-run` with the error a refused run would stop with: the
// forecast of vm_backup.h (DryRunVmBackup, ForecastVmBackup) and, beside
// its `refusal` text, the error itself, whose code gives the exit code the
// run would end with (docs/errors.md).
#pragma once

#include <optional>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/vm/vm_backup.h"

namespace barge::orchestrate {

struct VmDryRun {
  VmBackupForecast forecast;
  std::optional<Error> refused;  // set when forecast.refusal is not ""
};

// ForecastVmBackup, with the refusal's error.
Result<VmDryRun> ForecastVmBackupRun(Env& env, BackupCatalog& catalog, virDomainPtr dom, const VmBackupRequest& req,
                                     const TrackerRecord* tracker);
// DryRunVmBackup, with the refusal's error.
Result<VmDryRun> DryRunVmBackupRun(Env& env, const VmBackupRequest& req);

}  // namespace barge::orchestrate
