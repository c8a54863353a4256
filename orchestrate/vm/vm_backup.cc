// VM backup: plan, quiesce, pull-mode job, per-disk pipeline, commit.
#include "orchestrate/vm/vm_backup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>
#include <optional>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "blockio/path.h"
#include "formats/manifest.h"
#include "formats/units.h"
#include "blockio/thread.h"
#include "formats/qcow2_bitmap_edit.h"
#include "formats/units.h"
#include "pipeline/chain.h"
#include "pipeline/disk_identity.h"
#include "pipeline/endpoints.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/libvirt/guest_freeze.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/nbd_ports.h"
#include "orchestrate/libvirt/paused_start.h"
#include "orchestrate/libvirt/ssh_forward.h"
#include "pipeline/nbd_endpoint.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/vm_orphans.h"

namespace barge::orchestrate {
namespace {

// The refusal of a shut-off domain without a CBT overlay: nothing to read
// its changes from (PlanRun, and RunVmBackup before it touches leftovers).
Error NotRunningWithoutCbt(const std::string& domain) {
  return Error::InvalidArgument("domain '" + domain +
                                "' is not running and has no CBT overlay: start it for a pull-mode backup, "
                                "or enable CBT ('barge cbt enable') for offline backups");
}

// A committed run's warnings for the disks whose staged data a resume
// could not take (both modes).
void WarnOfStartingOver(VmBackupResult& res) {
  for (const auto& d : res.disks) {
    if (d.resume && !d.resume->resumed) {
      res.warnings.push_back("disk " + d.disk + ": staged data not reusable: " + d.resume->problem +
                             ", starting over");
    }
  }
}

// The error the request's fault seam injects at `point`, if any.
Status InjectedFault(const VmBackupRequest& req, VmBackupFaults::Point point) {
  return req.faults != nullptr ? req.faults->At(point) : OkStatus();
}

// An exclusive, non-blocking lock on <catalog folder>/locks/<domain>.lock,
// held for the backup (released by the kernel if we die).
Result<std::unique_ptr<EnvLock>> LockDomain(Env& env, const std::string& catalog_path,
                                           const std::string& domain) {
  return TryLockFile(env, DomainLockPath(catalog_path, domain), DomainBusyMessage(domain));
}

std::string JoinReasons(const std::vector<VmBackupDisk>& disks) {
  std::set<std::string> distinct;
  for (const auto& d : disks) distinct.insert(d.reason);
  if (distinct.size() == 1) return *distinct.begin();
  std::string out;
  for (const auto& d : disks) out += (out.empty() ? "" : "; ") + d.disk + ": " + d.reason;
  return out;
}

// "nbds://HOST[:PORT]" (an IPv6 address in brackets).
std::string NbdTcpUri(const std::string& host, int port) {
  return "nbds://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
         (port > 0 ? ":" + std::to_string(port) : "");
}

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

// Whether libvirt can keep a checkpoint bitmap for a running domain's disk:
// only in a qcow2 image (a raw disk gets one through `barge cbt enable`,
// which puts it behind a qcow2 overlay).
bool CanHoldBitmap(const DomainDisk& d) { return d.format == "qcow2"; }

// The reason a disk that cannot hold a bitmap is backed up in full every
// time (as virtnbdbackup does for raw disks), with the way to incrementals.
std::string NoBitmapReason(const DomainDisk& d) {
  return (d.format.empty() ? std::string("unknown-format") : d.format) +
         " disk without CBT: full every time (no checkpoint bitmap; 'barge cbt enable' gives incrementals)";
}

// "... for disk 'vda'" in libvirt's "checkpoint inconsistent" message.
std::string DiskNamedIn(const std::string& message) {
  size_t a = message.find("for disk '");
  if (a == std::string::npos) return "";
  a += 10;
  size_t b = message.find('\'', a);
  return b == std::string::npos ? "" : message.substr(a, b - a);
}

// "a,b" (BackupJobRecord::resumed_checkpoints).
std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
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
  // made and barge touches no path there.
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
    if (remote) return s;
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

VmBackupDisk FromBackupResult(const std::string& disk, bool incremental, const std::string& reason,
                              const pipeline::BackupResult& r) {
  VmBackupDisk d;
  d.disk = disk;
  // The pipeline takes a full when the disk's file was replaced under its
  // path (BackupResult::replaced), whatever the plan said.
  d.incremental = incremental && r.replaced.empty();
  d.reason = r.replaced.empty() ? reason : r.replaced;
  d.chain_dir = r.chain_dir;
  d.image_path = r.image_path;
  d.manifest_path = r.manifest_path;
  d.virtual_size = r.manifest.virtual_size;
  d.bytes_read = r.bytes_read;
  d.bytes_written = r.image_bytes;
  d.resume = r.resume;
  return d;
}

// The catalog's record of a run's new checkpoint, holding the XML libvirt
// now stores for it (for a later redefine); fills the disks' sizes.
Result<CheckpointRecord> NewCheckpointRecord(virDomainPtr dom, const std::string& checkpoint,
                                             const std::string& domain, const VmBackupResult& res,
                                             std::map<std::string, uint64_t>& sizes) {
  BARGE_ASSIGN_OR_RETURN(auto cp, LookupCheckpoint(dom, checkpoint));
  BARGE_ASSIGN_OR_RETURN(std::string xml, CheckpointXml(cp.get()));
  CheckpointRecord r{checkpoint, res.tracker, domain, formats::NowRfc3339(), {}, std::move(xml), ""};
  // Where it lives: the connection's host, "" for this machine.
  const std::string uri = ConnectionUri(dom);
  if (!LibvirtHostKey(uri).empty()) r.host = RedactLibvirtUri(uri);
  const auto in_checkpoint = CheckpointDisks(r.xml);
  for (const auto& d : res.disks) {
    // A disk the checkpoint leaves out (no bitmap) is not the tracker's.
    auto it = in_checkpoint.find(d.disk);
    if (it == in_checkpoint.end() || it->second.first != "bitmap") continue;
    r.disks.push_back(d.disk);
    sizes[d.disk] = d.virtual_size;
  }
  return r;
}

BackupRecord ToRecord(const VmBackupRequest& req, const VmBackupResult& res, const std::string& started) {
  BackupRecord r;
  r.domain = req.domain;
  r.tracker = res.tracker;
  r.type = res.backup_type;
  r.reason = res.reason;
  r.checkpoint = res.checkpoint;
  r.parent_checkpoint = res.parent_checkpoint;
  r.target = req.target;
  r.started_at = started;
  r.finished_at = formats::NowRfc3339();
  r.duration_seconds = res.seconds;
  for (const auto& d : res.disks) {
    r.disks.push_back({d.disk, d.incremental ? "incremental" : "full", d.reason, d.chain_dir, d.image_path,
                       d.manifest_path, d.virtual_size, d.bytes_read, d.bytes_written});
  }
  return r;
}

// The start of a run, online or offline: tracker and parent checkpoint in
// `res`, a new checkpoint name (with a tracker; returned), and the catalog's
// "running" record (its id in res.record_id).
Result<std::string> StartRun(const VmBackupRequest& req, BackupCatalog& catalog, virDomainPtr dom,
                     const TrackerRecord* tracker, const std::string& started, VmBackupResult& res) {
  res.tracker = tracker ? tracker->name : "";
  res.parent_checkpoint = tracker ? tracker->latest_checkpoint : "";
  std::string checkpoint;
  if (tracker) {
    checkpoint = NewCheckpointName(tracker->name);
    // Names have one-second resolution: wait out a same-second predecessor.
    for (int i = 0; i < 3 && LookupCheckpoint(dom, checkpoint).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1100));
      checkpoint = NewCheckpointName(tracker->name);
    }
  }
  BackupRecord pending;
  pending.domain = req.domain;
  pending.target = req.target;
  pending.started_at = started;
  BARGE_ASSIGN_OR_RETURN(res.record_id, catalog.BeginBackup(pending));
  return checkpoint;
}

