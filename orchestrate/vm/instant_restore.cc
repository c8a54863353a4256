// barge vm instant-restore: export, overlay, start, restore onto DISK,
// shallow block copy of the guest's writes, pivot; every step restartable
// from the record file.
#include "orchestrate/vm/instant_restore.h"
#include "orchestrate/vm/instant_restore_steps.h"

#include <arpa/inet.h>
#include <libvirt/libvirt.h>
#include <signal.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <regex>
#include <set>
#include <span>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/path.h"
#include "formats/units.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/remote_files.h"
#include "orchestrate/vm/cbt.h"
#include "pipeline/chain.h"
#include "pipeline/child_process.h"
#include "pipeline/export.h"
#include "pipeline/point_reader.h"
#include "pipeline/restore.h"

namespace barge::orchestrate {
using namespace instant_steps;  // NOLINT: this file runs the steps

namespace {

std::string OverlayDiskXmlWith(const std::string& element, const std::string& overlay, const std::string& nbd_source) {
  std::string e = std::regex_replace(element, std::regex("<disk type=['\"][a-z]+['\"]"), "<disk type='file'");
  e = std::regex_replace(e, std::regex("<backingStore[^>]*/>"), "");
  e = std::regex_replace(e, std::regex("<backingStore[\\s\\S]*</backingStore>"), "");
  e = std::regex_replace(e, std::regex("<source[^>]*/>|<source[^>]*>[\\s\\S]*?</source>"), "");
  e = std::regex_replace(e, std::regex("(<driver[^>]*) type=['\"][a-z0-9]+['\"]"), "$1");
  e = std::regex_replace(e, std::regex("<driver"), "<driver type='qcow2'");
  const std::string source = "<source file='" + XmlEscape(overlay) +
                             "'/><backingStore type='network'><format type='raw'/>" + nbd_source +
                             "<backingStore/></backingStore>";
  const size_t t = e.find("<target");
  return e.substr(0, t) + source + e.substr(t);
}

}  // namespace

std::string InstantOverlayDiskXml(const std::string& element, const std::string& overlay, const std::string& socket) {
  return OverlayDiskXmlWith(element, overlay,
                            "<source protocol='nbd'><host transport='unix' socket='" + XmlEscape(socket) +
                                "'/></source>");
}

std::string InstantOverlayDiskXmlTcp(const std::string& element, const std::string& overlay, const std::string& host,
                                     int port) {
  return OverlayDiskXmlWith(element, overlay,
                            "<source protocol='nbd' tls='yes'><host name='" + XmlEscape(host) + "' port='" +
                                std::to_string(port) + "'/></source>");
}

std::string InstantRestoreRecordPath(const std::string& catalog_path, const std::string& domain) {
  std::string lock = DomainLockPath(catalog_path, domain);
  return lock.substr(0, lock.size() - std::string_view(".lock").size()) + ".instant-restore";
}

namespace {

// The request's own checks: a remote domain needs nbdkit's server
// certificates and an absolute DISK (a path on the host).
Status CheckInstantRequest(const InstantRestoreRequest& req, const LibvirtUri& uri) {
  if (uri.remote() && req.tls_certificates.empty()) {
    return Error::InvalidArgument("a remote domain (" + uri.Redacted() +
                                  ") reads the export over TCP with TLS: give --tls-certificates DIR (ca-cert.pem, "
                                  "server-cert.pem, server-key.pem for this machine's address)");
  }
  if (uri.remote() && !IsAbsolutePath(req.disk)) {
    return Error::InvalidArgument("with a remote --connect, --to is a path on the host: give it absolute")
        .set_path(req.disk);
  }
  return OkStatus();
}

// Where a restore stands: the record `found` of an unfinished one (which
// must be this command's: a rerun continues it), or a new record, written
// before anything is made (the domain must be shut off; DISK must not
// exist unless --force; a remote export's port is leased into
// `port_lease`).
struct RestoreWhere {
  std::string record_path;
  std::string chain_abs;
  std::string disk_abs;
  pipeline::PointLocation point;
};
Result<Record> BeginRecord(Env& env, virConnectPtr conn, virDomainPtr dom, const InstantRestoreRequest& req,
                           const LibvirtUri& uri, const std::optional<Record>& found, const RestoreWhere& w,
                           std::unique_ptr<NbdPortLease>& port_lease, InstantRestoreResult& result) {
  const bool remote = uri.remote();
  Record r;
  if (found) {
    r = *found;
    if (r.disk != w.disk_abs || r.chain != w.chain_abs || r.remote != remote ||
        (!req.target.empty() && req.target != r.target)) {
      return Error::InvalidArgument("an unfinished instant restore of this domain (chain " + r.chain + ", point " +
                                    r.point_id + ", disk " + r.target + " to " + r.disk +
                                    (r.remote ? " on the remote host" : "") +
                                    ") is recorded; rerun that command to finish it")
          .set_path(w.record_path);
    }
    result.resumed = true;
    return r;
  }
  BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom, VIR_DOMAIN_XML_INACTIVE));
  std::string target = req.target;
  BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(xml, &target));
  if (DomainIsActive(dom)) {
    return Error::InvalidArgument("domain '" + req.domain +
                                  "' is running on its own disk; shut it off first (instant restore starts it)");
  }
  BARGE_ASSIGN_OR_RETURN(auto reader, pipeline::PointReader::Open(env, w.chain_abs, w.point.at));
  r.owner = ProcessOwner::Self(env).Encode();
  r.chain = w.chain_abs;
  r.point_id = reader->manifest().id;
  r.target = target;
  r.disk = w.disk_abs;
  r.original = d.element;
  r.remote = remote;
  if (remote) {
    r.scratch = DirName(w.disk_abs);
    BARGE_ASSIGN_OR_RETURN(VirPool pool, OpenRemoteFolder(conn, r, req.domain));
    if (RemoteFileExists(pool.get(), BaseName(w.disk_abs)) && !req.force) {
      IgnoreError(CloseRemoteFolder(pool.get(), r.pool), "nothing was made in it");
      return Error::InvalidArgument("DISK exists on the host; give --force to replace it").set_path(w.disk_abs);
    }
    BARGE_ASSIGN_OR_RETURN(std::string here, LocalAddressFacing(uri.host));
    BARGE_ASSIGN_OR_RETURN(port_lease, LeaseExportPort(env, req, here, 0));
    r.listen = here + ":" + std::to_string(port_lease->port());
  } else {
    if (env.Exists(w.disk_abs) && !req.force) {
      return Error::InvalidArgument("DISK exists; give --force to replace it").set_path(w.disk_abs);
    }
    // A fresh folder beside DISK (mkdtemp: a name nobody planted or
    // predicts); the record keeps its name for the reruns.
    BARGE_RETURN_IF_ERROR(env.CreateDirs(DirName(w.disk_abs)));
    BARGE_ASSIGN_OR_RETURN(r.scratch,
                           env.CreateTempDir(DirName(w.disk_abs), ".barge-instant-" + EscapeLockName(req.domain) + "-"));
  }
  Status recorded = env.CreateDirs(DirName(w.record_path));
  if (recorded.ok()) recorded = WriteRecord(env, w.record_path, r);
  if (!recorded.ok()) {
    if (!remote) IgnoreError(env.RemoveDir(r.scratch), "an empty folder; the record is the error reported");
    return std::move(recorded).error();
  }
  return r;
}

