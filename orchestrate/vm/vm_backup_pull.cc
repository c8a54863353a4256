// vm backup of an active domain: a libvirt pull-mode job with a new
// checkpoint, each disk's NBD export (a local socket, a remote one through
// ssh, or TCP with TLS) read through the backup pipeline.
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "blockio/path.h"
#include "formats/units.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/libvirt/guest_freeze.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/nbd_ports.h"
#include "orchestrate/libvirt/ssh_forward.h"
#include "orchestrate/vm/vm_backup_steps.h"
#include "orchestrate/vm/vm_orphans.h"
#include "pipeline/backup_resume.h"
#include "pipeline/chain.h"
#include "pipeline/disk_identity.h"
#include "pipeline/endpoints.h"
#include "pipeline/nbd_endpoint.h"

namespace barge::orchestrate::vm_steps {
namespace {

// The job's <server>: a unix socket, or (port > 0) TCP with TLS on `host`,
// where QEMU listens (formatbackup: libvirt takes the certificates from the
// host's qemu.conf, backup_tls_x509_cert_dir).
std::string ServerXml(const std::string& socket, const std::string& host, int port) {
  if (port > 0) {
    return "<server transport='tcp' tls='yes' name='" + XmlEscape(host) + "' port='" + std::to_string(port) + "'/>";
  }
  return "<server transport='unix' socket='" + XmlEscape(socket) + "'/>";
}

// `resume_from`: the disks whose job is incremental from a killed run's
// checkpoint instead (its bitmap says what changed since that run staged
// its data), whatever the point's type.
std::string BackupXml(const std::vector<DomainDisk>& all, const std::set<std::string>& selected,
                      const std::map<std::string, bool>& incremental, const std::string& from,
                      const std::map<std::string, std::string>& resume_from, const std::string& server,
                      const std::string& scratch_prefix) {
  std::string x = "<domainbackup mode='pull'>" + server + "<disks>";
  for (const auto& d : all) {
    if (!selected.count(d.target)) {
      x += "<disk name='" + XmlEscape(d.target) + "' backup='no'/>";
      continue;
    }
    // libvirt 9 needs the pull mode's scratch file named (copy-before-write).
    x += "<disk name='" + XmlEscape(d.target) + "' backup='yes' type='file' ";
    auto resumed = resume_from.find(d.target);
    x += resumed != resume_from.end() ? "backupmode='incremental' incremental='" + XmlEscape(resumed->second) + "'>"
         : incremental.at(d.target)   ? "backupmode='incremental' incremental='" + XmlEscape(from) + "'>"
                                      : std::string("backupmode='full'>");
    x += "<scratch file='" + XmlEscape(scratch_prefix + d.target + ".qcow2") + "'/></disk>";
  }
  return x + "</disks></domainbackup>";
}

// `with_bitmap`: the selected disks that can hold a checkpoint's bitmap
// (libvirt refuses a bitmap on any format but qcow2: "checkpoint for disk
// ... unsupported for storage type raw"); every other disk is left out of
// the checkpoint with checkpoint='no' (formatcheckpoint).
std::string CheckpointCreateXml(const std::string& name, const std::vector<DomainDisk>& all,
                                const std::set<std::string>& with_bitmap) {
  std::string x = "<domaincheckpoint><name>" + XmlEscape(name) + "</name><disks>";
  for (const auto& d : all) {
    x += "<disk name='" + XmlEscape(d.target) + "' checkpoint='" +
         (with_bitmap.count(d.target) ? "bitmap" : "no") + "'/>";
  }
  return x + "</disks></domaincheckpoint>";
}

// "... for disk 'vda'" in libvirt's "checkpoint inconsistent" message.
std::string DiskNamedIn(const std::string& message) {
  size_t a = message.find("for disk '");
  if (a == std::string::npos) return "";
  a += 10;
  size_t b = message.find('\'', a);
  return b == std::string::npos ? "" : message.substr(a, b - a);
}

// Everything a run must undo on failure.
struct Cleanup {
  explicit Cleanup(Env& e) : env(e) {}
  Env& env;
  virDomainPtr dom = nullptr;
  bool frozen = false;
  bool job_started = false;
  std::string new_checkpoint;
  // Killed runs' checkpoints kept for this run's resume: a failed run
  // deletes them too (its own checkpoint, which a kept journal would need,
  // goes as well).
  std::vector<std::string> kept_checkpoints;
  std::vector<std::string> files;  // new backup files
  // The job's NBD socket and the scratch files' path before "<disk>.qcow2",
  // as libvirt sees them (on the hypervisor's host). Locally, the scratch
  // files go to the folder `scratch_dir`, removed with the socket by
  // EndJob; on a remote host (`remote`) libvirt removes the scratch files it
  // made, and the socket's folder goes through that host's libvirt.
  std::string socket;
  std::string scratch_prefix;
  std::string scratch_dir;
  bool remote = false;
  // A remote job's socket forwarded here over ssh (qemu+ssh://): stopped
  // by EndJob, before the job ends, on every path.
  std::unique_ptr<SshForward> forward;
  // A remote job's TCP export with TLS (`tls`): QEMU listens on
  // `tcp_host`:port_lease->port(). The lease is given back by EndJob once
  // the job has ended (QEMU no longer listens), or with the Cleanup.
  bool tls = false;
  std::string tcp_host;
  std::unique_ptr<NbdPortLease> port_lease;
  // The job's run record (vm_orphans.h), written before the job starts and
  // removed once nothing of the job is left: a killed run's successor finds
  // the job, socket, scratch folder and checkpoint by it.
  std::string job_record;
  BackupJobRecord job;  // what job_record holds
  VmBackupFaults* faults = nullptr;  // the request's test seam

