#include "orchestrate/catalog/catalog_listing.h"

#include "orchestrate/catalog/catalog_path.h"

namespace barge::orchestrate {

Result<CatalogListing> ReadCatalogListing(Env& env, const std::string& catalog_flag, const std::string& domain) {
  CatalogListing out;
  out.path = ResolveCatalogPath(catalog_flag);
  if (!env.Exists(out.path)) {
    return Error::NotFound("no catalog here (nothing recorded yet; --catalog or $BARGE_CATALOG name another)")
        .set_path(out.path);
  }
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, out.path));
  BARGE_ASSIGN_OR_RETURN(out.trackers, catalog->ListTrackers(domain));
  BARGE_ASSIGN_OR_RETURN(out.checkpoints, catalog->ListCheckpoints(domain));
  BARGE_ASSIGN_OR_RETURN(out.backups, catalog->ListBackups(domain));
  return out;
}

}  // namespace barge::orchestrate