// --abandon: the domain (shut off) goes back to its own disk, the overlay,
// DISK and the scratch folder go, and the record.
Status Abandon(Env& env, virConnectPtr conn, virDomainPtr dom, Record& r, const InstantRestoreRequest& req,
               const std::string& record_path) {
  if (DomainIsActive(dom)) {
    return Error::InvalidArgument("domain '" + req.domain +
                                  "' is running; shut it off first (abandoning drops the guest's writes in the "
                                  "overlay)");
  }
  BARGE_ASSIGN_OR_RETURN(std::string config, DomainXml(dom, VIR_DOMAIN_XML_INACTIVE));
  std::string t = r.target;
  BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(config, &t));
  if (r.pivoted || d.source == r.disk) {
    return Error::InvalidArgument("the restore of domain '" + req.domain +
                                  "' is complete on DISK; rerun without --abandon to clean up")
        .set_path(r.disk);
  }
  if (d.source == OverlayPath(r)) BARGE_RETURN_IF_ERROR(Redefine(conn, dom, r.target, r.original));
  if (r.remote) {
    BARGE_ASSIGN_OR_RETURN(VirPool pool, OpenRemoteFolder(conn, r, req.domain));
    BARGE_RETURN_IF_ERROR(DeleteRemoteFile(pool.get(), BaseName(r.disk)));
    BARGE_RETURN_IF_ERROR(RemoveRemoteScratch(conn, r, req.domain));
  } else {
    BARGE_RETURN_IF_ERROR(env.RemoveTree(r.scratch));
    BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(r.disk));
    // The half-restored DISK a run killed during the prefill left under
    // its temporary name (the domain's lock keeps any other run out).
    BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(TempPathFor(r.disk)));
  }
  return env.UnlinkIfExists(record_path);
}

