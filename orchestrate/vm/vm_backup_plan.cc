// vm backup's planner: per disk full, incremental or resume, and why
// (PlanVmRun), asked by the run, doctor's forecast and --dry-run alike.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "blockio/path.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/vm_backup.h"
#include "orchestrate/vm/vm_backup_steps.h"
#include "orchestrate/vm/vm_dry_run.h"
#include "orchestrate/vm/vm_orphans.h"
#include "pipeline/backup_resume.h"
#include "pipeline/chain.h"
#include "pipeline/endpoints.h"
#include "pipeline/resume.h"

namespace barge::orchestrate::vm_steps {
namespace {

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

}  // namespace

// The refusal of a shut-off domain without a CBT overlay: nothing to read
// its changes from (PlanRun, and RunVmBackup before it touches leftovers).
Error NotRunningWithoutCbt(const std::string& domain) {
  return Error::InvalidArgument("domain '" + domain +
                                "' is not running and has no CBT overlay: start it for a pull-mode backup, "
                                "or enable CBT ('barge cbt enable') for offline backups");
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


namespace {

// The plan of a backup of `domain` with `tracker` (nullptr: none) of the
// disks `want` (empty: all) into `target` ("" skips the chain checks): an
// active domain (running or paused) is backed up by a pull-mode job, a
// shut-off one from its CBT overlays (refused without CBT on every selected
// disk). Per disk PlanDisks, and offline also the overlay's own bitmap: a
// disk is incremental only if its overlay holds the tracker checkpoint's
// bitmap (libvirt names a checkpoint's bitmap after the checkpoint),
// enabled and not in use.
Result<RunPlan> PlanRun(Env& env, BackupCatalog& catalog, virDomainPtr dom, const TrackerRecord* tracker,
                        const PlanInputs& in) {
  const std::string& domain = in.domain;
  const std::vector<std::string>& want = in.want;
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
                         PlanDisks(env, tracker, dom, plan.disks, plan.identities, in.force_full,
                                                   in.target, domain, in.uncommitted));
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
  for (const auto& d : plan.disks) {
    if (!active || CanHoldBitmap(d)) plan.with_bitmap.insert(d.target);
  }
  return plan;
}

// Which disks of a run resume what a killed run staged in their chain
// folders (docs/formats/resume.md, "vm backup"): the journal names a
// checkpoint of that run kept for it (`in.kept`), the disk holds bitmaps,
// the point is of the staged one's type and, for an incremental, over the
// same parent point, and the staged work set reads back. A pull-mode run's job
// then reads those disks incrementally from that checkpoint (which libvirt
// must still have); an offline run reads what changed since from the CBT
// overlay's bitmap of that checkpoint (present, enabled, not in use). A
// disk with staged data that cannot resume gets the reason (its data is
// swept, the run starts over for it; "resuming is off" without
// `in.resume`); a journal that does not load is the pipeline's to report.
void PlanResumes(Env& env, virDomainPtr dom, const PlanInputs& in, RunPlan& plan) {
  const bool offline = plan.mode == "offline";
  const std::set<std::string>& with_bitmap = plan.with_bitmap;
  const std::vector<std::string>& kept = in.kept;
  for (const auto& d : plan.disks) {
    const std::string dir = in.target + "/" + in.domain + "/" + d.target;
    const pipeline::ResumeSite site = pipeline::BackupResumeSite(dir);
    auto record = pipeline::ReadResumeRecord(env, site);
    // A journal that loaded with a work set that does not: staged data that
    // cannot resume (kCorruption "its work set is unreadable (...)").
    const bool bad_work = !record.ok() && record.error().code() == ErrorCode::kCorruption &&
                          !site.work.empty() && record.error().path() == site.work;
    if (!record.ok() && !bad_work) continue;  // nothing staged, or the pipeline's to report
    if (!in.resume) {
      plan.resume_refused[d.target] = "resuming is off";  // the pipeline's own words for it
      continue;
    }
    if (bad_work) {
      plan.resume_refused[d.target] = record.error().message();
      continue;
    }
    const pipeline::ResumeKey& key = record->journal.key;
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
    if (why.empty() && !record->work) why = "its work set is unreadable (it is missing)";
    if (!why.empty()) {
      plan.resume_refused[d.target] = why;
      continue;
    }
    plan.resumes[d.target] = {key.checkpoint, std::move(*record->work),
                              offline ? key.checkpoint : "qemu:dirty-bitmap:backup-" + d.target};
  }
}

// The plan's outcome per disk, resumes included (DiskPlan::staged).
void NoteResumes(RunPlan& plan) {
  for (auto& p : plan.plans) {
    if (auto it = plan.resumes.find(p.disk); it != plan.resumes.end()) {
      p.staged = "resume";
      p.resume_from = it->second.checkpoint;
    } else if (auto refused = plan.resume_refused.find(p.disk); refused != plan.resume_refused.end()) {
      p.staged = "start over";
      p.resume_refused = refused->second;
    }
  }
}

}  // namespace

Result<RunPlan> PlanVmRun(Env& env, BackupCatalog& catalog, virDomainPtr dom, const TrackerRecord* tracker,
                          const PlanInputs& in) {
  BARGE_ASSIGN_OR_RETURN(RunPlan plan, PlanRun(env, catalog, dom, tracker, in));
  plan.kept = in.kept;
  if (!in.target.empty()) PlanResumes(env, dom, in, plan);
  NoteResumes(plan);
  return plan;
}

}  // namespace barge::orchestrate::vm_steps

