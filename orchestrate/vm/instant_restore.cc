// barge vm instant-restore: export, overlay, start, restore onto DISK,
// shallow block copy of the guest's writes, pivot; every step restartable
// from the record file.
#include "orchestrate/vm/instant_restore.h"

#include <libvirt/libvirt.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <regex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/path.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
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
                           "\npivoted=" + (r.pivoted ? "yes" : "no") + "\n";
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
           Field(*text, "prefilled") == "yes", Field(*text, "pivoted") == "yes"};
  if (r.chain.empty() || r.disk.empty() || r.scratch.empty() || r.target.empty()) {
    return Error::Corruption("the instant-restore record lacks a field (chain, disk, scratch, target)").set_path(path);
  }
  return std::optional<Record>(std::move(r));
}

std::string OverlayPath(const Record& r) { return JoinPath(r.scratch, "overlay.qcow2"); }
std::string SocketPath(const Record& r) { return JoinPath(r.scratch, "nbd.sock"); }

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
  Status Start(Env& env, const Record& r, int64_t* nbdkit_pid) {
    Stop();
    stop_ = false;
    ready_ = false;
    ended_ = false;
    status_ = OkStatus();
    IgnoreError(env.UnlinkIfExists(SocketPath(r)), "a socket a killed export left");
    req_.chain = r.chain;
    req_.at = r.point_id;
    req_.socket_path = SocketPath(r);
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
    while (!ready_ && !ended_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!ready_) {
      Stop();
      return status_;
    }
    // QEMU runs as its own user: it must be able to connect (the folder
    // around it is private: 0711, names not listable).
    BARGE_RETURN_IF_ERROR(env.SetMode(SocketPath(r), 0666));
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
// same result.
Status MirrorAndPivot(Env& env, virDomainPtr dom, const Record& r, const InstantRestoreRequest& req,
                      InstantRestoreResult& result, ExportThread& exp, int& restarts) {
  const std::string dest = "<disk type='file'><source file='" + XmlEscape(r.disk) + "'/><driver type='raw'/></disk>";
  const unsigned flags = VIR_DOMAIN_BLOCK_COPY_SHALLOW | VIR_DOMAIN_BLOCK_COPY_REUSE_EXT |
                         VIR_DOMAIN_BLOCK_COPY_TRANSIENT_JOB;
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
  if (auto written = GuestWrittenBytes(env, r); written.ok()) result.guest_written_bytes = *written;
  if (virDomainBlockJobAbort(dom, r.target.c_str(), VIR_DOMAIN_BLOCK_JOB_ABORT_PIVOT) != 0) {
    return LastVirError("pivot " + r.target + " to " + r.disk);
  }
  return OkStatus();
}

// After the pivot: the persistent definition names DISK too, the export
// is stopped and the overlay, socket and record removed.
Status Finish(Env& env, virConnectPtr conn, virDomainPtr dom, const Record& r, const std::string& record_path,
              ExportThread* exp) {
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
  BARGE_RETURN_IF_ERROR(env.RemoveTree(r.scratch));
  return env.UnlinkIfExists(record_path);
}

}  // namespace

std::string InstantOverlayDiskXml(const std::string& element, const std::string& overlay, const std::string& socket) {
  std::string e = std::regex_replace(element, std::regex("<disk type=['\"][a-z]+['\"]"), "<disk type='file'");
  e = std::regex_replace(e, std::regex("<backingStore[^>]*/>"), "");
  e = std::regex_replace(e, std::regex("<backingStore[\\s\\S]*</backingStore>"), "");
  e = std::regex_replace(e, std::regex("<source[^>]*/>|<source[^>]*>[\\s\\S]*?</source>"), "");
  e = std::regex_replace(e, std::regex("(<driver[^>]*) type=['\"][a-z0-9]+['\"]"), "$1");
  e = std::regex_replace(e, std::regex("<driver"), "<driver type='qcow2'");
  const std::string source = "<source file='" + XmlEscape(overlay) +
                             "'/><backingStore type='network'><format type='raw'/>"
                             "<source protocol='nbd'><host transport='unix' socket='" +
                             XmlEscape(socket) + "'/></source><backingStore/></backingStore>";
  const size_t t = e.find("<target");
  return e.substr(0, t) + source + e.substr(t);
}