// The export's side: remote, the leased port (a rerun's: the same one, where
// the running domain's QEMU reconnects), nbdkit's certificates and the
// host's folder (`pool`); local, the scratch folder and QEMU's owner for
// the socket. Then nbdkit starts (exp.Begin; the caller waits for it).
Status SetUpExport(Env& env, virConnectPtr conn, const InstantRestoreRequest& req, Record& r,
                   const std::string& record_path, const std::string& live, std::unique_ptr<NbdPortLease>& port_lease,
                   ExportThread& exp, VirPool& pool, QemuOwner& qemu_owner) {
  if (r.remote) {
    if (port_lease == nullptr) {
      EndLeftoverExport(env, r);
      BARGE_ASSIGN_OR_RETURN(port_lease, LeaseExportPort(env, req, r.listen.substr(0, r.listen.rfind(':')),
                                                         ListenPort(r)));
    }
    exp.set_tls_certificates(req.tls_certificates);
    BARGE_ASSIGN_OR_RETURN(pool, OpenRemoteFolder(conn, r, req.domain));
    BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));  // the pool's name, when this run made it
  } else {
    BARGE_RETURN_IF_ERROR(MakeScratch(env, r.scratch));
    qemu_owner = QemuDacOwner(conn, live);
    exp.set_socket_owner(qemu_owner);
  }
  exp.Begin(env, r);
  return OkStatus();
}

// A shut-off domain's disk put on the overlay over the export (`size`: the
// point's). An overlay the domain already ran on holds the guest's writes:
// kept.
Status PutOnOverlay(Env& env, virConnectPtr conn, virDomainPtr dom, const Record& r, const DomainDisk& now,
                    VirPool& pool, const QemuOwner& qemu_owner, uint64_t size) {
  if (r.remote) {
    if (now.source != OverlayPath(r) || !RemoteFileExists(pool.get(), OverlayName(r))) {
      BARGE_RETURN_IF_ERROR(CreateRemoteFile(pool.get(), OverlayName(r), "qcow2", size));
      BARGE_RETURN_IF_ERROR(Redefine(conn, dom, r.target, OverlayElement(r.original, r)));
    }
    return OkStatus();
  }
  if (now.source == OverlayPath(r) && env.Exists(OverlayPath(r))) return OkStatus();
  IgnoreError(env.UnlinkIfExists(OverlayPath(r)), "the domain never ran on it");
  const std::string backing = "nbd+unix:///?socket=" + SocketPath(r);
  auto created = RunTool(env,
                         {"qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", "raw",
                          OverlayPath(r), std::to_string(size)},
                         r.scratch, "qemu-utils");
  if (!created.ok()) return std::move(created).error();
  BARGE_RETURN_IF_ERROR(GiveToQemu(env, OverlayPath(r), qemu_owner, 0600));
  return Redefine(conn, dom, r.target, OverlayElement(r.original, r));
}

// Until the pivot the domain runs on the overlay, whatever fails: said so.
Status OnOverlay(const Record& r, Status s) {
  if (s.ok() || s.error().code() == ErrorCode::kCancelled) return s;
  Error e = s.error();
  e.Wrap("moving " + r.target + " to DISK (the domain stays on the overlay; rerun the same command to continue)");
  return e;
}