namespace barge::orchestrate {

Result<VmBackupForecast> ForecastVmBackup(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                          const VmBackupRequest& req, const TrackerRecord* tracker) {
  BARGE_ASSIGN_OR_RETURN(VmDryRun run, ForecastVmBackupRun(env, catalog, dom, req, tracker));
  return std::move(run.forecast);
}

Result<VmDryRun> ForecastVmBackupRun(Env& env, BackupCatalog& catalog, virDomainPtr dom, const VmBackupRequest& req,
                                     const TrackerRecord* tracker) {
  VmDryRun run;
  VmBackupForecast& f = run.forecast;
  f.tracker = tracker ? tracker->name : "";
  f.mode = DomainIsActive(dom) ? "pull" : "offline";
  auto refuse = [&run](const Error& e) {
    run.forecast.refusal = e.ToString();
    run.refused = e;
    return std::move(run);
  };
  vm_steps::PlanInputs in;
  in.domain = req.domain;
  in.want = req.disks;
  in.force_full = req.force_full;
  in.resume = req.resume;
  if (!req.target.empty()) {
    if (Status s = vm_steps::CheckTarget(env, req.target); !s.ok()) return refuse(s.error());
    in.target = AbsolutePath(req.target);
  }
  // What the run does first (RecoverOrphanedBackupJob, RemoveStaleCheckpoints),
  // foreseen: another live run's job refuses it; a killed run's checkpoints
  // are kept for a resume or deleted, its uncommitted points removed.
  BARGE_ASSIGN_OR_RETURN(BackupJobState job, InspectBackupJob(env, catalog.path(), dom, req.domain));
  if (job.state == "running" || job.state == "foreign") return refuse(Error::Busy(job.message));
  if (job.state == "orphaned") {
    BARGE_ASSIGN_OR_RETURN(OrphanOutlook o,
                           ForeseeOrphanRecovery(env, catalog, dom, req.domain, job.record, req.resume));
    in.kept = std::move(o.kept_checkpoints);
    in.uncommitted = std::move(o.uncommitted_checkpoint);
  }
  if (auto stale = FindStaleCheckpoints(catalog, dom, req.domain); stale.ok()) {
    for (const auto& s : *stale) {
      if (s.barges) std::erase(in.kept, s.name);
    }
  }
  auto plan = vm_steps::PlanVmRun(env, catalog, dom, tracker, in);
  if (!plan.ok()) return refuse(plan.error());
  f.mode = plan->mode;
  if (f.mode == "pull" && !in.target.empty()) {
    VmBackupRequest sized = req;
    sized.target = in.target;
    if (Status s = vm_steps::CheckFreeSpace(env, dom, plan->disks, sized); !s.ok()) return refuse(s.error());
  }
  f.disks = std::move(plan->plans);
  return run;
}

}  // namespace barge::orchestrate
