// barge vm instant-restore: a shut-off domain started at once on a local
// qcow2 overlay whose backing is the verified export of a point (barge
// export's nbdkit on a unix socket); meanwhile DISK (raw) is filled with
// the point by barge's verified restore, then the guest's writes are
// mirrored onto it by a shallow libvirt block copy and the domain pivoted
// to DISK. A record file beside the domain's lock makes a killed run
// restartable with the same command. docs/export.md, "Instant recovery".
// On a remote hypervisor (--connect with a host) the export listens on TCP
// with TLS, the overlay and DISK are volumes libvirt's storage driver makes
// in DISK's folder on that host, and DISK is filled by a full block copy of
// the overlay and the export under the running domain.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/libvirt/nbd_ports.h"

namespace barge::orchestrate {

struct InstantRestoreRequest {
  std::string catalog_path;  // its locks folder holds the domain's lock and the record
  std::string chain;         // the disk's chain folder (or a manifest/image of it)
  std::string at;            // point selector, as for restore --at
  std::string domain;
  // --connect ("" = $BARGE_LIBVIRT_URI, else qemu:///system). With a
  // remote host, DISK is a path on that host (its folder must exist there)
  // and the export is served on TCP with TLS from this machine.
  std::string libvirt_uri;
  // Remote only: nbdkit's server certificates (ca-cert.pem,
  // server-cert.pem, server-key.pem; the server certificate names this
  // machine's address as the host sees it), required; and the range of
  // this machine's TCP ports the export's port is leased from.
  std::string tls_certificates;
  PortRange port_range;
  std::string port_lock_dir = kDefaultNbdPortLockDir;
  std::string target;        // the domain's disk ("vda"); "" = its only disk
  std::string disk;          // DISK: the raw file the domain ends on
  bool force = false;        // overwrite an existing DISK
  // Give up an unfinished restore of the shut-off domain: its disk back to
  // the recorded original, the overlay (and the guest's writes in it), the
  // scratch folder, DISK and the record removed. Refused for a running
  // domain and after the pivot.
  bool abandon = false;
  // Polled between steps; a cancelled run leaves the domain on the overlay
  // (restartable), kCancelled.
  const std::atomic<bool>* cancel = nullptr;
  // Events for the CLI: "started" (the domain runs on the overlay),
  // "verified" (DISK holds the point), "ready" (the guest's writes are
  // mirrored onto DISK), "pivoted", "export-restarted" (the export ended on
  // its own and was started again); with a line of text.
  std::function<void(const std::string& phase, const std::string& text)> on_phase;
  // Copy progress: bytes restored onto DISK, bytes to restore.
  std::function<void(uint64_t done, uint64_t total)> on_progress;
};

struct InstantRestoreResult {
  std::string point_id;
  std::string disk;            // DISK
  std::string target;          // vda
  bool resumed = false;        // a record of a killed run was found and continued
  bool abandoned = false;      // --abandon: the domain is back on its original disk
  double started_seconds = 0;  // from the call to the domain running (0 when it already ran)
  double seconds = 0;          // the whole run
  uint64_t verified_bytes = 0;      // bytes of the point restored onto DISK and verified by this run
  uint64_t guest_written_bytes = 0; // overlay bytes the guest wrote, mirrored onto DISK
  int64_t nbdkit_pid = 0;           // the export this run started (stopped at the end)
};

// <catalog folder>/locks/domains/<domain>.instant-restore
std::string InstantRestoreRecordPath(const std::string& catalog_path, const std::string& domain);

// A domain's <disk> element with its source replaced by the qcow2
// `overlay` whose backing is the NBD export on unix `socket` (raw): disk
// type file, driver type qcow2 (its other attributes kept), an explicit
// <backingStore type='network'>, target, address and the rest unchanged.
std::string InstantOverlayDiskXml(const std::string& element, const std::string& overlay,
                                  const std::string& socket);
// The same with the backing on TCP with TLS: <source protocol='nbd'
// tls='yes'><host name='HOST' port='PORT'/></source>.
std::string InstantOverlayDiskXmlTcp(const std::string& element, const std::string& overlay,
                                     const std::string& host, int port);

// Runs (or continues) an instant restore. Holds the domain's lock.
// Returns: the result once the domain runs on DISK, verified, with the
// export stopped and the overlay removed; kInvalidArgument (the domain runs
// on something that is not this restore's overlay, several disks and no
// --target, sizes differ, DISK exists and no --force), kBusy (the domain's
// lock), kCorruption (a damaged point: the restore onto DISK fails and the
// domain stays on the overlay), kIoError (libvirt, the block job, qemu-img,
// an export that keeps ending), the export's and the restore's errors.
Result<InstantRestoreResult> RunInstantRestore(Env& env, const InstantRestoreRequest& request);

}  // namespace barge::orchestrate
