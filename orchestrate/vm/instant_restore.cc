// barge vm instant-restore: export, overlay, start, restore onto DISK,
// shallow block copy of the guest's writes, pivot; every step restartable
// from the record file.
#include "orchestrate/vm/instant_restore.h"

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
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

std::string Field(const std::string& text, const std::string& key) {
  const std::string k = key + "=";
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (text.compare(at, k.size(), k) == 0) return text.substr(at + k.size(), end - at - k.size());
    at = end + 1;
  }
  return "";
}

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

Status WriteRecord(Env& env, const std::string& path, const Record& r) {
  const std::string text = "owner=" + r.owner + "\nchain=" + r.chain + "\npoint=" + r.point_id + "\ntarget=" +
                           r.target + "\ndisk=" + r.disk + "\nscratch=" + r.scratch +
                           "\noriginal=" + OneLine(r.original) + "\nprefilled=" + (r.prefilled ? "yes" : "no") +
                           "\npivoted=" + (r.pivoted ? "yes" : "no") + "\nremote=" + (r.remote ? "yes" : "no") +
                           "\nlisten=" + r.listen + "\npool=" + r.pool +
                           "\nnbdkit=" + std::to_string(r.nbdkit_pid) +
                           "\ndamaged=" + std::to_string(r.damaged_offset) + "+" + std::to_string(r.damaged_length) +
                           "\n";
  return env.WriteFileAtomic(path, std::string_view(text));
}

Result<std::optional<Record>> ReadRecord(Env& env, const std::string& path) {
  auto text = env.ReadFile(path, 1 << 20);
  if (!text.ok()) {
    if (text.error().code() == ErrorCode::kNotFound) return std::optional<Record>();
    return std::move(text).error();
  }
  Record r{Field(*text, "owner"),  Field(*text, "chain"),   Field(*text, "point"),   Field(*text, "target"),
           Field(*text, "disk"),   Field(*text, "scratch"), Field(*text, "original"),
           Field(*text, "prefilled") == "yes", Field(*text, "pivoted") == "yes", Field(*text, "remote") == "yes",
           Field(*text, "listen"), Field(*text, "pool"), std::atoll(Field(*text, "nbdkit").c_str()), 0, 0};
  if (const std::string d = Field(*text, "damaged"); d.find('+') != std::string::npos) {
    r.damaged_offset = std::strtoull(d.c_str(), nullptr, 10);
    r.damaged_length = std::strtoull(d.c_str() + d.find('+') + 1, nullptr, 10);
  }
  if (r.chain.empty() || r.disk.empty() || r.scratch.empty() || r.target.empty()) {
    return Error::Corruption("the instant-restore record lacks a field (chain, disk, scratch, target)").set_path(path);
  }
  return std::optional<Record>(std::move(r));
}

std::string OverlayName(const Record& r) { return ".barge-instant-" + BaseName(r.disk) + ".qcow2"; }
std::string OverlayPath(const Record& r) {
  return r.remote ? JoinPath(r.scratch, OverlayName(r)) : JoinPath(r.scratch, "overlay.qcow2");
}
// ADDR and PORT of a record's "ADDR:PORT" ("[v6]:PORT").
std::string ListenHost(const Record& r) {
  std::string h = r.listen.substr(0, r.listen.rfind(':'));
  if (h.size() > 1 && h.front() == '[') h = h.substr(1, h.size() - 2);
  return h;
}
int ListenPort(const Record& r) { return std::atoi(r.listen.substr(r.listen.rfind(':') + 1).c_str()); }
std::string SocketPath(const Record& r) { return JoinPath(r.scratch, "nbd.sock"); }

// QEMU's user and group for the domain (nullopt: libvirt names none, and
// what QEMU opens stays root's).
using QemuOwner = std::optional<std::pair<uid_t, gid_t>>;

// `path` (the overlay, the export's socket) for QEMU's user and group
// alone: `mode` (0600, 0660), owned by them. Every other local user is
// kept out: the overlay holds the guest's writes, the socket serves the
// backup point.
Status GiveToQemu(Env& env, const std::string& path, const QemuOwner& owner, uint32_t mode) {
  BARGE_RETURN_IF_ERROR(env.SetMode(path, mode));
  if (owner) BARGE_RETURN_IF_ERROR(env.SetOwner(path, owner->first, owner->second));
  return OkStatus();
}