  // Thaws a frozen guest, retrying a few times. Returns why the guest may
  // still be frozen, or an empty string.
  std::string Thaw() {
    if (!frozen) return {};
    if (faults != nullptr) {
      if (Status injected = faults->At(VmBackupFaults::Point::kThaw); !injected.ok()) {
        return injected.error().message();
      }
    }
    std::string why = ThawGuest(dom);
    if (why.empty()) frozen = false;
    return why;
  }
  // Ends the pull job and removes its socket and scratch folder.
  Status EndJob() {
    Status s = OkStatus();
    if (forward) {
      s = forward->Stop();
      forward.reset();
    }
    if (job_started) {
      job_started = false;
      if (virDomainAbortJob(dom) < 0) {
        s = LastVirError("end the backup job of domain " + std::string(virDomainGetName(dom)));
      } else {
        // QEMU holds the scratch files until the job is gone: wait for it
        // (at most 30 s) before they are removed.
        for (int i = 0; i < 300; ++i) {
          virDomainJobInfo info{};
          if (virDomainGetJobInfo(dom, &info) < 0 || info.type == VIR_DOMAIN_JOB_NONE) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
    }
    // Given back only once no job may listen on it: a job that could not be
    // aborted keeps its port until this process ends.
    if (s.ok()) port_lease.reset();
    if (remote) {
      // QEMU removed the socket with the job; its folder goes (a job that
      // could not be ended keeps it for the next run).
      if (s.ok() && !socket.empty()) s = RemoveRemoteJobSocketDir(virDomainGetConnect(dom), socket);
      return s;
    }
    if (Status unlinked = socket.empty() ? OkStatus() : RemoveJobSocket(env, socket); s.ok()) s = std::move(unlinked);
    if (!scratch_dir.empty()) {
      Status removed = env.RemoveTree(scratch_dir);
      if (s.ok()) s = std::move(removed);
    }
    return s;
  }
  // Undoes the run for error `e`: Thaw's warning is added to its message,
  // and whatever could not be undone to its cleanup failures.
  void Undo(Error& e) {
    if (std::string thaw = Thaw(); !thaw.empty()) e = Error(e.code(), e.message() + "; " + thaw);
    Status ended = EndJob();
    bool job_gone = ended.ok();
    e.Also(std::move(ended));
    if (!new_checkpoint.empty()) {
      Status deleted = DeleteCheckpoint(dom, new_checkpoint);
      job_gone &= deleted.ok();
      e.Also(std::move(deleted));
    }
    for (const auto& cp : kept_checkpoints) {
      if (!LookupCheckpoint(dom, cp).ok()) continue;  // removed as stale meanwhile
      Status deleted = DeleteCheckpoint(dom, cp);
      job_gone &= deleted.ok();
      e.Also(std::move(deleted));
    }
    for (const auto& f : files) e.Also(env.UnlinkIfExists(f));
    // Kept while the job or its checkpoint may remain: the next run cleans up by it.
    if (job_gone) e.Also(DropRecord());
  }
  // Instead of Undo, when the disks `staged` (their NBD connection lost
  // for good) kept their staged data and journals at `new_checkpoint`: the
  // job ends, the checkpoints stay, and the run record, marked, stays for
  // the next run, which resumes as after a killed run
  // (RecoverOrphanedBackupJob). false, with nothing done, when there is
  // nothing to keep or the record cannot say so.
  bool KeepForResume(Error& e, const std::vector<std::string>& staged) {
    if (staged.empty() || new_checkpoint.empty() || job_record.empty()) return false;
    BackupJobRecord kept = job;
    kept.kept_after_failure = true;
    if (!WriteBackupJobRecord(env, job_record, kept).ok()) return false;
    std::string disks;
    for (const auto& d : staged) disks += (disks.empty() ? "" : ", ") + d;
    e.Wrap("the data staged for disk" + std::string(staged.size() == 1 ? " " : "s ") + disks + " and checkpoint " +
           new_checkpoint + " are kept: the next vm backup of domain '" + virDomainGetName(dom) +
           "' resumes from them; vm backup");
    if (std::string thaw = Thaw(); !thaw.empty()) e = Error(e.code(), e.message() + "; " + thaw);
    e.Also(EndJob());
    for (const auto& f : files) e.Also(env.UnlinkIfExists(f));
    job_record.clear();  // stays for the next run
    return true;
  }
  Status DropRecord() {
    if (job_record.empty()) return OkStatus();
    std::string path = std::exchange(job_record, "");
    return env.UnlinkIfExists(path);
  }
};

// The disks whose chain folder (under `chains_dir`) holds a resume journal
// at `checkpoint`: what a failed run kept for the next one.
std::vector<std::string> StagedAt(Env& env, const std::string& chains_dir, const std::vector<DomainDisk>& disks,
                                  const std::string& checkpoint) {
  std::vector<std::string> out;
  if (checkpoint.empty()) return out;
  for (const auto& d : disks) {
    auto j = pipeline::LoadResumeJournal(
        env, chains_dir + "/" + d.target + "/" + std::string(pipeline::kResumeJournalName));
    if (j.ok() && j->key.checkpoint == checkpoint) out.push_back(d.target);
  }
  return out;
}

// QEMU's user and group for `dom` (QemuDacOwner); nullopt when libvirt
// names none (QEMU runs as root).
std::optional<std::pair<uid_t, gid_t>> QemuOwnerOf(virDomainPtr dom) {
  auto xml = DomainXml(dom, 0);
  return xml.ok() ? QemuDacOwner(virDomainGetConnect(dom), *xml) : std::nullopt;
}

// A fresh folder for a local job's socket: /tmp/barge-backup-DOMAIN-XXXXXX
// (mkdtemp: 0700, a name nobody planted), given to QEMU's user and group
// (QemuDacOwner) as libvirt runs it for `dom`; kept root's when libvirt
// names none (QEMU runs as root).
Result<std::string> MakeQemuSocketDir(Env& env, virDomainPtr dom, const std::string& domain) {
  auto dir = env.CreateTempDir("/tmp", "barge-backup-" + domain + "-");
  if (!dir.ok()) return std::move(dir).error().Wrap("create the backup job's socket folder");
  if (const auto owner = QemuOwnerOf(dom)) {
    if (Status s = env.SetOwner(*dir, owner->first, owner->second); !s.ok()) {
      IgnoreError(env.RemoveDir(*dir), "an empty folder; the owner is the error reported");
      return std::move(s).error().Wrap("give QEMU's user the backup job's socket folder");
    }
  }
  return dir;
}

// Freezes the guest (unless --skip-quiesce), then makes the job's socket
// path, scratch folder and run record, each noted in `cleanup`.
Status PrepareJob(Env& env, const VmBackupRequest& req, virDomainPtr dom, const std::string& checkpoint,
                  int64_t record_id, Cleanup& cleanup) {
  if (!req.skip_quiesce) {
    if (virDomainFSFreeze(dom, nullptr, 0, 0) < 0) {
      Error e = LastVirError("quiesce");
      return Error(e.code(), "cannot quiesce domain '" + req.domain +
                                 "': guest agent not available or not responding (" + e.message() +
                                 "); use --skip-quiesce to back up without freezing");
    }
    cleanup.frozen = true;
    BARGE_RETURN_IF_ERROR(InjectedFault(req, VmBackupFaults::Point::kAfterFreeze));
  }

  // A TCP export has no socket (libvirt's job XML names none either, which
  // is how a killed run's job is recognised: vm_orphans.h).
  if (cleanup.remote && !cleanup.tls) {
    // On the remote host: in a folder its libvirt makes fresh for QEMU's
    // user (MakeRemoteJobSocketDir), removed by EndJob or, after a killed
    // run, by the next run through the job record.
    BARGE_ASSIGN_OR_RETURN(cleanup.socket,
                           MakeRemoteJobSocketDir(virDomainGetConnect(dom), req.domain, QemuOwnerOf(dom)));
  }
  const std::string record_path = BackupJobRecordPath(req.catalog_path, req.domain);
  if (cleanup.remote) {
    // On the remote host: libvirt creates the socket and the scratch files
    // (and removes the files it made when the job ends); barge only names
    // them. The pid keeps parallel barge hosts' jobs apart only per domain,
    // which the domain's lock and libvirt's one job per domain settle.
    cleanup.scratch_prefix = req.scratch_dir + "/barge-scratch-" + req.domain + "-";
    BackupJobRecord job{ProcessOwner::Self(env).Encode(), cleanup.socket, "", checkpoint,
                        req.target + "/" + req.domain, record_id, LibvirtHostKey(ResolveLibvirtUri(req.libvirt_uri)),
                        JoinNames(cleanup.kept_checkpoints), false};
    if (Status s = WriteBackupJobRecord(env, record_path, job); !s.ok()) {
      return std::move(s).error().Wrap("write the backup job's run record");
    }
    cleanup.job_record = record_path;
    cleanup.job = job;
    return OkStatus();
  }
  // QEMU (libvirt's user for it) makes the job's socket: in a fresh
  // private folder of /tmp given to that user alone (mkdtemp, 0700), never
  // a name another local user could plant or connect to.
  if (!cleanup.tls) {
    BARGE_ASSIGN_OR_RETURN(std::string socket_dir, MakeQemuSocketDir(env, dom, req.domain));
    cleanup.socket = socket_dir + "/" + kJobSocketName;
  }
  // Scratch files are created by libvirt and opened by QEMU (another user,
  // maybe in its own mount namespace): the folder lives under the scratch
  // root, which QEMU can see (kDefaultScratchRoot, or --scratch-dir), not
  // in the target (a volume mounted after the domain started is invisible
  // to QEMU), and must be traversable: a fresh folder (mkdtemp, never one
  // planted in a shared root such as /var/tmp), 0711 (names not listable).
  // A killed run's is removed by RecoverOrphanedBackupJob, by its record.
  auto made = env.CreateTempDir(req.scratch_dir, "barge-scratch-" + req.domain + "-");
  if (!made.ok()) return std::move(made).error().Wrap("create scratch folder");
  cleanup.scratch_dir = *made;
  if (Status mode = env.SetMode(cleanup.scratch_dir, 0711); !mode.ok()) {
    return std::move(mode).error().Wrap("create scratch folder");
  }
  cleanup.scratch_prefix = cleanup.scratch_dir + "/";
  BackupJobRecord job{ProcessOwner::Self(env).Encode(), cleanup.socket, cleanup.scratch_dir, checkpoint,
                      req.target + "/" + req.domain, record_id, "", JoinNames(cleanup.kept_checkpoints), false};
  if (Status s = WriteBackupJobRecord(env, record_path, job); !s.ok()) {
    return std::move(s).error().Wrap("write the backup job's run record");
  }
  cleanup.job_record = record_path;
  cleanup.job = job;
  return OkStatus();
}

// Starts the pull-mode job (and its checkpoint). A disk whose bitmap
// libvirt finds inconsistent only at job start goes full, and the start is
// tried again. A TCP export (cleanup.tls) listens on a port leased from
// req.nbd_ports; a port that something else on the host holds (libvirt:
// "Address already in use") is skipped and the next one leased, until the
// range is used up (kBusy).
Status BeginJob(Env& env, const VmBackupRequest& req, virDomainPtr dom, RunPlan& plan,
                const std::set<std::string>& with_bitmap, const std::string& parent_checkpoint,
                const std::string& checkpoint, Cleanup& cleanup) {
  std::set<int> in_use_on_host;
  // Each disk may lose its resume, then its incremental.
  for (size_t attempt = 0; attempt <= 2 * plan.disks.size();) {
    if (cleanup.tls && !cleanup.port_lease) {
      BARGE_ASSIGN_OR_RETURN(cleanup.port_lease, LeaseNbdPort(env, req.nbd_port_lock_dir, cleanup.tcp_host,
                                                              req.nbd_ports, in_use_on_host));
    }
    const std::string server =
        ServerXml(cleanup.socket, cleanup.tcp_host, cleanup.port_lease ? cleanup.port_lease->port() : 0);
    std::map<std::string, std::string> resume_from;
    for (const auto& [d, staged] : plan.resumes) resume_from[d] = staged.checkpoint;
    std::string bxml = BackupXml(plan.all_disks, plan.selected, plan.incremental, parent_checkpoint, resume_from,
                                 server, cleanup.scratch_prefix);
    std::string cxml = checkpoint.empty() ? "" : CheckpointCreateXml(checkpoint, plan.all_disks, with_bitmap);
    if (virDomainBackupBegin(dom, bxml.c_str(), cxml.empty() ? nullptr : cxml.c_str(), 0) == 0) {
      cleanup.job_started = true;
      cleanup.new_checkpoint = checkpoint;
      return OkStatus();
    }
    Error e = LastVirError("backup begin");
    if (cleanup.port_lease && IsAddressInUse(e.message())) {
      in_use_on_host.insert(cleanup.port_lease->port());
      cleanup.port_lease.reset();
      continue;
    }
    ++attempt;
    bool any_incremental = !plan.resumes.empty();
    for (const auto& [d, inc] : plan.incremental) any_incremental |= inc;
    if (!any_incremental || e.message().find("inconsistent") == std::string::npos) return e;
    std::string bad = DiskNamedIn(e.message());
    // A resuming disk first gives up its resume (the killed run's bitmap
    // may be the inconsistent one).
    bool dropped = false;
    for (auto it = plan.resumes.begin(); it != plan.resumes.end();) {
      if (bad.empty() || it->first == bad) {
        plan.resume_refused[it->first] = "checkpoint " + it->second.checkpoint +
                                         " of the interrupted run is inconsistent: what changed since it cannot be "
                                         "known";
        it = plan.resumes.erase(it);
        dropped = true;
      } else {
        ++it;
      }
    }
    if (dropped) continue;
    for (auto& [d, inc] : plan.incremental) {
      if (inc && (bad.empty() || d == bad)) {
        inc = false;
        plan.reasons[d] = "bitmap inconsistent";
      }
    }
  }
  return OkStatus();  // not started: the caller says so
}

// Where the disks are read: the job's local socket, a remote job's socket
// forwarded here over ssh (into cleanup.forward), or the TCP export's
// NbdTcpUri (`tcp`, with the leased port in res.nbd_port).
struct ExportPlace {
  std::string socket;
  std::string tcp;
};
Result<ExportPlace> OpenExport(Env& env, const VmBackupRequest& req, const LibvirtUri& uri, Cleanup& cleanup,
                               VmBackupResult& res) {
  ExportPlace at{cleanup.socket, ""};
  if (cleanup.port_lease) {
    res.nbd_port = cleanup.port_lease->port();
    at.tcp = NbdTcpUri(uri.host, res.nbd_port);
  } else if (cleanup.remote) {
    BARGE_ASSIGN_OR_RETURN(cleanup.forward, SshForward::Start(env, uri, cleanup.socket, req.copy.cancel));
    at.socket = cleanup.forward->local_socket();
  }
  return at;
}

// Disk `name`'s part of its backup request in a pull run: its export, and
// its dirty set (the job's bitmap, from the parent checkpoint).
void SetPullSource(const VmBackupRequest& req, const RunPlan& plan, const ExportPlace& at, Cleanup& cleanup,
                   const std::string& parent_checkpoint, const std::string& name, pipeline::BackupRequest& br) {
  if (at.tcp.empty()) {
    br.source.location = "nbd+unix:///" + name + "?socket=" + at.socket;
    br.source.nbd.connections = req.nbd.connections;
    // A cut ssh session: each reconnect waits for the forward to be
    // back (or brings a stalled one down), not knocking at a dead
    // local socket. (The forward outlives the copy: EndJob stops it.)
    if (SshForward* forward = cleanup.forward.get(); forward != nullptr) {
      br.copy.nbd_retry.restore_transport = [forward] { return forward->Restore(); };
    }
  } else {
    br.source.location = at.tcp + "/" + name;
    br.source.nbd = req.nbd;  // TLS required: a plaintext server is refused
  }
  // The point of a disk left out of the checkpoint is not at it.
  if (!plan.with_bitmap.count(name)) br.checkpoint.clear();
  if (br.incremental) {
    br.dirty_bitmap = "qemu:dirty-bitmap:backup-" + name;
    br.since_checkpoint = parent_checkpoint;
  }
  // A run whose connection to the export was lost for good keeps what it
  // staged (fail: Cleanup::KeepForResume), where the checkpoint can stay.
  br.keep_staged = br.checkpoint.empty() ? pipeline::BackupRequest::KeepStaged::kNever
                                         : pipeline::BackupRequest::KeepStaged::kWhenDisconnected;
}

// After the commit: the run record goes (or, when the job outlived its
// end, stays naming the job alone) and the tracker's previous checkpoint,
// no longer needed, is deleted.
void CleanUpCommitted(Env& env, virDomainPtr dom, bool job_ended, const std::string& checkpoint,
                      const std::string& parent_checkpoint, Cleanup& cleanup) {
  if (job_ended) {
    IgnoreError(cleanup.DropRecord(),
                "the run is committed: a run record left behind names a gone process, a job that has ended and a "
                "checkpoint the tracker names, so the next run only removes the record");
  } else if (!cleanup.job_record.empty()) {
    // The job outlived its end (libvirtd gone at that moment): the record
    // stays, naming the job alone, so the next backup ends it as an
    // orphan; the committed checkpoint and points are not its to remove.
    BackupJobRecord kept = cleanup.job;
    kept.checkpoint.clear();
    kept.chains_dir.clear();
    kept.resumed_checkpoints.clear();
    IgnoreError(WriteBackupJobRecord(env, cleanup.job_record, kept),
                "a record still naming the checkpoint only makes the next run check it against the tracker");
  }
  // The tracker moved on: its previous checkpoint's bitmaps are no longer needed.
  if (!checkpoint.empty() && !parent_checkpoint.empty() && parent_checkpoint != checkpoint) {
    IgnoreError(DeleteCheckpoint(dom, parent_checkpoint),
                "the run is committed and the tracker no longer names that checkpoint: left behind, it only "
                "costs its bitmaps' upkeep until deleted by hand ('virsh checkpoint-delete')");
  }
}

}  // namespace

std::string NbdTcpUri(const std::string& host, int port) {
  return "nbds://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
         (port > 0 ? ":" + std::to_string(port) : "");
}

bool ExportOverTls(const LibvirtUri& uri, const VmBackupRequest& req) {
  return uri.remote() && (!uri.ssh() || req.nbd.tls());
}

Status CheckFreeSpace(Env& env, virDomainPtr dom, const std::vector<DomainDisk>& disks, const VmBackupRequest& req) {
  uint64_t need = 0;
  for (const auto& d : disks) {
    BARGE_ASSIGN_OR_RETURN(uint64_t alloc, DiskAllocation(dom, d.target));
    BARGE_ASSIGN_OR_RETURN(uint64_t cap, DiskCapacity(dom, d.target));
    // Over a data file the qcow2 file holds metadata only: count the disk.
    need += (d.format == "raw" || alloc < cap / 64) ? std::max(alloc, cap / 64) : alloc;
  }
  BARGE_ASSIGN_OR_RETURN(uint64_t free_bytes, pipeline::FreeBytes(env, req.target));
  if (free_bytes < need) {
    return Error::NoSpace("target has " + formats::HumanBytesExact(free_bytes) + " free, the backup of '" +
                          req.domain + "' may need " + formats::HumanBytesExact(need))
        .set_path(req.target);
  }
  return OkStatus();
}


Result<VmBackupResult> RunPullBackup(const RunContext& ctx, const LibvirtUri& uri, RunPlan plan) {
  Env& env = ctx.env;
  const VmBackupRequest& req = ctx.req;
  BARGE_RETURN_IF_ERROR(CheckFreeSpace(env, ctx.dom, plan.disks, req));
  VmBackupResult res;
  res.mode = "pull";
  if (std::string note = KnownHostsNote(uri); !note.empty()) res.warnings.push_back(std::move(note));
  BARGE_ASSIGN_OR_RETURN(std::string checkpoint, StartRun(ctx, res));
  // No selected disk can hold a bitmap: no checkpoint, and the tracker
  // stays where it is (its checkpoint still serves the other disks).
  if (plan.with_bitmap.empty()) checkpoint.clear();

  Cleanup cleanup(env);
  cleanup.kept_checkpoints = plan.kept;
  cleanup.faults = req.faults;
  cleanup.dom = ctx.dom;
  cleanup.remote = uri.remote();
  cleanup.tls = ExportOverTls(uri, req);
  cleanup.tcp_host = uri.host;
  res.transport = cleanup.tls ? "tls" : uri.remote() ? "ssh" : "unix";
  auto fail = [&](Error e) -> Error {
    const auto staged = StagedAt(env, req.target + "/" + req.domain, plan.disks, checkpoint);
    if (!cleanup.KeepForResume(e, staged)) cleanup.Undo(e);
    RecordFailure(ctx, checkpoint, res, e);
    return e;
  };

  // Prepare: quiesce, socket, scratch folder, run record; the job and its
  // checkpoint; thaw once the job's point in time is fixed (a guest that
  // cannot be thawed is not left frozen for the whole copy unnoticed).
  if (Status s = PrepareJob(env, req, ctx.dom, checkpoint, res.record_id, cleanup); !s.ok()) {
    return fail(std::move(s).error());
  }
  if (Status s = BeginJob(env, req, ctx.dom, plan, plan.with_bitmap, res.parent_checkpoint, checkpoint, cleanup);
      !s.ok()) {
    return fail(std::move(s).error());
  }
  if (!cleanup.Thaw().empty()) {
    return fail(Error::IoError("cannot thaw domain '" + req.domain + "' once its backup job had started"));
  }
  if (!cleanup.job_started) return fail(Error::IoError("backup job did not start"));
  auto at = OpenExport(env, req, uri, cleanup, res);
  if (!at.ok()) return fail(std::move(at).error());

  // Copy each disk.
  std::optional<Error> first_error = CopyDisks(
      ctx, plan, checkpoint,
      [&](const std::string& name, pipeline::BackupRequest& br) {
        SetPullSource(req, plan, *at, cleanup, res.parent_checkpoint, name, br);
      },
      res, cleanup.files);
  if (!first_error) {
    if (Status injected = InjectedFault(req, VmBackupFaults::Point::kAfterRead); !injected.ok()) {
      first_error = std::move(injected).error();
    }
  }
  if (first_error) return fail(*first_error);
  Status ended = cleanup.EndJob();
  const bool job_ended = ended.ok();
  IgnoreError(std::move(ended),
              "the backup is complete; a socket or scratch folder left behind is removed by the next backup "
              "of this domain before it starts");

  // Commit, then clean up.
  SumUp(ctx, checkpoint, res);
  if (Status s = CommitRun(ctx, checkpoint, res); !s.ok()) return fail(s.error());
  CleanUpCommitted(env, ctx.dom, job_ended, checkpoint, res.parent_checkpoint, cleanup);
  DropKeptCheckpoints(ctx.dom, cleanup.kept_checkpoints, checkpoint, /*metadata_only=*/false);
  WarnOfStartingOver(res);
  return res;
}

}  // namespace barge::orchestrate::vm_steps