// DISK gets the point: remote, a new raw file on the host (the mirror
// fills it through the verifying export); local, barge's verified prefill,
// unless a run already made it. A damaged point while the domain runs is
// ServeDamaged's (its error returned).
Status FillDisk(Env& env, virDomainPtr dom, Record& r, const std::string& record_path,
                const InstantRestoreRequest& req, ExportThread& exp, VirPool& pool, uint64_t size,
                InstantRestoreResult& result, int& restarts) {
  if (r.remote) {
    if (Status damaged = RecheckDamage(env, r);
        !damaged.ok() && damaged.error().code() == ErrorCode::kCorruption && DomainIsActive(dom)) {
      return ServeDamaged(env, dom, r, record_path, req, exp, result, restarts, damaged.error());
    }
    // A full copy onto a new DISK every run (one a killed run left may lack
    // anything); the point's bytes come through the verifying export.
    return OnOverlay(r, CreateRemoteFile(pool.get(), BaseName(r.disk), "raw", size));
  }
  if (r.prefilled && env.Exists(r.disk)) return OkStatus();
  // A damaged range a run found before is checked first: still damaged,
  // it is said at once, without restoring up to it again.
  Status filled = RecheckDamage(env, r);
  if (filled.ok()) filled = Prefill(env, r, req, exp, result, restarts);
  if (!filled.ok() && filled.error().code() == ErrorCode::kCorruption) {
    if (DomainIsActive(dom)) return ServeDamaged(env, dom, r, record_path, req, exp, result, restarts, filled.error());
    // Shut off meanwhile: recorded all the same, for the rerun to say at once.
    IgnoreError(RecordDamage(env, record_path, r, filled.error()), "the rerun restores up to it again");
  }
  BARGE_RETURN_IF_ERROR(OnOverlay(r, filled));
  r.prefilled = true;
  BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));
  if (req.on_phase) req.on_phase("verified", "DISK holds point " + r.point_id + ", every cluster verified");
  return OkStatus();
}

// The running domain's disk mirrored onto DISK and pivoted there (remote:
// read through the export, a damaged cluster is ServeDamaged's).
Status MoveToDisk(Env& env, virDomainPtr dom, Record& r, const std::string& record_path,
                  const InstantRestoreRequest& req, ExportThread& exp, uint64_t size, InstantRestoreResult& result,
                  int& restarts) {
  Status moved = MirrorAndPivot(env, dom, r, req, result, exp, restarts);
  if (!moved.ok() && r.remote && moved.error().code() == ErrorCode::kIoError && DomainIsActive(dom)) {
    // The copy read the point through the export: a damaged cluster fails it.
    Status damaged = FindDamage(env, r, req);
    if (!damaged.ok() && damaged.error().code() == ErrorCode::kCorruption) {
      return ServeDamaged(env, dom, r, record_path, req, exp, result, restarts, damaged.error());
    }
  }
  BARGE_RETURN_IF_ERROR(OnOverlay(r, moved));
  if (r.remote) {
    result.verified_bytes = size;
    if (req.on_phase) {
      req.on_phase("verified", "DISK holds point " + r.point_id +
                                   " as read through the export, every cluster verified, and the guest's writes");
    }
  }
  return OkStatus();
}

}  // namespace

