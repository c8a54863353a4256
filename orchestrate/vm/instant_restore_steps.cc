// barge vm instant-restore's steps (instant_restore_steps.h): the record
// file, the export thread's helpers, the remote folder, the export's
// port, prefill, mirror and pivot, finish, and damage.
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
namespace instant_steps {

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

}  // namespace instant_steps
}  // namespace barge::orchestrate