std::string InstantRestoreRecordPath(const std::string& catalog_path, const std::string& domain) {
  std::string lock = DomainLockPath(catalog_path, domain);
  return lock.substr(0, lock.size() - std::string_view(".lock").size()) + ".instant-restore";
}

Result<InstantRestoreResult> RunInstantRestore(Env& env, const InstantRestoreRequest& req) {
  const auto start = Clock::now();
  InstantRestoreResult result;
  // TODO(issue 22): a remote domain needs the overlay and DISK on its host
  // and the export reachable from there (ssh -R of the socket, or TCP+TLS).
  BARGE_RETURN_IF_ERROR(RefuseRemoteFiles(ResolveLibvirtUri(req.libvirt_uri), "vm instant-restore"));
  BARGE_ASSIGN_OR_RETURN(auto lock, TryLockFile(env, DomainLockPath(req.catalog_path, req.domain),
                                                DomainBusyMessage(req.domain)));
  const std::string record_path = InstantRestoreRecordPath(req.catalog_path, req.domain);
  BARGE_ASSIGN_OR_RETURN(std::optional<Record> found, ReadRecord(env, record_path));
  BARGE_ASSIGN_OR_RETURN(VirConnection conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(VirDomain dom, LookupDomain(conn.get(), req.domain));
  const std::string disk_abs = AbsolutePath(req.disk);
  BARGE_ASSIGN_OR_RETURN(pipeline::PointLocation where, pipeline::LocatePoint(env, req.chain, req.at));
  const std::string chain_abs = AbsolutePath(where.chain_dir);

  if (req.abandon && !found) {
    return Error::NotFound("no unfinished instant restore of domain '" + req.domain + "' to abandon")
        .set_path(record_path);
  }
  Record r;
  if (found) {
    r = *found;
    if (r.disk != disk_abs || r.chain != chain_abs || (!req.target.empty() && req.target != r.target)) {
      return Error::InvalidArgument("an unfinished instant restore of this domain (chain " + r.chain + ", point " +
                                    r.point_id + ", disk " + r.target + " to " + r.disk +
                                    ") is recorded; rerun that command to finish it")
          .set_path(record_path);
    }
    result.resumed = true;
  } else {
    BARGE_ASSIGN_OR_RETURN(std::string xml, DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE));
    std::string target = req.target;
    BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(xml, &target));
    if (DomainIsActive(dom.get())) {
      return Error::InvalidArgument("domain '" + req.domain +
                                    "' is running on its own disk; shut it off first (instant restore starts it)");
    }
    if (env.Exists(disk_abs) && !req.force) {
      return Error::InvalidArgument("DISK exists; give --force to replace it").set_path(disk_abs);
    }
    BARGE_ASSIGN_OR_RETURN(auto reader, pipeline::PointReader::Open(env, chain_abs, where.at));
    r.owner = ProcessOwner::Self(env).Encode();
    r.chain = chain_abs;
    r.point_id = reader->manifest().id;
    r.target = target;
    r.disk = disk_abs;
    r.scratch = JoinPath(DirName(disk_abs), ".barge-instant-" + EscapeLockName(req.domain));
    r.original = d.element;
    BARGE_RETURN_IF_ERROR(env.CreateDirs(DirName(record_path)));
    BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));
  }
  result.point_id = r.point_id;
  result.disk = r.disk;
  result.target = r.target;
  if (req.abandon) {
    if (DomainIsActive(dom.get())) {
      return Error::InvalidArgument("domain '" + req.domain +
                                    "' is running; shut it off first (abandoning drops the guest's writes in the "
                                    "overlay)");
    }
    BARGE_ASSIGN_OR_RETURN(std::string config, DomainXml(dom.get(), VIR_DOMAIN_XML_INACTIVE));
    std::string t = r.target;
    BARGE_ASSIGN_OR_RETURN(DomainDisk d, FindDisk(config, &t));
    if (r.pivoted || d.source == r.disk) {
      return Error::InvalidArgument("the restore of domain '" + req.domain +
                                    "' is complete on DISK; rerun without --abandon to clean up")
          .set_path(r.disk);
    }
    if (d.source == OverlayPath(r)) BARGE_RETURN_IF_ERROR(Redefine(conn.get(), dom.get(), r.target, r.original));
    BARGE_RETURN_IF_ERROR(env.RemoveTree(r.scratch));
    BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(r.disk));
    BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(record_path));
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
    BARGE_RETURN_IF_ERROR(Finish(env, conn.get(), dom.get(), r, record_path, nullptr));
    result.seconds = SecondsSince(start);
    return result;
  }
  if (active && now.source != OverlayPath(r)) {
    return Error::InvalidArgument("domain '" + req.domain + "' runs with " + r.target + " on " + now.source +
                                  ", not on this restore's overlay " + OverlayPath(r) +
                                  "; shut it off and rerun")
        .set_path(record_path);
  }

  ExportThread exp;
  BARGE_RETURN_IF_ERROR(env.CreateDirs(r.scratch));
  BARGE_RETURN_IF_ERROR(env.SetMode(r.scratch, 0711));
  BARGE_RETURN_IF_ERROR(exp.Start(env, r, &result.nbdkit_pid));
  if (!active) {
    BARGE_ASSIGN_OR_RETURN(auto reader, pipeline::PointReader::Open(env, r.chain, r.point_id, false));
    const uint64_t size = reader->size_bytes();
    reader.reset();
    // An overlay the domain already ran on holds the guest's writes: kept.
    if (now.source != OverlayPath(r) || !env.Exists(OverlayPath(r))) {
    IgnoreError(env.UnlinkIfExists(OverlayPath(r)), "the domain never ran on it");
    const std::string backing = "nbd+unix:///?socket=" + SocketPath(r);
    auto created = RunTool(env,
                           {"qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", "raw",
                            OverlayPath(r), std::to_string(size)},
                           r.scratch, "qemu-utils");
    if (!created.ok()) return std::move(created).error();
    BARGE_RETURN_IF_ERROR(env.SetMode(OverlayPath(r), 0666));
    BARGE_RETURN_IF_ERROR(Redefine(conn.get(), dom.get(), r.target, OverlayElement(r.original, r)));
    }
    if (virDomainCreate(dom.get()) != 0) return LastVirError("start domain '" + req.domain + "' on the overlay");
    result.started_seconds = SecondsSince(start);
  }
  if (req.on_phase) {
    req.on_phase("started", "domain " + req.domain + " runs on " + OverlayPath(r) + " over the export of " +
                                r.point_id);
  }
  // Until the pivot the domain runs on the overlay, whatever fails: say so.
  const auto on_overlay = [&](Status s) -> Status {
    if (s.ok() || s.error().code() == ErrorCode::kCancelled) return s;
    Error e = s.error();
    e.Wrap("moving " + r.target + " to DISK (the domain stays on the overlay; rerun the same command to continue)");
    return e;
  };
  int restarts = 0;
  if (!r.prefilled || !env.Exists(r.disk)) {
    BARGE_RETURN_IF_ERROR(on_overlay(Prefill(env, r, req, exp, result, restarts)));
    r.prefilled = true;
    BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));
    if (req.on_phase) req.on_phase("verified", "DISK holds point " + r.point_id + ", every cluster verified");
  }
  BARGE_RETURN_IF_ERROR(on_overlay(MirrorAndPivot(env, dom.get(), r, req, result, exp, restarts)));
  r.pivoted = true;
  BARGE_RETURN_IF_ERROR(WriteRecord(env, record_path, r));
  if (req.on_phase) req.on_phase("pivoted", "domain " + req.domain + " runs on " + r.disk);
  BARGE_RETURN_IF_ERROR(Finish(env, conn.get(), dom.get(), r, record_path, &exp));
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace barge::orchestrate
