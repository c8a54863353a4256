// The libvirt and catalog side of `barge state migrate`: which domains use
// a state folder, their locks, and switching their XML and the catalog's
// records to the folder's new place.
#include "orchestrate/state/state_repoint.h"

#include "blockio/path.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/base/sqlite_db.h"

namespace barge::orchestrate {

Status DomainRepoint::Lock(const std::string& domain) {
  if (catalog_path_.empty() || locks_.count(domain) != 0) return OkStatus();
  BARGE_ASSIGN_OR_RETURN(auto lock, TryLockFile(env_, DomainLockPath(catalog_path_, domain), DomainBusyMessage(domain)));
  locks_.emplace(domain, std::move(lock));
  return OkStatus();
}

Status DomainRepoint::LockUsers(const std::string& folder) {
  auto doms = DomainsUsingFolder(env_, folder, uri_);
  if (!doms.ok()) {
    return std::move(doms).error().Wrap(
        "cannot ask libvirt which domains use the folder (pass --no-libvirt if no libvirt domain uses it)");
  }
  for (const DomainUsingFolder& d : *doms) {
    if (!d.active) continue;
    return Error::Busy("domain '" + d.name + "' is " + d.state +
                       " and uses files in the folder; shut it off first (virsh shutdown " + d.name +
                       "), then migrate: nothing was moved")
        .set_path(AbsolutePath(folder));
  }
  for (const DomainUsingFolder& d : *doms) {
    if (Status s = Lock(d.name); !s.ok()) return std::move(s).error().Wrap("nothing was moved");
  }
  return OkStatus();
}

Status DomainRepoint::Repoint(const std::string& old_arg, const std::string& new_arg) {
  const std::string new_dir = AbsolutePath(new_arg);
  std::vector<std::string> olds = {AbsolutePath(old_arg)};
  if (auto real = env_.RealPath(old_arg); real.ok() && *real != olds[0]) olds.push_back(*real);
  // Live XML too: a transient domain, or one started during the copy, may
  // name the folder only there.
  BARGE_ASSIGN_OR_RETURN(std::vector<DomainUsingFolder> users, DomainsUsingFolder(env_, old_arg, uri_));
  for (const DomainUsingFolder& d : users) {
    if (d.active) {
      return Error::Busy("domain '" + d.name + "' is " + d.state + " and uses files in the folder (started during "
                         "the migration)")
          .set_path(olds[0]);
    }
  }
  for (const DomainUsingFolder& d : users) BARGE_RETURN_IF_ERROR(Lock(d.name));
  {
    BARGE_ASSIGN_OR_RETURN(VirConnection conn, ConnectLibvirt(uri_));
    for (const DomainUsingFolder& d : users) {
      BARGE_ASSIGN_OR_RETURN(VirDomain dom, LookupDomain(conn.get(), d.name));
      BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE));
      std::string moved = xml;
      for (const std::string& o : olds) moved = ReplacePathPrefix(moved, o, new_dir, /*xml=*/true);
      if (moved == xml) continue;
      // A domain started between this check and the define below is not
      // caught (libvirt offers no define-if-inactive); the window is short
      // and the domain lock keeps barge's own commands out of it.
      if (DomainIsActive(dom.get())) {
        return Error::Busy("domain '" + d.name + "' was started during the migration and uses files in the folder")
            .set_path(olds[0]);
      }
      virDomainPtr defined = virDomainDefineXML(conn.get(), moved.c_str());
      if (!defined) return LastVirError("redefine domain '" + d.name + "' with the files in " + new_dir);
      virDomainFree(defined);
    }
  }
  if (catalog_path_.empty()) return OkStatus();
  auto cat_st = env_.Stat(catalog_path_);
  if (!cat_st.ok()) {
    if (cat_st.error().code() == ErrorCode::kNotFound) return OkStatus();
    return cat_st.error();
  }
  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env_, catalog_path_));
  BARGE_ASSIGN_OR_RETURN(auto txn, SqliteTransaction::Begin(catalog->db()));
  BARGE_RETURN_IF_ERROR(RepointCbtPaths(*catalog, olds, new_dir));
  BARGE_RETURN_IF_ERROR(catalog->RepointPaths(olds, new_dir));
  return txn->Commit();
}

Result<std::vector<DomainUsingFolder>> DomainsUsingFolder(Env& env, const std::string& folder,
                                                          const std::string& uri) {
  std::vector<std::string> paths = {AbsolutePath(folder)};
  if (auto real = env.RealPath(folder); real.ok() && *real != paths[0]) paths.push_back(*real);
  BARGE_ASSIGN_OR_RETURN(VirConnection conn, ConnectLibvirt(uri));
  BARGE_ASSIGN_OR_RETURN(std::vector<VirDomain> doms, ListDomains(conn.get()));
  std::vector<DomainUsingFolder> out;
  for (const VirDomain& dom : doms) {
    const char* name = virDomainGetName(dom.get());
    if (!name) continue;
    std::vector<std::string> xmls;
    if (virDomainIsPersistent(dom.get()) == 1) {
      auto x = DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE);
      if (x.ok()) xmls.push_back(std::move(*x));
    }
    const bool active = DomainIsActive(dom.get());
    if (active) {
      auto x = DomainXml(dom.get());
      if (x.ok()) xmls.push_back(std::move(*x));
    }
    bool uses = false;
    for (const std::string& x : xmls) {
      for (const std::string& p : paths) uses = uses || NamesPathInside(x, p, /*xml=*/true);
    }
    if (!uses) continue;
    int state = 0, reason = 0;
    if (virDomainGetState(dom.get(), &state, &reason, 0) != 0) state = active ? VIR_DOMAIN_RUNNING : VIR_DOMAIN_NOSTATE;
    out.push_back({name, DomainStateName(state), active});
  }
  return out;
}

}  // namespace barge::orchestrate
