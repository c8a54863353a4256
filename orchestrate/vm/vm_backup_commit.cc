// vm backup's copy and commit steps, the same for a pull job and an
// offline run: each disk through the pipeline's backup job, then the
// catalog's records, the tracker and the checkpoints.
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "blockio/thread.h"
#include "formats/manifest.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/vm_backup_steps.h"

namespace barge::orchestrate::vm_steps {
namespace {

// The run's reason: its disks' one reason, or each disk's.
std::string JoinReasons(const std::vector<VmBackupDisk>& disks) {
  std::set<std::string> distinct;
  for (const auto& d : disks) distinct.insert(d.reason);
  if (distinct.size() == 1) return *distinct.begin();
  std::string out;
  for (const auto& d : disks) out += (out.empty() ? "" : "; ") + d.disk + ": " + d.reason;
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

}  // namespace

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

Status InjectedFault(const VmBackupRequest& req, VmBackupFaults::Point point) {
  return req.faults != nullptr ? req.faults->At(point) : OkStatus();
}

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

Result<std::string> StartRun(const RunContext& ctx, VmBackupResult& res) {
  const TrackerRecord* tracker = ctx.tracker;
  res.tracker = tracker ? tracker->name : "";
  res.parent_checkpoint = tracker ? tracker->latest_checkpoint : "";
  std::string checkpoint;
  if (tracker) {
    checkpoint = NewCheckpointName(tracker->name);
    // Names have one-second resolution: wait out a same-second predecessor.
    for (int i = 0; i < 3 && LookupCheckpoint(ctx.dom, checkpoint).ok(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1100));
      checkpoint = NewCheckpointName(tracker->name);
    }
  }
  BackupRecord pending;
  pending.domain = ctx.req.domain;
  pending.target = ctx.req.target;
  pending.started_at = ctx.started;
  BARGE_ASSIGN_OR_RETURN(res.record_id, ctx.catalog.BeginBackup(pending));
  return checkpoint;
}

std::optional<Error> CopyDisks(const RunContext& ctx, const RunPlan& plan, const std::string& checkpoint,
                               const std::function<void(const std::string& disk, pipeline::BackupRequest&)>& set_source,
                               VmBackupResult& res, std::vector<std::string>& new_files) {
  Env& env = ctx.env;
  const VmBackupRequest& req = ctx.req;
  const std::vector<DomainDisk>& disks = plan.disks;
  const std::map<std::string, bool>& incremental = plan.incremental;
  const std::map<std::string, std::string>& reasons = plan.reasons;
  const std::map<std::string, formats::DiskIdentity>& identities = plan.identities;
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
      // Resumable: a killed run leaves its staged data, journal and work
      // set, and its checkpoint stays (RecoverOrphanedBackupJob); the
      // plan says which disks resume what it staged.
      br.resume = req.resume;
      br.keep_work = true;
      if (auto it = plan.resumes.find(name); it != plan.resumes.end()) br.staged_earlier = it->second;
      if (auto it = plan.resume_refused.find(name); it != plan.resume_refused.end()) br.resume_refused = it->second;
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


void SumUp(const RunContext& ctx, const std::string& checkpoint, VmBackupResult& res) {
  bool all_incremental = true;
  for (const auto& d : res.disks) all_incremental &= d.incremental;
  res.backup_type = all_incremental ? "Incremental" : "Full";
  res.reason = JoinReasons(res.disks);
  res.checkpoint = checkpoint;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.t0).count();
}

Status CommitRun(const RunContext& ctx, const std::string& checkpoint, VmBackupResult& res) {
  std::optional<CheckpointRecord> cp_record;
  std::map<std::string, uint64_t> sizes;
  if (!checkpoint.empty()) {
    BARGE_ASSIGN_OR_RETURN(cp_record, NewCheckpointRecord(ctx.dom, checkpoint, ctx.req.domain, res, sizes));
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.t0).count();
  BackupRecord record = ToRecord(ctx.req, res, ctx.started);
  return ctx.catalog.CommitBackup(res.record_id, record, cp_record, sizes);
}

void RecordFailure(const RunContext& ctx, const std::string& checkpoint, VmBackupResult& res, Error& e) {
  res.checkpoint = checkpoint;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.t0).count();
  BackupRecord r = ToRecord(ctx.req, res, ctx.started);
  r.error = e.ToString();
  e.Also(ctx.catalog.FailBackup(res.record_id, r));
}

void DropKeptCheckpoints(virDomainPtr dom, const std::vector<std::string>& kept, const std::string& checkpoint,
                         bool metadata_only) {
  for (const auto& cp : kept) {
    if (cp == checkpoint || !LookupCheckpoint(dom, cp).ok()) continue;
    IgnoreError(DeleteCheckpoint(dom, cp, metadata_only),
                metadata_only ? "metadata of a checkpoint whose bitmaps are gone, which no tracker names: left "
                                "behind, the next online backup removes it as stale"
                              : "the run is committed and no tracker names that checkpoint: left behind, it only "
                                "costs its bitmaps' upkeep until deleted by hand ('virsh checkpoint-delete')");
  }
}

}  // namespace barge::orchestrate::vm_steps
