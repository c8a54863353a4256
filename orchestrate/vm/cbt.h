// Changed-block tracking for raw disks: a metadata-only qcow2 overlay over
// each raw disk (external data file) with one enabled persistent bitmap, and
// the domain's persistent XML switched to it; disable switches those disks
// back on the definition as it is then (other changes since enable stay).
// Both refuse a running domain, and hold the domain's lock (DomainLockPath,
// kBusy when a backup or state migration holds it). State is kept in the
// catalog (table vm_cbt).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/vm/vm_backup.h"

namespace barge::orchestrate {

inline constexpr const char* kCbtBitmapName = "barge-cbt";

// Parsing of libvirt replies (domain XML, capabilities), untrusted input:
// a DAC label "+uid:+gid" -> {uid, gid} (nullopt when malformed), and the
// text of the first <tag ...>TEXT</tag> at or after `from` ("" if none).
std::optional<std::pair<uid_t, gid_t>> ParseDacLabel(std::string label);
std::string ElementText(const std::string& xml, const std::string& tag, size_t from = 0);
// The user and group QEMU runs as for a domain (its XML) under libvirt's
// DAC model: the domain's own DAC label if it has one, else the driver's
// base label for the domain type; nullopt when libvirt reports neither.
// What barge makes for QEMU alone (instant restore's overlay and socket,
// a backup job's socket folder) is given to them.
std::optional<std::pair<uid_t, gid_t>> QemuDacOwner(virConnectPtr conn, const std::string& domain_xml);

struct CbtDisk {
  std::string disk;
  std::string data_file;  // the raw disk
  std::string overlay;    // the qcow2 overlay
  // The data file's owner before enable ("uid:gid"), when enable handed it
  // to QEMU's user; disable gives it back. "" = unchanged.
  std::string original_owner;
};

struct CbtStatus {
  std::string domain;
  // "Disabled", "Enabled", "PendingRestart" (the running instance still uses
  // the XML from before enable/disable; takes effect at the next start).
  std::string state;
  std::string state_dir;  // "" for a domain on another host (its overlays are beside its raw disks)
  std::vector<CbtDisk> disks;
  // The host of a domain on another host (its libvirt URI without
  // secrets), where the paths of `disks` are; "" for this machine.
  std::string host;
};

struct CbtRequest {
  std::string domain;
  std::string state_dir;  // "" = <catalog folder>/cbt/<domain>
  std::string catalog_path;
  std::string libvirt_uri;
};

// The state folder, the overlays and the raw disks' owners are handled
// through `env`; for a domain on another host (a remote `libvirt_uri`),
// each overlay is made here and put beside its raw disk on that host
// through libvirt's storage API (remote_files.h), and the raw disks' owners
// are only checked (a raw disk QEMU's user cannot read and write is
// refused: barge cannot change a remote file's owner).
// Creates the overlays (raw file disks only; kInvalidArgument when there is
// none) and defines the domain on them. Enabling twice, or on a running
// domain (its raw disks are labelled for the running QEMU), is an error.
Result<CbtStatus> EnableCbt(Env& env, const CbtRequest& request);
// Switches each disk enable moved back from its overlay to its raw disk, on
// the domain's definition as it is now, and removes the overlays. kNotFound
// for a domain libvirt does not know; kInvalidArgument when CBT is not
// enabled for it. Refuses (kInvalidArgument, nothing changed) a running domain, and a definition
// where such a disk is gone or no longer on barge's overlay. A failure to remove an overlay or give a raw disk back after
// the domain was redefined is an error naming what is left (CBT is
// disabled all the same).
Result<CbtStatus> DisableCbt(Env& env, const CbtRequest& request);
Result<CbtStatus> GetCbtStatus(Env& env, const CbtRequest& request);

// The CBT overlays of `domain` (raw disk + metadata-only overlay per disk),
// or nullopt when CBT is not enabled for it.
Result<std::optional<std::vector<CbtDisk>>> CbtDisksOf(BackupCatalog& catalog, const std::string& domain);

// After `barge state migrate` moved a folder: every CBT record's state
// folder, overlays, raw disks and remembered pre-enable XML that named a
// path in one of `old_dirs` (the folder's absolute and real paths) names
// it under `new_dir` instead (ReplacePathPrefix, MovePath). Runs inside the
// caller's transaction, if any; idempotent.
Status RepointCbtPaths(BackupCatalog& catalog, const std::vector<std::string>& old_dirs, const std::string& new_dir);

}  // namespace barge::orchestrate