// One backup per disk, all in parallel (each RunBackup is itself
// parallel). `set_source` fills in where a disk is read from and its dirty
// set; the rest of each request is common. The disks that succeeded are
// added to `res` and their new files to `new_files`; returns the first
// disk's error, if any.
std::optional<Error> BackupDisks(Env& env, const VmBackupRequest& req, const std::vector<DomainDisk>& disks,
                                 const std::map<std::string, bool>& incremental,
                                 const std::map<std::string, std::string>& reasons, const std::string& checkpoint,
                                 const std::map<std::string, formats::DiskIdentity>& identities,
                                 const std::function<void(const std::string& disk, pipeline::BackupRequest&)>& set_source,
                                 VmBackupResult& res, std::vector<std::string>& new_files) {
  std::vector<Result<pipeline::BackupResult>> results(disks.size(), Error::Cancelled("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < disks.size(); ++i) {
    auto started = StartThread("backup of disk " + disks[i].target, [&, i] {
      const std::string& name = disks[i].target;
      pipeline::BackupRequest br;
      br.target_dir = req.target + "/" + req.domain;
      br.disk_name = name;
      br.access = req.access;
      br.incremental = incremental.at(name);
      br.reason = reasons.at(name);
      br.checkpoint = checkpoint;
      // The chain is this domain's disk: a size change is a resize (the
      // plan made this backup full for it), never another disk.
      br.allow_resize = true;
      // The disk is the domain's, whichever socket or overlay it is read
      // through: online and offline backups extend one chain. The file
      // behind the target too: disks that swapped files keep their targets
      // (PlanDisks makes them fulls).
      br.disk_identity = identities.at(name);
      br.compression = req.compression;
      br.compression_level = req.compression_level;
      br.copy = req.copy;
      if (req.progress) {
        br.copy.progress = [&req, name](uint64_t done, uint64_t total) { req.progress(name, done, total); };
      }
      set_source(name, br);
      results[i] = pipeline::RunBackup(env, br);
    });
    if (started.ok()) {
      threads.push_back(std::move(started).value());
    } else {
      results[i] = started.error();
    }
  }
  for (auto& t : threads) t.join();
  std::optional<Error> first_error;
  for (size_t i = 0; i < disks.size(); ++i) {
    const std::string& name = disks[i].target;
    if (!results[i].ok()) {
      if (!first_error) first_error = Error(results[i].error()).Wrap("disk " + name);
      continue;
    }
    const auto& r = *results[i];
    new_files.insert(new_files.end(), {r.image_path, r.manifest_path, r.digests_path});
    res.disks.push_back(FromBackupResult(name, incremental.at(name), reasons.at(name), r));
  }
  return first_error;
}

// Each disk's identity in its chain, built once per run: the domain's disk
// by target, with the file behind the target, canonical (for a disk on a
// CBT overlay the raw disk it tracks: the overlay may move with `state
// migrate`, the disk is the same). PlanDisks compares it with the chain
// (swapped disks take fulls); the new point records it.
std::map<std::string, formats::DiskIdentity> DiskIdentities(Env& env, const std::string& domain,
                                                            const std::vector<DomainDisk>& disks,
                                                            const std::optional<std::vector<CbtDisk>>& cbt,
                                                            bool remote) {
  std::map<std::string, formats::DiskIdentity> out;
  for (const auto& d : disks) {
    // A remote host's paths mean nothing here: taken as libvirt gives them.
    if (remote) {
      formats::DiskIdentity id;
      id.kind = "domain";
      id.location = domain;
      id.target = d.target;
      id.source = d.source;
      out[d.target] = std::move(id);
      continue;
    }
    std::string file = d.source.empty() ? "" : CanonicalPath(env, d.source);
    if (cbt && !file.empty()) {
      for (const auto& c : *cbt) {
        if (c.disk == d.target && CanonicalPath(env, c.overlay) == file) file = CanonicalPath(env, c.data_file);
      }
    }
    out[d.target] = formats::DiskIdentity{.kind = "domain", .location = domain, .target = d.target, .source = file};
  }
  return out;
}

// The bitmaps of a CBT overlay, read directly (the domain is shut off).
Result<std::vector<formats::BitmapInfo>> OverlayBitmaps(Env& env, const CbtDisk& d) {
  pipeline::SourceSpec spec;
  spec.location = d.overlay;
  spec.format = "qcow2";
  spec.allow_dirs = {DirName(d.data_file)};
  BARGE_ASSIGN_OR_RETURN(auto opened, pipeline::OpenSource(env, spec));
  return opened.image->info().bitmaps;
}

// A checkpoint for a shut-off domain, defined from what the offline backup
// put in the overlays (libvirt's REDEFINE: metadata only, bitmaps exist).
std::string OfflineCheckpointXml(const std::string& name, const std::vector<DomainDisk>& all,
                                 const std::set<std::string>& with_bitmap, const std::string& domain_xml) {
  std::string x = "<domaincheckpoint><name>" + XmlEscape(name) + "</name><creationTime>" +
                  std::to_string(::time(nullptr)) + "</creationTime><disks>";
  for (const auto& d : all) {
    if (with_bitmap.count(d.target)) {
      x += "<disk name='" + XmlEscape(d.target) + "' checkpoint='bitmap' bitmap='" + XmlEscape(name) + "'/>";
    } else {
      x += "<disk name='" + XmlEscape(d.target) + "' checkpoint='no'/>";
    }
  }
  return x + "</disks>" + domain_xml + "</domaincheckpoint>";
}

// The target must exist: creating it would put a backup meant for an
// unmounted backup volume on the file system beneath its mount point.
Status CheckTarget(Env& env, const std::string& target) {
  auto target_st = env.Stat(target);
  if (!target_st.ok()) {
    if (target_st.error().code() != ErrorCode::kNotFound) return std::move(target_st).error();
    return Error::NotFound("backup target folder does not exist (create it first; is the backup volume mounted?)")
        .set_path(target);
  }
  if (!target_st->is_directory()) return Error::InvalidArgument("backup target is not a folder").set_path(target);
  return OkStatus();
}

// Everything a run decides before it starts anything, from the domain as it
// is now: PlanRun's result, shared by RunVmBackup and ForecastVmBackup.
struct RunPlan {
  std::string mode;  // "pull" (active domain: running or paused) or "offline"
  std::vector<DomainDisk> all_disks;
  std::vector<DomainDisk> disks;  // selected
  std::set<std::string> selected;
  std::optional<std::vector<CbtDisk>> cbt;
  std::map<std::string, CbtDisk> overlay_of;  // offline: the selected disks' overlays
  std::map<std::string, formats::DiskIdentity> identities;
  std::map<std::string, std::vector<formats::BitmapInfo>> bitmaps;  // offline: each overlay's bitmaps
  std::map<std::string, bool> incremental;
  std::map<std::string, std::string> reasons;
  std::vector<DiskPlan> plans;  // per selected disk, in domain order
  // Pull mode: the disks that resume a killed run's staged point (PlanResumes),
  // and why the others with staged data cannot.
  std::map<std::string, pipeline::BackupRequest::StagedEarlier> resumes;
  std::map<std::string, std::string> resume_refused;
};

// The plan of a backup of `domain` with `tracker` (nullptr: none) of the
// disks `want` (empty: all) into `target` ("" skips the chain checks): an
// active domain (running or paused) is backed up by a pull-mode job, a
// shut-off one from its CBT overlays (refused without CBT on every selected
// disk). Per disk PlanDisks, and offline also the overlay's own bitmap: a
// disk is incremental only if its overlay holds the tracker checkpoint's
// bitmap (libvirt names a checkpoint's bitmap after the checkpoint),
// enabled and not in use.
Result<RunPlan> PlanRun(Env& env, BackupCatalog& catalog, virDomainPtr dom, const std::string& domain,
                        const TrackerRecord* tracker, const std::vector<std::string>& want, bool force_full,
                        const std::string& target) {
  RunPlan plan;
  const std::string uri = ConnectionUri(dom);
  const bool remote = !LibvirtHostKey(uri).empty();
  // A shut-off domain on another host is backed up by a pull job too: the
  // run starts it paused (PausedStart), as its CBT overlays'
  // files are on that host.
  const bool active = DomainIsActive(dom) || remote;
  plan.mode = active ? "pull" : "offline";
  BARGE_ASSIGN_OR_RETURN(plan.cbt, CbtDisksOf(catalog, domain));
  if (!active && !plan.cbt) {
    return NotRunningWithoutCbt(domain);
  }
  if (!active) {
    for (const auto& c : *plan.cbt) plan.overlay_of[c.disk] = c;
  }
  BARGE_ASSIGN_OR_RETURN(plan.all_disks, DomainDisks(dom));
  for (const auto& d : plan.all_disks) {
    if (!want.empty() && std::find(want.begin(), want.end(), d.target) == want.end()) continue;
    if (!active) {
      auto it = plan.overlay_of.find(d.target);
      if (it == plan.overlay_of.end() || it->second.overlay != d.source) {
        return Error::InvalidArgument("domain '" + domain + "' is not running and its disk '" + d.target +
                                      "' is not on a CBT overlay: offline backups need CBT on every selected disk");
      }
    }
    plan.disks.push_back(d);
    plan.selected.insert(d.target);
  }
  for (const auto& w : want) {
    if (!plan.selected.count(w)) return Error::NotFound("domain '" + domain + "' has no disk '" + w + "'");
  }
  if (plan.disks.empty()) return Error::InvalidArgument("domain '" + domain + "' has no disks to back up");

  plan.identities = DiskIdentities(env, domain, plan.disks, plan.cbt, remote);
  BARGE_ASSIGN_OR_RETURN(plan.plans,
                         PlanDisks(env, tracker, dom, plan.disks, plan.identities, force_full, target, domain));
  for (auto& p : plan.plans) {
    if (!active) {
      BARGE_ASSIGN_OR_RETURN(plan.bitmaps[p.disk], OverlayBitmaps(env, plan.overlay_of[p.disk]));
      if (p.incremental) {
        const formats::BitmapInfo* b = nullptr;
        for (const auto& x : plan.bitmaps[p.disk]) {
          if (x.name == tracker->latest_checkpoint) b = &x;
        }
        if (b == nullptr) {
          p.incremental = false;
          p.reason = "bitmap " + tracker->latest_checkpoint + " missing in the CBT overlay";
        } else if (b->in_use || !b->enabled) {
          p.incremental = false;
          p.reason = "bitmap inconsistent";
        }
      }
    }
    plan.incremental[p.disk] = p.incremental;
    plan.reasons[p.disk] = p.reason;
  }
  // A running domain's disk that cannot hold a checkpoint bitmap (raw
  // without CBT) is read in full every time and left out of the checkpoint;
  // the others keep their checkpoint and incrementals.
  if (active) {
    for (const auto& d : plan.disks) {
      if (CanHoldBitmap(d)) continue;
      for (auto& p : plan.plans) {
        if (p.disk != d.target) continue;
        p.incremental = false;
        p.reason = NoBitmapReason(d);
        plan.incremental[p.disk] = false;
        plan.reasons[p.disk] = p.reason;
      }
    }
  }
  return plan;
}

// Edits the bitmaps of a CBT overlay in place, under QEMU's image lock
// first, as qemu-img does: a domain started meanwhile must not open the
// overlay while its bitmaps are edited (Busy, naming the holder).
Status EditOverlayBitmaps(Env& env, const CbtDisk& c, const formats::BitmapEdit& edit) {
  BARGE_ASSIGN_OR_RETURN(auto image_lock, env.LockImage(c.overlay, ImageAccess::kExclusiveWrite));
  return formats::EditBitmaps(
      c.overlay, pipeline::EnvSourceOpener(env),
      [&env](const std::string& p) { return env.OpenSink(p, SinkMode::kExisting); }, edit);
}

// A barge checkpoint bitmap of one of `trackers` ("<tracker>-YYYYMMDDTHHMMSSZ").
bool IsTrackersCheckpointName(const std::string& name, const std::vector<TrackerRecord>& trackers) {
  if (!IsBargeCheckpointName(name)) return false;
  for (const auto& t : trackers) {
    if (name.size() == t.name.size() + 17 && name.rfind(t.name + "-", 0) == 0) return true;
  }
  return false;
}

// A shut-off domain with CBT overlays: first each overlay gets the new
// checkpoint's bitmap (enabled, empty: it records any write from now on, so
// that a killed run can be resumed from it) and loses the bitmaps nothing
// can use (left in use by a killed QEMU, or barge's strays); then every
// disk is read from its overlay (the raw disk through the overlay's data
// file), incremental from the tracker's checkpoint bitmap read directly
// from the overlay, resuming what a killed run staged (`kept`: the
// checkpoints kept for it, plan.resumes); then the old checkpoint's bitmap
// (and the kept ones) are removed and libvirt gets the new checkpoint's
// metadata. A failure removes the new bitmap again; one during the commit's
// edit leaves a disk whose old bitmap is gone, so its next backup is full
// (never an incremental that misses writes). A run record
// (BackupJobRecord, no job) says to the next run what a killed run left.
Result<VmBackupResult> RunOfflineBackup(Env& env, const VmBackupRequest& req, BackupCatalog& catalog, virDomainPtr dom,
                                        const TrackerRecord* tracker, RunPlan plan,
                                        const std::vector<std::string>& kept, const std::string& started,
                                        std::chrono::steady_clock::time_point t0) {
  const auto& all_disks = plan.all_disks;
  const auto& disks = plan.disks;
  const auto& selected = plan.selected;
  const auto& identities = plan.identities;
  auto& overlay_of = plan.overlay_of;
  auto& bitmaps = plan.bitmaps;
  auto& incremental = plan.incremental;
  auto& reasons = plan.reasons;

  VmBackupResult res;
  res.mode = "offline";
  BARGE_ASSIGN_OR_RETURN(std::string checkpoint, StartRun(req, catalog, dom, tracker, started, res));
  const int64_t record_id = res.record_id;
  std::vector<std::string> new_files;
  std::set<std::string> added;  // disks whose overlay got the new checkpoint's bitmap
  bool defined = false;         // libvirt has the new checkpoint
  std::string job_record;
  auto is_kept = [&kept](const std::string& name) {
    return std::find(kept.begin(), kept.end(), name) != kept.end();
  };
  auto fail = [&](Error e) -> Error {
    for (const auto& f : new_files) e.Also(env.UnlinkIfExists(f));
    // Nothing of the run is left: its checkpoint's bitmaps, nor the killed
    // runs' checkpoints it resumed from (their staged data went with the
    // failed copy; the tracker's checkpoint still holds every write). A
    // domain started meanwhile has the overlays open: what is left there
    // is removed by the next offline backup (strays).
    if (!DomainIsActive(dom)) {
      for (const auto& d : disks) {
        auto now = OverlayBitmaps(env, overlay_of.at(d.target));
        if (!now.ok()) {
          e.Also(Status(now.error()));
          continue;
        }
        formats::BitmapEdit edit;
        for (const auto& b : *now) {
          if ((added.count(d.target) && b.name == checkpoint) || is_kept(b.name)) edit.remove.push_back(b.name);
        }
        if (!edit.remove.empty()) e.Also(EditOverlayBitmaps(env, overlay_of.at(d.target), edit));
      }
    }
    if (defined) e.Also(DeleteCheckpoint(dom, checkpoint, /*metadata_only=*/true));
    for (const auto& cp : kept) {
      if (LookupCheckpoint(dom, cp).ok()) e.Also(DeleteCheckpoint(dom, cp, /*metadata_only=*/true));
    }
    if (!job_record.empty()) e.Also(env.UnlinkIfExists(job_record));
    res.checkpoint = checkpoint;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BackupRecord r = ToRecord(req, res, started);
    r.error = e.ToString();
    e.Also(catalog.FailBackup(record_id, r));
    return e;
  };

  // The run record, before anything changes in the overlays.
  {
    const std::string path = BackupJobRecordPath(req.catalog_path, req.domain);
    BackupJobRecord job{ProcessOwner::Self(env).Encode(), "", "", checkpoint, req.target + "/" + req.domain,
                        record_id, "", JoinNames(kept), false};
    if (Status s = WriteBackupJobRecord(env, path, job); !s.ok()) {
      return fail(std::move(s).error().Wrap("write the backup run's record"));
    }
    job_record = path;
  }
  if (!checkpoint.empty()) {
    auto trackers = catalog.ListTrackers(req.domain);
    if (!trackers.ok()) return fail(std::move(trackers).error());
    auto known = ListCheckpointNames(dom);
    if (!known.ok()) return fail(std::move(known).error());
    for (const auto& d : disks) {
      formats::BitmapEdit edit;
      uint32_t granularity = 64 << 10;
      for (const auto& b : bitmaps[d.target]) {
        if (b.name == res.parent_checkpoint || b.name == kCbtBitmapName) granularity = b.granularity_bytes;
      }
      for (const auto& b : bitmaps[d.target]) {
        if (b.in_use) {
          // Left in use by a QEMU that did not close the overlay (killed):
          // its contents are lost, and a kept in-use bitmap would make
          // every edit refuse from now on (the tracker's own checkpoint
          // bitmap in use made this run full for the disk; a killed run's
          // made it start over). CBT's own bitmap, which no plan reads, is
          // re-created empty and enabled; another tracker's checkpoint
          // bitmap is removed, so its next backup is full ("missing in the
          // CBT overlay"), never an incremental that misses the writes
          // before the crash.
          edit.remove.push_back(b.name);
          if (b.name == kCbtBitmapName) edit.add.push_back(formats::BitmapSpec{b.name, b.granularity_bytes, true, {}});
        } else if (IsTrackersCheckpointName(b.name, *trackers) && !is_kept(b.name) &&
                   std::find(known->begin(), known->end(), b.name) == known->end()) {
          // A stray: the bitmap of a checkpoint libvirt does not know that
          // no run resumes from (a killed offline run's, or a killed pull
          // run's whose metadata alone could be deleted).
          edit.remove.push_back(b.name);
        }
      }
      edit.add.push_back(formats::BitmapSpec{checkpoint, granularity, true, {}});
      if (Status s = EditOverlayBitmaps(env, overlay_of.at(d.target), edit); !s.ok()) {
        return fail(std::move(s).error().Wrap("add the new checkpoint's bitmap to the CBT overlay of disk " +
                                              d.target));
      }
      added.insert(d.target);
    }
  }

  std::optional<Error> first_error = BackupDisks(
      env, req, disks, incremental, reasons, checkpoint, identities,
      [&](const std::string& name, pipeline::BackupRequest& br) {
        const CbtDisk& c = overlay_of.at(name);
        br.source.location = c.overlay;
        br.source.format = "qcow2";
        br.source.allow_dirs = {DirName(c.data_file)};
        if (br.incremental) {
          br.dirty_bitmap = tracker->latest_checkpoint;
          br.since_checkpoint = tracker->latest_checkpoint;
        }
        // Resumable: a killed run leaves its staged data, journal and work
        // set, and its checkpoint's bitmap stays in the overlay (the next
        // run's RecoverOrphanedBackupJob keeps it). A failure keeps
        // nothing: a file source is not a connection to lose.
        br.resume = req.resume;
        br.keep_work = true;
        br.keep_staged = pipeline::BackupRequest::KeepStaged::kNever;
        if (auto it = plan.resumes.find(name); it != plan.resumes.end()) br.staged_earlier = it->second;
        if (auto it = plan.resume_refused.find(name); it != plan.resume_refused.end()) br.resume_refused = it->second;
      },
      res, new_files);
  if (!first_error && DomainIsActive(dom)) {
    first_error = Error::InvalidArgument("domain '" + req.domain +
                                         "' was started during its offline backup; the backup is discarded");
  }
  if (!first_error) {
    if (Status injected = InjectedFault(req, VmBackupFaults::Point::kAfterRead); !injected.ok()) {
      first_error = std::move(injected).error();
    }
  }
  if (first_error) return fail(*first_error);

  bool all_incremental = true;
  for (const auto& d : res.disks) all_incremental &= d.incremental;
  res.backup_type = all_incremental ? "Incremental" : "Full";
  res.reason = JoinReasons(res.disks);
  res.checkpoint = checkpoint;

  std::optional<CheckpointRecord> cp_record;
  std::map<std::string, uint64_t> sizes;
  if (!checkpoint.empty()) {
    // Rotate: the new checkpoint's bitmap (added before the reads) replaces
    // the old one and those of the killed runs this run resumed from.
    for (const auto& d : disks) {
      auto now = OverlayBitmaps(env, overlay_of.at(d.target));
      if (!now.ok()) return fail(std::move(now).error().Wrap("rotate the CBT bitmap of disk " + d.target));
      formats::BitmapEdit edit;
      for (const auto& b : *now) {
        if (b.name != checkpoint && (b.name == res.parent_checkpoint || is_kept(b.name))) {
          edit.remove.push_back(b.name);
        }
      }
      if (edit.remove.empty()) continue;
      if (Status s = EditOverlayBitmaps(env, overlay_of.at(d.target), edit); !s.ok()) {
        return fail(std::move(s).error().Wrap("rotate the CBT bitmap of disk " + d.target));
      }
    }
    auto domain_xml = DomainXml(dom, VIR_DOMAIN_XML_INACTIVE);
    if (!domain_xml.ok()) return fail(std::move(domain_xml).error());
    std::string xml = OfflineCheckpointXml(checkpoint, all_disks, selected, *domain_xml);
    virDomainCheckpointPtr cp = virDomainCheckpointCreateXML(dom, xml.c_str(), VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE);
    if (cp == nullptr) return fail(LastVirError("define checkpoint " + checkpoint));
    virDomainCheckpointFree(cp);
    defined = true;
    // The old checkpoint's bitmaps were removed with the rotation, and so
    // were the kept ones': libvirt deletes bitmaps only from a running
    // domain, so of these only the metadata goes.
    if (!res.parent_checkpoint.empty()) {
      IgnoreError(DeleteCheckpoint(dom, res.parent_checkpoint, true),
                  "metadata of a checkpoint whose bitmaps are gone: the tracker moves on to the new one and "
                  "never plans from it again; failing here would lose a backup that is complete");
    }
    auto made = NewCheckpointRecord(dom, checkpoint, req.domain, res, sizes);
    if (!made.ok()) return fail(made.error());
    cp_record = std::move(made).value();
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BackupRecord record = ToRecord(req, res, started);
  if (Status s = catalog.CommitBackup(record_id, record, cp_record, sizes); !s.ok()) return fail(s.error());
  for (const auto& cp : kept) {
    if (cp == checkpoint || !LookupCheckpoint(dom, cp).ok()) continue;
    IgnoreError(DeleteCheckpoint(dom, cp, /*metadata_only=*/true),
                "metadata of a checkpoint whose bitmaps are gone, which no tracker names: left behind, the next "
                "online backup removes it as stale");
  }
  IgnoreError(env.UnlinkIfExists(std::exchange(job_record, "")),
              "the run is committed: a run record left behind names a gone process and a checkpoint the tracker "
              "names, so the next run only removes the record");
  WarnOfStartingOver(res);
  return res;
}

// The target and the scratch root exist and are folders (neither is
// created: a missing one is an unmounted volume); both made absolute.
Status CheckFolders(Env& env, VmBackupRequest& req, bool remote) {
  BARGE_RETURN_IF_ERROR(CheckTarget(env, req.target));
  req.target = AbsolutePath(req.target);
  if (req.scratch_dir.empty()) req.scratch_dir = kDefaultScratchRoot;
  // A remote hypervisor's scratch root is a path on that host: nothing here
  // to look at; libvirt reports a missing one when the job starts.
  if (remote) {
    if (req.scratch_dir.front() != '/') {
      return Error::InvalidArgument("the scratch folder of a remote domain is a path on its host and must be "
                                    "absolute (--scratch-dir)")
          .set_path(req.scratch_dir);
    }
    return OkStatus();
  }
  // The scratch root too: libvirt creates the scratch files in it and QEMU
  // opens them, so it must be a folder they see (not created here either).
  if (req.scratch_dir.empty()) req.scratch_dir = kDefaultScratchRoot;
  auto scratch_st = env.Stat(req.scratch_dir);
  if (!scratch_st.ok()) {
    if (scratch_st.error().code() != ErrorCode::kNotFound) return std::move(scratch_st).error();
    return Error::NotFound("scratch folder does not exist (--scratch-dir)").set_path(req.scratch_dir);
  }
  if (!scratch_st->is_directory()) {
    return Error::InvalidArgument("scratch path is not a folder (--scratch-dir)").set_path(req.scratch_dir);
  }
  req.scratch_dir = AbsolutePath(req.scratch_dir);
  return OkStatus();
}

// What earlier runs left: a killed run's job, socket, scratch folder and
// checkpoint go first (a job that is not barge's, or whose owner lives, is
// an error); checkpoints whose bitmaps are gone cannot be deleted normally
// and would stay forever: barge's own lose their metadata, the others are
// named. Returns the warnings.
struct Leftovers {
  std::vector<std::string> warnings;
  std::vector<std::string> kept_checkpoints;  // OrphanRecovery's
};
Result<Leftovers> ClearLeftovers(Env& env, BackupCatalog& catalog, virDomainPtr dom, const std::string& domain,
                                 bool keep_resumable) {
  Leftovers out;
  BARGE_ASSIGN_OR_RETURN(OrphanRecovery recovered,
                         RecoverOrphanedBackupJob(env, catalog, dom, domain, keep_resumable));
  if (!recovered.warning.empty()) out.warnings.push_back(std::move(recovered.warning));
  out.kept_checkpoints = std::move(recovered.kept_checkpoints);
  if (auto stale = RemoveStaleCheckpoints(catalog, dom, domain); stale.ok()) {
    out.warnings.insert(out.warnings.end(), stale->begin(), stale->end());
  } else {
    out.warnings.push_back("checkpoints whose bitmaps are gone were not looked for: " + stale.error().message());
  }
  return out;
}

// Which disks of a run resume what a killed run staged in their chain
// folders (docs/formats/resume.md, "vm backup"): the journal names a
// checkpoint of that run kept for it (`kept`), the disk holds bitmaps, the
// point is of the staged one's type and, for an incremental, over the same
// parent point, and the staged work set reads back. A pull-mode run's job
// then reads those disks incrementally from that checkpoint (which libvirt
// must still have); an offline run reads what changed since from the CBT
// overlay's bitmap of that checkpoint (present, enabled, not in use). A disk with staged data
// that cannot resume gets the reason (its data is swept, the run starts
// over for it); a journal that does not load is the pipeline's to report.
void PlanResumes(Env& env, const VmBackupRequest& req, virDomainPtr dom, const std::set<std::string>& with_bitmap,
                 const std::vector<std::string>& kept, RunPlan& plan) {
  const bool offline = plan.mode == "offline";
  for (const auto& d : plan.disks) {
    const std::string dir = req.target + "/" + req.domain + "/" + d.target;
    auto journal = pipeline::LoadResumeJournal(env, dir + "/" + std::string(pipeline::kResumeJournalName));
    if (!journal.ok() || !req.resume) continue;
    const pipeline::ResumeKey& key = journal->key;
    const bool incremental = plan.incremental.at(d.target);
    std::string why;
    if (key.checkpoint.empty()) {
      why = "the interrupted run made no checkpoint for this disk (no tracker, or no bitmap): what changed since "
            "it staged cannot be known";
    } else if (!with_bitmap.count(d.target)) {
      why = "the disk holds no bitmap: what changed since the interrupted run cannot be known";
    } else if (std::find(kept.begin(), kept.end(), key.checkpoint) == kept.end() ||
               (!offline && !LookupCheckpoint(dom, key.checkpoint).ok())) {
      // (Also gone when its bitmaps were: a stale checkpoint's metadata was
      // just removed, ClearLeftovers.)
      why = "checkpoint " + key.checkpoint + " of the interrupted run is gone: what changed since it cannot be known";
    } else if (offline) {
      // Offline, what changed since is the overlay's bitmap of that
      // checkpoint, read directly: only a cleanly stored, enabled one says.
      const formats::BitmapInfo* b = nullptr;
      for (const auto& x : plan.bitmaps[d.target]) {
        if (x.name == key.checkpoint) b = &x;
      }
      if (b == nullptr) {
        why = "bitmap " + key.checkpoint + " of the interrupted run is missing in the CBT overlay: what changed "
              "since it cannot be known";
      } else if (b->in_use) {
        why = "bitmap " + key.checkpoint + " of the interrupted run is inconsistent (in use: QEMU did not close "
              "the overlay cleanly): what changed since it cannot be known";
      } else if (!b->enabled) {
        why = "bitmap " + key.checkpoint + " of the interrupted run is disabled: what changed since it cannot be "
              "known";
      }
    }
    if (why.empty() && key.type != (incremental ? "incremental" : "full")) {
      why = "the interrupted run was a " + key.type + ", this one is a" + (incremental ? "n incremental" : " full") +
            " (" + plan.reasons.at(d.target) + ")";
    }
    if (why.empty() && incremental) {
      auto chain = pipeline::LoadChainFolder(env, dir);
      std::string parent;
      if (chain.ok() && !chain->empty()) {
        const auto& pm = chain->latest().manifest;
        parent = pm.id + ":" + pm.image_digest.ToHex();
      }
      if (parent != key.parent) why = "the chain's latest point changed since the interrupted run";
    }
    RangeList work;
    if (why.empty()) {
      auto loaded = pipeline::LoadResumeWork(env, dir + "/" + std::string(pipeline::kResumeWorkName), key.virtual_size);
      if (loaded.ok()) {
        work = std::move(loaded).value();
      } else {
        why = "its work set is unreadable (" + loaded.error().message() + ")";
      }
    }
    if (!why.empty()) {
      plan.resume_refused[d.target] = why;
      continue;
    }
    plan.resumes[d.target] = {key.checkpoint, std::move(work),
                              offline ? key.checkpoint : "qemu:dirty-bitmap:backup-" + d.target};
  }
}

// The size estimate, before anything starts.
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

// A fresh folder for a local job's socket: /tmp/barge-backup-DOMAIN-XXXXXX
// (mkdtemp: 0700, a name nobody planted), given to QEMU's user and group
// (QemuDacOwner) as libvirt runs it for `dom`; kept root's when libvirt
// names none (QEMU runs as root).
Result<std::string> MakeQemuSocketDir(Env& env, virDomainPtr dom, const std::string& domain) {
  auto dir = env.CreateTempDir("/tmp", "barge-backup-" + domain + "-");
  if (!dir.ok()) return std::move(dir).error().Wrap("create the backup job's socket folder");
  auto xml = DomainXml(dom, 0);
  const auto owner = xml.ok() ? QemuDacOwner(virDomainGetConnect(dom), *xml) : std::nullopt;
  if (owner) {
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
    // On the remote host barge cannot mkdtemp: after the domain (whose job
    // it is, for a person reading /tmp; the next run finds a killed run's
    // socket through the job record) the name carries 128 random bits, so
    // nobody there can plant or predict it (QEMU's bind refuses a name
    // that exists; it never follows one).
    cleanup.socket = "/tmp/barge-backup-" + req.domain + "-" + pipeline::NewChainId() + ".sock";
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

}  // namespace

Result<VmBackupForecast> ForecastVmBackup(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                          const std::string& domain, const TrackerRecord* tracker,
                                          const std::string& target) {
  VmBackupForecast f;
  f.mode = DomainIsActive(dom) ? "pull" : "offline";
  if (!target.empty()) {
    if (Status s = CheckTarget(env, target); !s.ok()) {
      f.refusal = s.error().ToString();
      return f;
    }
  }
  auto plan = PlanRun(env, catalog, dom, domain, tracker, {}, false, target.empty() ? "" : AbsolutePath(target));
  if (!plan.ok()) {
    f.refusal = plan.error().ToString();
    return f;
  }
  f.mode = plan->mode;
  f.disks = std::move(plan->plans);
  return f;
}

std::string MultipleTrackersMessage(const std::string& domain, const std::vector<TrackerRecord>& trackers) {
  std::string names;
  for (const TrackerRecord& t : trackers) names += (names.empty() ? "" : ", ") + t.name;
  return "domain '" + domain + "' has " + std::to_string(trackers.size()) + " trackers (" + names +
         "): name one with --tracker";
}

Result<TrackerChoice> ResolveTracker(BackupCatalog& catalog, const std::string& domain,
                                     const std::string& tracker_name) {
  TrackerChoice choice;
  if (!tracker_name.empty()) {
    BARGE_ASSIGN_OR_RETURN(choice.tracker, catalog.GetTracker(tracker_name));
    if (choice.tracker->domain != domain) {
      return Error::InvalidArgument("tracker '" + tracker_name + "' belongs to domain '" + choice.tracker->domain +
                                    "'");
    }
    return choice;
  }
  BARGE_ASSIGN_OR_RETURN(auto list, catalog.ListTrackers(domain));
  if (list.size() == 1) choice.tracker = list[0];
  if (list.size() > 1) choice.ambiguous = MultipleTrackersMessage(domain, list);
  return choice;
}

Result<VmBackupResult> RunVmBackup(Env& env, const VmBackupRequest& req_in) {
  VmBackupRequest req = req_in;
  auto t0 = std::chrono::steady_clock::now();
  std::string started = formats::NowRfc3339();
  if (req.domain.empty() || req.target.empty()) {
    return Error::InvalidArgument("vm backup needs a domain and a target");
  }
  const std::string uri_text = ResolveLibvirtUri(req.libvirt_uri);
  BARGE_ASSIGN_OR_RETURN(LibvirtUri uri, ParseLibvirtUri(uri_text));
  // A remote domain's export: over TCP with TLS, or through ssh when the
  // URI is qemu+ssh:// and no TLS is asked for. Checked before anything.
  const bool tls = uri.remote() && (!uri.ssh() || req.nbd.tls());
  if (!uri.remote() && req.nbd.tls()) {
    return Error::InvalidArgument("--tls-certificates is for a remote domain's NBD export (--connect "
                                  "qemu+tls://HOST/system); a local domain's export is a unix socket");
  }
  if (tls) {
    if (req.nbd.tls_certificates.empty()) {
      return Error::InvalidArgument(
          "a backup of a domain on " + uri.Redacted() +
          " reads its disks over NBD with TLS: give the client certificates with --tls-certificates DIR "
          "(ca-cert.pem, client-cert.pem, client-key.pem), or use a qemu+ssh:// URI to read through ssh");
    }
    if (!req.nbd.tls_psk_file.empty() || !req.nbd.tls_username.empty()) {
      return Error::InvalidArgument("libvirt's backup export uses x509 certificates (qemu.conf "
                                    "backup_tls_x509_cert_dir), not a PSK: give --tls-certificates");
    }
    // The certificates' files, checked now (missing, or a key others can read).
    if (auto checked = pipeline::NbdOptionsFor(env, NbdTcpUri(uri.host, 0), req.nbd); !checked.ok()) {
      return std::move(checked).error();
    }
  }
  BARGE_RETURN_IF_ERROR(CheckFolders(env, req, uri.remote()));

  BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env, req.catalog_path));
  BARGE_ASSIGN_OR_RETURN(auto lock, LockDomain(env, req.catalog_path, req.domain));
  BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(req.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(auto dom, LookupDomain(conn.get(), req.domain));

  BARGE_ASSIGN_OR_RETURN(TrackerChoice choice, ResolveTracker(*catalog, req.domain, req.tracker));
  if (!choice.ambiguous.empty()) return Error::InvalidArgument(choice.ambiguous);
  std::optional<TrackerRecord> tracker = std::move(choice.tracker);
  // A shut-off remote domain: started paused for the run's pull job, shut
  // off again when the run returns (after the job ended: `paused` outlives
  // `cleanup`). Nothing runs in the guest to quiesce. Started before the
  // leftovers are cleared: libvirt deletes a killed run's checkpoint (its
  // bitmaps) only from a running domain.
  std::unique_ptr<PausedStart> paused;
  if (uri.remote() && !DomainIsActive(dom.get())) {
    BARGE_ASSIGN_OR_RETURN(paused, PausedStart::Start(dom.get(), req.domain, uri.Redacted(), "read them over NBD"));
    req.skip_quiesce = true;
  }
  // A killed run's checkpoint is kept for a resume where the run can ask
  // what changed since it: a pull job (an active domain), or the bitmap in
  // a shut-off domain's CBT overlays. A shut-off domain without CBT is
  // refused (PlanRun) before its leftovers are touched: libvirt could
  // delete their metadata only, leaving bitmaps in its disks.
  bool keep_resumable = req.resume && DomainIsActive(dom.get());
  if (!DomainIsActive(dom.get())) {
    BARGE_ASSIGN_OR_RETURN(auto cbt, CbtDisksOf(*catalog, req.domain));
    if (!cbt) {
      return NotRunningWithoutCbt(req.domain);
    }
    keep_resumable = req.resume;
  }
  BARGE_ASSIGN_OR_RETURN(Leftovers leftovers,
                         ClearLeftovers(env, *catalog, dom.get(), req.domain, keep_resumable));
  std::vector<std::string> warnings = std::move(leftovers.warnings);
  if (paused) warnings.insert(warnings.begin(), paused->Warning("this backup"));
  BARGE_ASSIGN_OR_RETURN(RunPlan plan, PlanRun(env, *catalog, dom.get(), req.domain, tracker ? &*tracker : nullptr,
                                                req.disks, req.force_full, req.target));
  if (plan.mode == "offline") {
    PlanResumes(env, req, dom.get(), plan.selected, leftovers.kept_checkpoints, plan);
    auto offline = RunOfflineBackup(env, req, *catalog, dom.get(), tracker ? &*tracker : nullptr, std::move(plan),
                                    leftovers.kept_checkpoints, started, t0);
    if (offline.ok()) offline->warnings.insert(offline->warnings.begin(), warnings.begin(), warnings.end());
    return offline;
  }
  // The disks that hold the checkpoint's bitmaps (PlanRun reads the others,
  // raw without CBT, in full every time).
  std::set<std::string> with_bitmap;
  for (const auto& d : plan.disks) {
    if (CanHoldBitmap(d)) with_bitmap.insert(d.target);
  }
  PlanResumes(env, req, dom.get(), with_bitmap, leftovers.kept_checkpoints, plan);
  BARGE_RETURN_IF_ERROR(CheckFreeSpace(env, dom.get(), plan.disks, req));

  VmBackupResult res;
  res.mode = "pull";
  res.warnings = std::move(warnings);
  if (std::string note = KnownHostsNote(uri); !note.empty()) res.warnings.push_back(std::move(note));
  BARGE_ASSIGN_OR_RETURN(std::string checkpoint,
                         StartRun(req, *catalog, dom.get(), tracker ? &*tracker : nullptr, started, res));
  const int64_t record_id = res.record_id;
  // No selected disk can hold a bitmap: no checkpoint, and the tracker
  // stays where it is (its checkpoint still serves the other disks).
  if (with_bitmap.empty()) checkpoint.clear();

  Cleanup cleanup(env);
  cleanup.kept_checkpoints = leftovers.kept_checkpoints;
  cleanup.faults = req.faults;
  cleanup.dom = dom.get();
  cleanup.remote = uri.remote();
  cleanup.tls = tls;
  cleanup.tcp_host = uri.host;
  res.transport = tls ? "tls" : uri.remote() ? "ssh" : "unix";
  auto fail = [&](Error e) -> Error {
    const auto staged = StagedAt(env, req.target + "/" + req.domain, plan.disks, checkpoint);
    if (!cleanup.KeepForResume(e, staged)) cleanup.Undo(e);
    res.checkpoint = checkpoint;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BackupRecord r = ToRecord(req, res, started);
    r.error = e.ToString();
    e.Also(catalog->FailBackup(record_id, r));
    return e;
  };

  if (Status s = PrepareJob(env, req, dom.get(), checkpoint, record_id, cleanup); !s.ok()) {
    return fail(std::move(s).error());
  }
  if (Status s = BeginJob(env, req, dom.get(), plan, with_bitmap, res.parent_checkpoint, checkpoint, cleanup);
      !s.ok()) {
    return fail(std::move(s).error());
  }
  // The job's point in time is fixed once it has started. A guest that
  // cannot be thawed is not left frozen for the whole copy unnoticed.
  // (fail's cleanup tries again and says whether the guest is still frozen.)
  if (!cleanup.Thaw().empty()) {
    return fail(Error::IoError("cannot thaw domain '" + req.domain + "' once its backup job had started"));
  }
  if (!cleanup.job_started) return fail(Error::IoError("backup job did not start"));
  // A remote host's export: through ssh, with the URI's own settings.
  std::string read_socket = cleanup.socket;
  std::string read_tcp;  // NbdTcpUri of a TCP export
  if (cleanup.port_lease) {
    res.nbd_port = cleanup.port_lease->port();
    read_tcp = NbdTcpUri(uri.host, res.nbd_port);
  } else if (cleanup.remote) {
    auto forward = SshForward::Start(env, uri, cleanup.socket, req.copy.cancel);
    if (!forward.ok()) return fail(std::move(forward).error());
    cleanup.forward = std::move(forward).value();
    read_socket = cleanup.forward->local_socket();
  }

  std::optional<Error> first_error = BackupDisks(
      env, req, plan.disks, plan.incremental, plan.reasons, checkpoint, plan.identities,
      [&](const std::string& name, pipeline::BackupRequest& br) {
        if (read_tcp.empty()) {
          br.source.location = "nbd+unix:///" + name + "?socket=" + read_socket;
          br.source.nbd.connections = req.nbd.connections;
          // A cut ssh session: each reconnect waits for the forward to be
          // back (or brings a stalled one down), not knocking at a dead
          // local socket. (The forward outlives the copy: EndJob stops it.)
          if (SshForward* forward = cleanup.forward.get(); forward != nullptr) {
            br.copy.nbd_retry.restore_transport = [forward] { return forward->Restore(); };
          }
        } else {
          br.source.location = read_tcp + "/" + name;
          br.source.nbd = req.nbd;  // TLS required: a plaintext server is refused
        }
        // The point of a disk left out of the checkpoint is not at it.
        if (!with_bitmap.count(name)) br.checkpoint.clear();
        if (br.incremental) {
          br.dirty_bitmap = "qemu:dirty-bitmap:backup-" + name;
          br.since_checkpoint = res.parent_checkpoint;
        }
        // Resumable: a killed run leaves its staged data, journal and work
        // set, and its checkpoint stays (RecoverOrphanedBackupJob).
        br.resume = req.resume;
        br.keep_work = true;
        // So does a run whose connection to the export was lost for good
        // (fail: Cleanup::KeepForResume), where the checkpoint can stay.
        br.keep_staged = br.checkpoint.empty() ? pipeline::BackupRequest::KeepStaged::kNever
                                               : pipeline::BackupRequest::KeepStaged::kWhenDisconnected;
        if (auto it = plan.resumes.find(name); it != plan.resumes.end()) br.staged_earlier = it->second;
        if (auto it = plan.resume_refused.find(name); it != plan.resume_refused.end()) br.resume_refused = it->second;
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

  bool all_incremental = true;
  for (const auto& d : res.disks) all_incremental &= d.incremental;
  res.backup_type = all_incremental ? "Incremental" : "Full";
  res.reason = JoinReasons(res.disks);
  res.checkpoint = checkpoint;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::optional<CheckpointRecord> cp_record;
  std::map<std::string, uint64_t> sizes;
  if (!checkpoint.empty()) {
    auto made = NewCheckpointRecord(dom.get(), checkpoint, req.domain, res, sizes);
    if (!made.ok()) return fail(made.error());
    cp_record = std::move(made).value();
  }
  BackupRecord record = ToRecord(req, res, started);
  if (Status s = catalog->CommitBackup(record_id, record, cp_record, sizes); !s.ok()) return fail(s.error());
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
  if (!checkpoint.empty() && !res.parent_checkpoint.empty() && res.parent_checkpoint != checkpoint) {
    IgnoreError(DeleteCheckpoint(dom.get(), res.parent_checkpoint),
                "the run is committed and the tracker no longer names that checkpoint: left behind, it only "
                "costs its bitmaps' upkeep until deleted by hand ('virsh checkpoint-delete')");
  }
  // So are the killed runs' checkpoints kept for this run's resume.
  for (const auto& cp : cleanup.kept_checkpoints) {
    if (cp == checkpoint || !LookupCheckpoint(dom.get(), cp).ok()) continue;
    IgnoreError(DeleteCheckpoint(dom.get(), cp),
                "the run is committed and no tracker names that checkpoint: left behind, it only costs its "
                "bitmaps' upkeep until deleted by hand ('virsh checkpoint-delete')");
  }
  WarnOfStartingOver(res);
  return res;
}

}  // namespace barge::orchestrate
