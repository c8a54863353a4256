// `barge catalog list`: the catalog's trackers, checkpoints and backup
// records, read without creating a catalog.
#pragma once

#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/catalog/backup_catalog.h"

namespace barge::orchestrate {

struct CatalogListing {
  std::string path;  // the catalog file read
  std::vector<TrackerRecord> trackers;
  std::vector<CheckpointRecord> checkpoints;
  std::vector<BackupRecord> backups;
};

// The records of the catalog `catalog_flag` names (ResolveCatalogPath),
// only `domain`'s when not "". kNotFound when there is no catalog there:
// listing never creates one.
Result<CatalogListing> ReadCatalogListing(Env& env, const std::string& catalog_flag, const std::string& domain);

}  // namespace barge::orchestrate