Result<InstantRestoreResult> RunInstantRestore(Env& env, const InstantRestoreRequest& req) {
  const auto start = Clock::now();
  InstantRestoreResult result;
  // Resolve: the request, the domain's lock, the record of an unfinished
  // run, the domain, the point.
  BARGE_ASSIGN_OR_RETURN(LibvirtUri uri, ParseLibvirtUri(ResolveLibvirtUri(req.libvirt_uri)));
  BARGE_RETURN_IF_ERROR(CheckInstantRequest(req, uri));
  BARGE_ASSIGN_OR_RETURN(auto lock, TryLockFile(env, DomainLockPath(req.catalog_path, req.domain),
                                                DomainBusyMessage(req.domain)));
  RestoreWhere w;
  w.record_path = InstantRestoreRecordPath(req.catalog_path, req.domain);
  BARGE_ASSIGN_OR_RETURN(std::optional<Record> found, ReadRecord(env, w.record_path));
  BARGE_ASSIGN_OR_RETURN(VirConnection conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(VirDomain dom, LookupDomain(conn.get(), req.domain));
  w.disk_abs = uri.remote() ? LexicallyNormal(req.disk) : AbsolutePath(req.disk);
  BARGE_ASSIGN_OR_RETURN(w.point, pipeline::LocatePoint(env, req.chain, req.at));
  w.chain_abs = AbsolutePath(w.point.chain_dir);
  if (req.abandon && !found) {
    return Error::NotFound("no unfinished instant restore of domain '" + req.domain + "' to abandon")
        .set_path(w.record_path);
  }
  std::unique_ptr<NbdPortLease> port_lease;  // the remote export's port, held while it serves
  BARGE_ASSIGN_OR_RETURN(Record r, BeginRecord(env, conn.get(), dom.get(), req, uri, found, w, port_lease, result));
  const std::string& record_path = w.record_path;
  result.point_id = r.point_id;
  result.disk = r.disk;
  result.target = r.target;
  if (req.abandon) {
    BARGE_RETURN_IF_ERROR(Abandon(env, conn.get(), dom.get(), r, req, record_path));
    result.abandoned = true;
    result.seconds = SecondsSince(start);
    return result;
  }

  // Where the domain is now.
  const bool active = DomainIsActive(dom.get());
  BARGE_ASSIGN_OR_RETURN(std::string live, DomainXml(dom.get(), active ? 0 : VIR_DOMAIN_XML_INACTIVE));
  std::string t = r.target;
  BARGE_ASSIGN_OR_RETURN(DomainDisk now, FindDisk(live, &t));
  if (r.pivoted || now.source == r.disk) {
    // Killed after the pivot (running, or shut off since): only the
    // cleanup is left; DISK holds everything, the overlay is stale.
    BARGE_RETURN_IF_ERROR(Finish(env, conn.get(), dom.get(), r, record_path, nullptr, req.domain));
    result.seconds = SecondsSince(start);
    return result;
  }
  if (active && now.source != OverlayPath(r)) {
    return Error::InvalidArgument("domain '" + req.domain + "' runs with " + r.target + " on " + now.source +
                                  ", not on this restore's overlay " + OverlayPath(r) +
                                  "; shut it off and rerun")
        .set_path(record_path);
  }

  // Serve the point and start the domain on the overlay over it.
  ExportThread exp;
  VirPool pool;
  QemuOwner qemu_owner;
  BARGE_RETURN_IF_ERROR(
      SetUpExport(env, conn.get(), req, r, record_path, live, port_lease, exp, pool, qemu_owner));
  BARGE_ASSIGN_OR_RETURN(auto reader, pipeline::PointReader::Open(env, r.chain, r.point_id, false));
  const uint64_t size = reader->size_bytes();
  reader.reset();
  if (!active) BARGE_RETURN_IF_ERROR(PutOnOverlay(env, conn.get(), dom.get(), r, now, pool, qemu_owner, size));
  BARGE_RETURN_IF_ERROR(exp.WaitReady(env, r, &result.nbdkit_pid));
  r.nbdkit_pid = result.nbdkit_pid;
  BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));
  if (!active) {
    if (virDomainCreate(dom.get()) != 0) return LastVirError("start domain '" + req.domain + "' on the overlay");
    result.started_seconds = SecondsSince(start);
  }
  if (req.on_phase) {
    req.on_phase("started", "domain " + req.domain + " runs on " + OverlayPath(r) + " over the export of " +
                                r.point_id + (r.remote ? " (nbds://" + r.listen + ")" : ""));
  }

  // Fill DISK, move the domain onto it, clean up.
  int restarts = 0;
  BARGE_RETURN_IF_ERROR(FillDisk(env, dom.get(), r, record_path, req, exp, pool, size, result, restarts));
  BARGE_RETURN_IF_ERROR(MoveToDisk(env, dom.get(), r, record_path, req, exp, size, result, restarts));
  r.pivoted = true;
  BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));
  if (req.on_phase) req.on_phase("pivoted", "domain " + req.domain + " runs on " + r.disk);
  pool.reset();
  BARGE_RETURN_IF_ERROR(Finish(env, conn.get(), dom.get(), r, record_path, &exp, req.domain));
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace barge::orchestrate