// The local scratch folder (the overlay's and the socket's): made when
// missing, and refused unless it is a folder this process's user owns (a
// folder or link someone planted under its name is never used); 0711, so
// that QEMU reaches the two files by name while nobody lists them.
Status MakeScratch(Env& env, const std::string& dir) {
  BARGE_RETURN_IF_ERROR(env.CreateDirs(DirName(dir)));
  BARGE_RETURN_IF_ERROR(env.CreateDir(dir, 0700));
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.StatNoFollow(dir));
  if (!st.is_directory() || st.uid != ::geteuid()) {
    return Error::InvalidArgument("the instant restore's scratch folder is not a folder of this user (planted by "
                                  "someone else?); remove it and rerun")
        .set_path(dir);
  }
  return env.SetMode(dir, 0711);
}

// Runs a program to the end; its stdout (and stderr in the error).
Result<std::string> RunTool(Env& env, const std::vector<std::string>& args, const std::string& scratch,
                            const std::string& package) {
  pipeline::SpawnOptions o;
  o.stdout_path = JoinPath(scratch, "tool.out");
  o.stderr_path = JoinPath(scratch, "tool.err");
  pipeline::ChildProcess child;
  BARGE_RETURN_IF_ERROR(child.Spawn(args, o, package));
  const int status = child.Wait();
  auto out = env.ReadFile(o.stdout_path, 64 << 20);
  auto err = env.ReadFile(o.stderr_path, 1 << 16);
  IgnoreError(env.UnlinkIfExists(o.stdout_path), "scratch output");
  IgnoreError(env.UnlinkIfExists(o.stderr_path), "scratch output");
  if (pipeline::ExitStatusOf(status) != 0) {
    return Error::IoError(args[0] + " " + args[1] + " " + pipeline::DescribeWaitStatus(status) + ": " +
                          OneLine(err.ok() ? *err : std::string()))
        .set_path(args.back());
  }
  if (!out.ok()) return std::move(out).error();
  return *out;
}

// The <disk> element of `target` in a domain XML.
Result<DomainDisk> FindDisk(const std::string& xml, std::string* target) {
  std::vector<DomainDisk> disks = ParseDomainDisks(xml);
  if (target->empty()) {
    if (disks.size() != 1) {
      return Error::InvalidArgument("the domain has " + std::to_string(disks.size()) +
                                    " disks; name the one to restore with --target (vda, vdb, ...)");
    }
    *target = disks[0].target;
    return disks[0];
  }
  for (const DomainDisk& d : disks) {
    if (d.target == *target) return d;
  }
  return Error::InvalidArgument("the domain has no disk '" + *target + "'");
}

std::string OverlayElement(const std::string& element, const Record& r) {
  if (r.remote) return InstantOverlayDiskXmlTcp(element, OverlayPath(r), ListenHost(r), ListenPort(r));
  return InstantOverlayDiskXml(element, OverlayPath(r), SocketPath(r));
}

// The domain's persistent definition with disk `from` (an element of it)
// replaced by `to`.
Status Redefine(virConnectPtr conn, virDomainPtr dom, const std::string& target, const std::string& to) {
  BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom, VIR_DOMAIN_XML_INACTIVE | VIR_DOMAIN_XML_SECURE));
  std::string t = target;
  BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(xml, &t));
  const size_t at = xml.find(d.element);
  if (at == std::string::npos) return Error::Internal("disk element not found in the domain XML");
  xml.replace(at, d.element.size(), to);
  virDomainPtr nd = virDomainDefineXML(conn, xml.c_str());
  if (nd == nullptr) return LastVirError("define the domain with its disk " + target + " changed");
  virDomainFree(nd);
  return OkStatus();
}

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

