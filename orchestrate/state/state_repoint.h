// The libvirt and catalog side of `barge state migrate`: which domains use
// a state folder, and switching their persistent XML and the catalog's
// records to the folder's new place under the domains' locks. The file
// side (journal, copy, verify) is state_migrate.h.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/base/file_lock.h"

namespace barge::orchestrate {

// What `state migrate` switches besides the files: the persistent XML of
// every libvirt domain (at `uri`) naming files in the folder, and the
// catalog at `catalog_path` ("" = none; one that does not exist is left
// alone): its CBT records (RepointCbtPaths) and stored checkpoint XML
// (BackupCatalog::RepointPaths), in one transaction. It holds the locks of
// the domains using the folder (DomainLockPath under `catalog_path`, the
// lock vm backup and cbt enable/disable take) from LockUsers until it is
// destroyed, so that none of them changes the old copy once it is copied.
// One thread at a time; `env` must outlive it.
class DomainRepoint {
 public:
  DomainRepoint(Env& env, std::string uri, std::string catalog_path)
      : env_(env), uri_(std::move(uri)), catalog_path_(std::move(catalog_path)) {}

  // Before anything is copied: kBusy (naming it) when a running or paused
  // domain uses `folder`, or when another barge holds the lock of a domain
  // using it; otherwise those locks are taken. Libvirt errors are wrapped
  // with a hint at --no-libvirt.
  Status LockUsers(const std::string& folder);

  // The MigrateRepoint: the domains whose XML (persistent or live) names
  // `old_dir` or a path in it (DomainsUsingFolder, so also a domain that
  // began using it during the copy) are locked if they are not yet, and
  // redefined on `new_dir`; then the catalog. kBusy for such a domain that
  // runs or is paused, or whose lock another barge holds.
  Status Repoint(const std::string& old_dir, const std::string& new_dir);

 private:
  Status Lock(const std::string& domain);
  Env& env_;
  std::string uri_;
  std::string catalog_path_;
  std::map<std::string, std::unique_ptr<EnvLock>> locks_;
};

// A libvirt domain whose XML (persistent or live) names a file inside a
// folder: a disk's source, NVRAM, a TPM's state...
struct DomainUsingFolder {
  std::string name;
  std::string state;  // "running", "paused", "shut off", ...
  bool active = false;  // a QEMU process runs (running or paused)
};

// Every domain of the libvirt at `uri` ("" = BARGE_LIBVIRT_URI or
// qemu:///system) whose XML names `folder` itself or a path inside it
// (also by the folder's real path, when it differs).
Result<std::vector<DomainUsingFolder>> DomainsUsingFolder(Env& env, const std::string& folder,
                                                          const std::string& uri = "");

}  // namespace barge::orchestrate
