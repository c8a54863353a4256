#include "orchestrate/vm/tracker_admin.h"

#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {

Status CreateTrackerForDomain(BackupCatalog& catalog, const std::string& name, const std::string& domain,
                              const std::string& libvirt_uri) {
  BARGE_ASSIGN_OR_RETURN(VirConnection conn, ConnectLibvirt(libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(VirDomain dom, LookupDomain(conn.get(), domain));
  return catalog.CreateTracker(name, domain);
}

namespace {

Status DeleteLatestCheckpoint(const TrackerRecord& t, const std::string& libvirt_uri) {
  BARGE_ASSIGN_OR_RETURN(VirConnection conn, ConnectLibvirt(libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(VirDomain dom, LookupDomain(conn.get(), t.domain));
  return DeleteCheckpoint(dom.get(), t.latest_checkpoint);
}

}  // namespace

Result<TrackerDeletion> DeleteTrackerAndCheckpoint(BackupCatalog& catalog, const std::string& name,
                                                   const std::string& libvirt_uri) {
  BARGE_ASSIGN_OR_RETURN(TrackerRecord t, catalog.GetTracker(name));
  TrackerDeletion out;
  out.tracker = t.name;
  if (!t.latest_checkpoint.empty()) {
    Status s = DeleteLatestCheckpoint(t, libvirt_uri);
    out.checkpoint_deleted = s.ok();
    if (!s.ok()) out.warning = "could not delete checkpoint " + t.latest_checkpoint + ": " + s.error().ToString();
  }
  BARGE_RETURN_IF_ERROR(catalog.DeleteTracker(t.name));
  return out;
}

}  // namespace barge::orchestrate