// Keeps the export up while the domain reads from it: an export that ended
// on its own (nbdkit killed or crashed) is started again on the same
// socket, where QEMU's NBD client reconnects on a later request. The reads
// the guest made meanwhile failed with EIO (never wrong bytes).
Status KeepExportUp(Env& env, const Record& r, const InstantRestoreRequest& req, ExportThread& exp,
                    InstantRestoreResult& result, int& restarts) {
  if (!exp.ended()) return OkStatus();
  if (++restarts > 5) return Error::IoError("the export ended " + std::to_string(restarts) + " times; rerun to continue");
  BARGE_RETURN_IF_ERROR(exp.Start(env, r, &result.nbdkit_pid));
  if (req.on_phase) {
    req.on_phase("export-restarted", "the export ended on its own; started again (nbdkit " +
                                         std::to_string(result.nbdkit_pid) + ")");
  }
  return OkStatus();
}

// --- Remote: files on the hypervisor through libvirt's storage driver. ---

// The storage pool over the record's folder on the host: one that already
// covers it, or a transient dir pool of this restore (named in r.pool).
Result<VirPool> OpenRemoteFolder(virConnectPtr conn, Record& r, const std::string& domain) {
  return orchestrate::OpenRemoteFolder(conn, r.scratch, "barge-instant-" + EscapeLockName(domain), &r.pool);
}

// The overlay's volume and the pool this restore made, gone.
Status RemoveRemoteScratch(virConnectPtr conn, Record& r, const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(VirPool pool, OpenRemoteFolder(conn, r, domain));
  BARGE_RETURN_IF_ERROR(DeleteRemoteFile(pool.get(), OverlayName(r)));
  return CloseRemoteFolder(pool.get(), r.pool);
}

// This machine's address on the route to `host` (a UDP socket connected
// there sends nothing): where the host's QEMU reaches the export.
Result<std::string> LocalAddressFacing(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), "10809", &hints, &found); rc != 0) {
    return Error::NotFound("resolve " + host + ": " + ::gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  const int fd = ::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::FromErrno(errno, "socket", host);
  sockaddr_storage me{};
  socklen_t len = sizeof(me);
  const bool ok = ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) return Error::FromErrno(err, "find this machine's address towards the host", host);
  char text[INET6_ADDRSTRLEN] = {};
  const void* a = me.ss_family == AF_INET6 ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&me)->sin6_addr)
                                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&me)->sin_addr);
  ::inet_ntop(me.ss_family, a, text, sizeof(text));
  return me.ss_family == AF_INET6 ? "[" + std::string(text) + "]" : std::string(text);
}

// Whether something on this machine already listens on ADDR:PORT.
bool PortTaken(const std::string& addr, int port) {
  const bool v6 = !addr.empty() && addr.front() == '[';
  const int fd = ::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  int rc;
  if (v6) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, addr.substr(1, addr.size() - 2).c_str(), &sa.sin6_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  } else {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr);
    rc = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  }
  ::close(fd);
  return rc != 0 && errno == EADDRINUSE;
}

