#include "orchestrate/vm/vm_request.h"

namespace barge::orchestrate {

Result<std::string> SettleTracker(Env& env, VmBackupRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(TrackerChoice choice, ResolveTracker(*catalog, req.domain, req.tracker));
  if (!choice.ambiguous.empty()) return choice.ambiguous;
  if (choice.tracker) req.tracker = choice.tracker->name;
  return std::string();
}

}  // namespace barge::orchestrate
