// barge vm instant-restore's steps, shared by its run
// (instant_restore.cc) and the steps' file (instant_restore_steps.cc):
// the record a run writes, the export thread, and the export, overlay,
// prefill, mirror and damage steps. Internal to orchestrate/vm.
#pragma once

#include <libvirt/libvirt.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/remote_files.h"
#include "orchestrate/vm/instant_restore.h"
#include "pipeline/export.h"

namespace barge::orchestrate::instant_steps {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What a run writes before it changes anything, and what a rerun reads.
struct Record {
  std::string owner;
  std::string chain;      // absolute chain folder
  std::string point_id;   // the point, by id
  std::string target;     // vda
  std::string disk;       // DISK, absolute
  std::string scratch;    // the private folder of the overlay and the socket
  std::string original;   // the domain's <disk> element before the run (one line)
  bool prefilled = false; // DISK holds the point, restored and verified: only the guest's writes are left
  bool pivoted = false;   // written right after the pivot: only the cleanup is left
  // Remote: scratch is DISK's folder on the host, the overlay a volume in
  // it; the export listens on `listen` (ADDR:PORT of this machine, the
  // same on a rerun: the running domain reconnects there); `pool` is the
  // transient storage pool this restore made over that folder ("" when
  // one already covered it).
  bool remote = false;
  std::string listen;
  std::string pool;
  int64_t nbdkit_pid = 0;  // the export of the run that wrote it
  // The damaged range a run's restore found in the point (guest offset and
  // length; length 0: none found): a rerun checks it first and says so at
  // once, instead of restoring up to it again.
  uint64_t damaged_offset = 0;
  uint64_t damaged_length = 0;
};

// QEMU's user and group for the domain (nullopt: libvirt names none, and
// what QEMU opens stays root's).
using QemuOwner = std::optional<std::pair<uid_t, gid_t>>;

class ExportThread;

// The export of a killed run, if it still runs: nbdkit keeps serving (and
// its TCP port) while a TLS client stays connected after its parent died.
// Called with the domain's lock held, so no run that owns it is alive; the
// PID must still name an nbdkit.
void EndLeftoverExport(Env& env, const Record& r);

// Remote: the full block copy read the point through the export, and
// failed. A damaged cluster fails it: the point read here, every cluster
// checked, names the first one (kCorruption); OK when none is damaged.
Status FindDamage(Env& env, const Record& r, const InstantRestoreRequest& req);

// The <disk> element of `target` in a domain XML.
Result<DomainDisk> FindDisk(const std::string& xml, std::string* target);

// After the pivot: the persistent definition names DISK too, the export
// is stopped and the overlay, socket and record removed.
Status Finish(Env& env, virConnectPtr conn, virDomainPtr dom, Record r, const std::string& record_path,
              ExportThread* exp, const std::string& domain);

// `path` (the overlay, the export's socket) for QEMU's user and group
// alone: `mode` (0600, 0660), owned by them. Every other local user is
// kept out: the overlay holds the guest's writes, the socket serves the
// backup point.
Status GiveToQemu(Env& env, const std::string& path, const QemuOwner& owner, uint32_t mode);

// A port of the range on this machine for the export: leased (no other
// barge takes it while this run lives) and free. `want` > 0: that port
// only (a rerun; the running domain reconnects to it).
Result<std::unique_ptr<NbdPortLease>> LeaseExportPort(Env& env, const InstantRestoreRequest& req,
                                                      const std::string& addr, int want);

// The PORT of the record's "ADDR:PORT" listen address.
int ListenPort(const Record& r);

// This machine's address on the route to `host` (a UDP socket connected
// there sends nothing): where the host's QEMU reaches the export.
Result<std::string> LocalAddressFacing(const std::string& host);

// The local scratch folder (the overlay's and the socket's): made when
// missing, and refused unless it is a folder this process's user owns (a
// folder or link someone planted under its name is never used); 0711, so
// that QEMU reaches the two files by name while nobody lists them.
Status MakeScratch(Env& env, const std::string& dir);

// The guest's writes moved onto the prefilled DISK: a shallow block copy
// (QEMU's mirror with sync=top) of the overlay alone onto DISK as it is
// (REUSE_EXT), followed until in sync, then pivoted. The mirror copies every
// cluster allocated in the overlay and, from its start, every new write, so
// DISK ends as the point plus all the guest's writes; it never reads the
// export. Rerunning it over a DISK that already got some of them gives the
// same result. Remote: a full block copy instead (DISK a new empty raw
// volume), which reads the point from the export, every cluster checked
// there (a damaged one fails the job, never wrong bytes on DISK).
Status MirrorAndPivot(Env& env, virDomainPtr dom, const Record& r, const InstantRestoreRequest& req,
                      InstantRestoreResult& result, ExportThread& exp, int& restarts);

// The storage pool over the record's folder on the host: one that already
// covers it, or a transient dir pool of this restore (named in r.pool).
Result<VirPool> OpenRemoteFolder(virConnectPtr conn, Record& r, const std::string& domain);

// The domain's <disk> `element` on the record's overlay over the export.
std::string OverlayElement(const std::string& element, const Record& r);

// The overlay's file name (remote: a volume beside DISK) and its path.
std::string OverlayName(const Record& r);
std::string OverlayPath(const Record& r);

// DISK filled with the point by barge's own restore (every cluster checked
// against the point's digests, the image digest compared, written under a
// temporary name and renamed when verified), while the domain runs on the
// overlay: QEMU never writes DISK before it holds the whole point. The
// export is kept up meanwhile.
Status Prefill(Env& env, const Record& r, const InstantRestoreRequest& req, ExportThread& exp,
               InstantRestoreResult& result, int& restarts);

// The record file at `path`: nullopt when there is none; kCorruption when
// it lacks a field.
Result<std::optional<Record>> ReadRecord(Env& env, const std::string& path);

// The recorded damaged range, read again through the point: the
// Corruption error when it is still damaged, OK when it reads fine now
// (the layer was repaired) or none is recorded.
Status RecheckDamage(Env& env, const Record& r);

// The damaged range `damage` names, in the record.
Status RecordDamage(Env& env, const std::string& record_path, Record& r, const Error& damage);

// The domain's persistent definition with disk `from` (an element of it)
// replaced by `to`.
Status Redefine(virConnectPtr conn, virDomainPtr dom, const std::string& target, const std::string& to);

// The overlay's volume and the pool this restore made, gone.
Status RemoveRemoteScratch(virConnectPtr conn, Record& r, const std::string& domain);

// Runs a program to the end; its stdout (and stderr in the error).
Result<std::string> RunTool(Env& env, const std::vector<std::string>& args, const std::string& scratch,
                            const std::string& package);

// The point is damaged (`damage`: the restore's Corruption error, naming the
// layer file and the cluster's guest offset) while the domain runs on the
// overlay over the export: said at once (phase "damaged", with what to do),
// recorded, and the export kept serving every good cluster (reads of the
// damaged one fail with EIO in the guest) until the domain stops or the
// run is stopped. DISK is never pivoted to. Returns the damage (exit 2).
Status ServeDamaged(Env& env, virDomainPtr dom, Record& r, const std::string& record_path,
                    const InstantRestoreRequest& req, ExportThread& exp, InstantRestoreResult& result, int& restarts,
                    Error damage);

// The local export's socket, in the scratch folder.
std::string SocketPath(const Record& r);

// The record written to `path` atomically (one field a line).
Status WriteRecord(Env& env, const std::string& path, const Record& r);

// Keeps the export up while the domain reads from it: an export that ended
// on its own (nbdkit killed or crashed) is started again on the same
// socket, where QEMU's NBD client reconnects on a later request. The reads
// the guest made meanwhile failed with EIO (never wrong bytes).
Status KeepExportUp(Env& env, const Record& r, const InstantRestoreRequest& req, ExportThread& exp,
                    InstantRestoreResult& result, int& restarts);

// The export of the record's point on its socket, in a thread of this
// process (nbdkit --exit-with-parent: it ends with us, even on SIGKILL).
// One thread at a time.
class ExportThread {
 public:
  ~ExportThread() { Stop(); }
  // Remote: nbdkit's server certificates for the TCP export.
  void set_tls_certificates(std::string dir) { tls_certificates_ = std::move(dir); }
  // Local: QEMU's user and group (QemuDacOwner), given the socket alone.
  void set_socket_owner(QemuOwner owner) { socket_owner_ = owner; }
  Status Start(Env& env, const Record& r, int64_t* nbdkit_pid) {
    Begin(env, r);
    return WaitReady(env, r, nbdkit_pid);
  }
  // Start in two halves, so that the caller can make the overlay while
  // nbdkit starts (its chain checks and digest tables take most of the
  // time before the domain can start).
  void Begin(Env& env, const Record& r) {
    Stop();
    stop_ = false;
    ready_ = false;
    ended_ = false;
    status_ = OkStatus();
    req_.chain = r.chain;
    req_.at = r.point_id;
    if (r.remote) {
      req_.listen = r.listen;
      req_.tls_certificates = tls_certificates_;
    } else {
      IgnoreError(env.UnlinkIfExists(SocketPath(r)), "a socket a killed export left");
      req_.socket_path = SocketPath(r);
    }
    req_.cancel = &stop_;
    req_.on_ready = [this](const pipeline::ExportReady& ready) {
      pid_ = ready.nbdkit_pid;
      ready_ = true;
    };
    thread_ = std::thread([this, &env] {
      auto r = pipeline::RunExport(env, req_);
      if (!r.ok()) status_ = r.error();
      ended_ = true;
    });
  }
  Status WaitReady(Env& env, const Record& r, int64_t* nbdkit_pid) {
    while (!ready_ && !ended_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!ready_) {
      Stop();
      return status_;
    }
    // QEMU runs as its own user: it alone may connect (0660, QEMU's user
    // and group; the folder around it is ours, 0711, names not listable).
    if (!r.remote) BARGE_RETURN_IF_ERROR(GiveToQemu(env, SocketPath(r), socket_owner_, 0660));
    *nbdkit_pid = pid_;
    return OkStatus();
  }
  bool ended() const { return ended_; }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  pipeline::ExportRequest req_;
  std::string tls_certificates_;
  QemuOwner socket_owner_;
  std::thread thread_;
  std::atomic<bool> stop_{false}, ready_{false}, ended_{false};
  std::atomic<int64_t> pid_{0};
  Status status_ = OkStatus();
};

}  // namespace barge::orchestrate::instant_steps
