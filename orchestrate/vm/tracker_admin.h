// `barge tracker create|delete`: a tracker made only for a domain libvirt
// knows, and deleted together with its libvirt checkpoint where it can be.
#pragma once

#include <string>

#include "blockio/error.h"
#include "orchestrate/catalog/backup_catalog.h"

namespace barge::orchestrate {

// Creates tracker `name` for `domain` once libvirt at `libvirt_uri` ("" =
// ResolveLibvirtUri) finds the domain.
// Returns ConnectLibvirt's errors, kNotFound (no such domain), or
// CreateTracker's (an existing tracker, a bad name).
Status CreateTrackerForDomain(BackupCatalog& catalog, const std::string& name, const std::string& domain,
                              const std::string& libvirt_uri);

struct TrackerDeletion {
  std::string tracker;
  bool checkpoint_deleted = false;
  // Why its latest checkpoint is still in libvirt ("" when deleted or none).
  std::string warning;
};

// Deletes tracker `name` from the catalog, and first its latest checkpoint
// from libvirt at `libvirt_uri`: a checkpoint libvirt cannot delete (the
// domain gone, libvirtd down) is the result's warning, not an error, and
// the tracker goes either way.
// Returns kNotFound (no such tracker) or the catalog's errors.
Result<TrackerDeletion> DeleteTrackerAndCheckpoint(BackupCatalog& catalog, const std::string& name,
                                                   const std::string& libvirt_uri);

}  // namespace barge::orchestrate