// A port of the range on this machine for the export: leased (no other
// barge takes it while this run lives) and free. `want` > 0: that port
// only (a rerun; the running domain reconnects to it).
Result<std::unique_ptr<NbdPortLease>> LeaseExportPort(Env& env, const InstantRestoreRequest& req,
                                                      const std::string& addr, int want) {
  const PortRange range = want > 0 ? PortRange{want, want} : req.port_range;
  std::set<int> skip;
  for (int tries = 0;; ++tries) {
    BARGE_ASSIGN_OR_RETURN(auto lease, LeaseNbdPort(env, req.port_lock_dir, "export-" + addr, range, skip));
    if (!PortTaken(addr, lease->port())) return lease;
    if (want > 0 && tries < 150) {
      // The export of a run killed a moment ago may still be ending.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    skip.insert(lease->port());
  }
}

// The export of a killed run, if it still runs: nbdkit keeps serving (and
// its TCP port) while a TLS client stays connected after its parent died.
// Called with the domain's lock held, so no run that owns it is alive; the
// PID must still name an nbdkit.
void EndLeftoverExport(Env& env, const Record& r) {
  if (r.nbdkit_pid <= 0) return;
  auto comm = env.ReadFile("/proc/" + std::to_string(r.nbdkit_pid) + "/comm", 64);
  if (!comm.ok() || comm->rfind("nbdkit", 0) != 0) return;
  ::kill(static_cast<pid_t>(r.nbdkit_pid), SIGKILL);
  for (int i = 0; i < 100 && ::kill(static_cast<pid_t>(r.nbdkit_pid), 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool Cancelled(const InstantRestoreRequest& req) { return req.cancel != nullptr && req.cancel->load(); }

// Ends any block job on the disk without pivoting (a copy a killed run left).
Status AbortBlockJob(virDomainPtr dom, const std::string& target) {
  virDomainBlockJobInfo info{};
  const int has = virDomainGetBlockJobInfo(dom, target.c_str(), &info, 0);
  if (has < 0) return LastVirError("block job of " + target);
  if (has == 0) return OkStatus();
  if (virDomainBlockJobAbort(dom, target.c_str(), 0) != 0) return LastVirError("abort the block job of " + target);
  for (int i = 0; i < 600; ++i) {
    if (virDomainGetBlockJobInfo(dom, target.c_str(), &info, 0) == 0) return OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Error::IoError("the old block job of " + target + " did not end in 60 s");
}

// Bytes of the overlay the guest wrote (allocated in the overlay itself),
// as qemu-img map sees the file (-U: QEMU has it open).
Result<uint64_t> GuestWrittenBytes(Env& env, const Record& r) {
  BARGE_ASSIGN_OR_RETURN(std::string out,
                         RunTool(env, {"qemu-img", "map", "-U", "--output=json", "-f", "qcow2", OverlayPath(r)},
                                 r.scratch, "qemu-utils"));
  auto j = nlohmann::json::parse(out, nullptr, false);
  if (!j.is_array()) return Error::IoError("qemu-img map printed no JSON list").set_path(OverlayPath(r));
  uint64_t bytes = 0;
  for (const auto& e : j) {
    if (e.value("depth", 1) == 0) bytes += e.value("length", uint64_t{0});
  }
  return bytes;
}

// DISK filled with the point by barge's own restore (every cluster checked
// against the point's digests, the image digest compared, written under a
// temporary name and renamed when verified), while the domain runs on the
// overlay: QEMU never writes DISK before it holds the whole point. The
// export is kept up meanwhile.
Status Prefill(Env& env, const Record& r, const InstantRestoreRequest& req, ExportThread& exp,
               InstantRestoreResult& result, int& restarts) {
  std::atomic<bool> stop{false}, done{false};
  pipeline::RestoreRequest rr;
  rr.chain_dir = r.chain;
  rr.at = r.point_id;
  rr.destination = r.disk;
  rr.force = true;  // the record says this run made DISK (or --force allowed replacing it)
  rr.access = std::nullopt;  // DISK is the domain's disk: QEMU opens it, as before the restore
  rr.copy.cancel = &stop;
  rr.copy.progress = req.on_progress;
  Result<pipeline::RestoreResult> restored = Error::Internal("the restore did not run");
  std::thread worker([&] {
    restored = pipeline::RunRestore(env, rr);
    done = true;
  });
  Status status = OkStatus();
  while (!done) {
    if (status.ok() && Cancelled(req)) {
      status = Error::Cancelled("stopped; the domain runs on the overlay, rerun to continue");
    }
    if (status.ok()) status = KeepExportUp(env, r, req, exp, result, restarts);
    if (!status.ok()) stop = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  worker.join();
  BARGE_RETURN_IF_ERROR(status);
  if (!restored.ok()) return std::move(restored).error();
  result.verified_bytes = restored->manifest.virtual_size;
  return OkStatus();
}

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
                      InstantRestoreResult& result, ExportThread& exp, int& restarts) {
  const std::string dest = "<disk type='file'><source file='" + XmlEscape(r.disk) + "'/><driver type='raw'/></disk>";
  const unsigned flags = (r.remote ? 0u : unsigned{VIR_DOMAIN_BLOCK_COPY_SHALLOW}) |
                         VIR_DOMAIN_BLOCK_COPY_REUSE_EXT | VIR_DOMAIN_BLOCK_COPY_TRANSIENT_JOB;
  for (int attempt = 1;; ++attempt) {
    BARGE_RETURN_IF_ERROR(AbortBlockJob(dom, r.target));
    if (virDomainBlockCopy(dom, r.target.c_str(), dest.c_str(), nullptr, 0, flags) != 0) {
      return LastVirError("start the block copy of " + r.target + " to " + r.disk);
    }
    bool ready = false;
    for (;;) {
      if (Cancelled(req)) return Error::Cancelled("stopped; the domain runs on the overlay, rerun to continue");
      BARGE_RETURN_IF_ERROR(KeepExportUp(env, r, req, exp, result, restarts));
      virDomainBlockJobInfo info{};
      const int has = virDomainGetBlockJobInfo(dom, r.target.c_str(), &info, 0);
      if (has < 0) return LastVirError("block job of " + r.target);
      if (has == 0) break;  // failed: libvirt dropped it
      if (r.remote && req.on_progress && info.end > 0) req.on_progress(info.cur, info.end);
      BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom));
      std::string t = r.target;
      BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(xml, &t));
      if (XmlAttr(d.element, "mirror", "ready") == "yes") {
        ready = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (ready) break;
    if (attempt == 3) {
      return Error::IoError("the block copy of " + r.target + " failed " + std::to_string(attempt) +
                            " times (QEMU's log has why); the domain runs on the overlay, rerun to continue");
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (req.on_phase) req.on_phase("ready", "the guest's writes are mirrored onto DISK");
  // (The host's overlay is out of qemu-img's reach from here: 0 there.)
  if (!r.remote) {
    if (auto written = GuestWrittenBytes(env, r); written.ok()) result.guest_written_bytes = *written;
  }
  if (virDomainBlockJobAbort(dom, r.target.c_str(), VIR_DOMAIN_BLOCK_JOB_ABORT_PIVOT) != 0) {
    return LastVirError("pivot " + r.target + " to " + r.disk);
  }
  return OkStatus();
}

// After the pivot: the persistent definition names DISK too, the export
// is stopped and the overlay, socket and record removed.
Status Finish(Env& env, virConnectPtr conn, virDomainPtr dom, Record r, const std::string& record_path,
              ExportThread* exp, const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(std::string config, DomainXml(dom, VIR_DOMAIN_XML_INACTIVE));
  std::string t = r.target;
  BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(config, &t));
  if (d.source != r.disk) {
    const std::string element =
        std::regex_replace(OverlayElement(d.element, r), std::regex("<source file=[\\s\\S]*</backingStore>"),
                           "<source file='" + XmlEscape(r.disk) + "'/>");
    BARGE_RETURN_IF_ERROR(Redefine(conn, dom, r.target, std::regex_replace(element, std::regex("type='qcow2'"),
                                                                           "type='raw'")));
  }
  if (exp != nullptr) exp->Stop();
  if (r.remote) {
    BARGE_RETURN_IF_ERROR(RemoveRemoteScratch(conn, r, domain));
  } else {
    BARGE_RETURN_IF_ERROR(env.RemoveTree(r.scratch));
  }
  return env.UnlinkIfExists(record_path);
}

// The guest range of a damaged cluster, as the restore's or the reader's
// Corruption error names it ([0, 0) when it names none).
std::pair<uint64_t, uint64_t> DamagedRange(const Error& e) {
  if (!e.offset()) return {0, 0};
  return {*e.offset(), e.length().value_or(1)};
}

// The damaged range `damage` names, in the record.
Status RecordDamage(Env& env, const std::string& record_path, Record& r, const Error& damage) {
  const auto [offset, length] = DamagedRange(damage);
  if (length == 0 || (r.damaged_offset == offset && r.damaged_length == length)) return OkStatus();
  r.damaged_offset = offset;
  r.damaged_length = length;
  return WriteRecord(env, record_path, r);
}

// The recorded damaged range, read again through the point: the
// Corruption error when it is still damaged, OK when it reads fine now
// (the layer was repaired) or none is recorded.
Status RecheckDamage(Env& env, const Record& r) {
  if (r.damaged_length == 0) return OkStatus();
  BARGE_ASSIGN_OR_RETURN(auto reader, pipeline::PointReader::Open(env, r.chain, r.point_id, false));
  const uint64_t length = std::min<uint64_t>(r.damaged_length, 64u << 20);
  if (r.damaged_offset >= reader->size_bytes()) return OkStatus();
  std::vector<std::byte> buf(std::min<uint64_t>(length, reader->size_bytes() - r.damaged_offset));
  Status s = reader->Read(r.damaged_offset, std::span<std::byte>(buf));
  if (!s.ok() && s.error().code() != ErrorCode::kCorruption) return OkStatus();  // the restore will say
  return s;
}

// Remote: the full block copy read the point through the export, and
// failed. A damaged cluster fails it: the point read here, every cluster
// checked, names the first one (kCorruption); OK when none is damaged.
Status FindDamage(Env& env, const Record& r, const InstantRestoreRequest& req) {
  BARGE_ASSIGN_OR_RETURN(auto reader, pipeline::PointReader::Open(env, r.chain, r.point_id, false));
  std::vector<std::byte> buf(8u << 20);
  for (uint64_t at = 0; at < reader->size_bytes() && !Cancelled(req); at += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), reader->size_bytes() - at);
    BARGE_RETURN_IF_ERROR(reader->Read(at, std::span<std::byte>(buf.data(), n)));
  }
  return OkStatus();
}

// The point is damaged (`damage`: the restore's Corruption error, naming the
// layer file and the cluster's guest offset) while the domain runs on the
// overlay over the export: said at once (phase "damaged", with what to do),
// recorded, and the export kept serving every good cluster (reads of the
// damaged one fail with EIO in the guest) until the domain stops or the
// run is stopped. DISK is never pivoted to. Returns the damage (exit 2).
Status ServeDamaged(Env& env, virDomainPtr dom, Record& r, const std::string& record_path,
                    const InstantRestoreRequest& req, ExportThread& exp, InstantRestoreResult& result, int& restarts,
                    Error damage) {
  BARGE_RETURN_IF_ERROR(RecordDamage(env, record_path, r, damage));
  const auto [offset, length] = DamagedRange(damage);
  const std::string range =
      length != 0 ? "guest bytes " + formats::Hex(offset) + " to " + formats::Hex(offset + length)
                  : std::string("the damaged cluster");
  const std::string todo =
      "the domain keeps running on the overlay and the export keeps serving every other cluster (reads of " + range +
      " the guest has not written fail with EIO); the domain is not moved to DISK. To end it: shut the domain off, "
      "give this restore up (the same command with --abandon: the guest's writes are dropped), then restore an "
      "older point (barge verify " + r.chain + " names the intact ones; --at POINT); or put back an intact copy of "
      "the layer file (a replica) and rerun the same command";
  if (req.on_phase) req.on_phase("damaged", "point " + r.point_id + " is damaged: " + damage.ToString() + "; " + todo);
  for (;;) {
    if (Cancelled(req)) {
      damage.Wrap("stopped: the domain runs on the overlay without its export (its unwritten reads fail) until the "
                  "same command is rerun; point " + r.point_id + " is damaged");
      return damage;
    }
    if (!DomainIsActive(dom)) break;
    BARGE_RETURN_IF_ERROR(KeepExportUp(env, r, req, exp, result, restarts));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  damage.Wrap("the domain stopped; point " + r.point_id + " is damaged, so " + r.target +
              " was not moved to DISK: give this restore up (the same command with --abandon), then restore an "
              "older point, or put back an intact copy of the layer file and rerun");
  return damage;
}

}  // namespace

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
    r.scratch = JoinPath(DirName(w.disk_abs), ".barge-instant-" + EscapeLockName(req.domain));
  }
  BARGE_RETURN_IF_ERROR(env.CreateDirs(DirName(w.record_path)));
  BARGE_RETURN_IF_ERROR(WriteRecord(env, w.record_path, r));
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
