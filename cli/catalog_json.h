// The JSON form of the backup catalog's records, one shape for every command
// that prints them (tracker list/show, vm backups, catalog list).
#pragma once

#include <nlohmann/json.hpp>

#include "orchestrate/catalog/backup_catalog.h"

namespace barge::cli {

// {name, domain, created_at, latest_checkpoint: null | {name, created_at,
// disks: [{name, virtual_size}]}, needs_full, needs_full_reason}
nlohmann::json TrackerJson(const orchestrate::TrackerRecord& tracker);
// {id, domain, tracker, type, reason, checkpoint, parent_checkpoint, target,
// disks: [...], started_at, finished_at, duration_seconds, result, error}
nlohmann::json RecordJson(const orchestrate::BackupRecord& record);

}  // namespace barge::cli
