// vm backup of a shut-off domain with CBT overlays: each disk read from
// its overlay, the checkpoint's bitmaps edited in the overlays directly and
// its metadata defined in libvirt afterwards.
#include <algorithm>
#include <ctime>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "blockio/path.h"
#include "formats/qcow2_bitmap_edit.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/vm/vm_backup_steps.h"
#include "orchestrate/vm/vm_orphans.h"
#include "pipeline/endpoints.h"

namespace barge::orchestrate::vm_steps {
namespace {

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

// Everything an offline run must undo on failure: the new checkpoint's
// bitmaps (`added`: the disks whose overlay got one) and those of the
// killed runs it resumed from (`kept`), its definition in libvirt
// (`defined`), the new backup files and the run record.
struct OfflineUndo {
  const RunContext& ctx;
  const RunPlan& plan;
  std::string checkpoint;
  std::set<std::string> added;
  bool defined = false;
  std::string job_record;
  std::vector<std::string> new_files;

  bool IsKept(const std::string& name) const {
    return std::find(plan.kept.begin(), plan.kept.end(), name) != plan.kept.end();
  }
  // Nothing of the run is left: its checkpoint's bitmaps, nor the killed
  // runs' checkpoints it resumed from (their staged data went with the
  // failed copy; the tracker's checkpoint still holds every write). A
  // domain started meanwhile has the overlays open: what is left there is
  // removed by the next offline backup (strays).
  void Undo(Error& e) {
    Env& env = ctx.env;
    for (const auto& f : new_files) e.Also(env.UnlinkIfExists(f));
    if (!DomainIsActive(ctx.dom)) {
      for (const auto& d : plan.disks) {
        auto now = OverlayBitmaps(env, plan.overlay_of.at(d.target));
        if (!now.ok()) {
          e.Also(Status(now.error()));
          continue;
        }
        formats::BitmapEdit edit;
        for (const auto& b : *now) {
          if ((added.count(d.target) && b.name == checkpoint) || IsKept(b.name)) edit.remove.push_back(b.name);
        }
        if (!edit.remove.empty()) e.Also(EditOverlayBitmaps(env, plan.overlay_of.at(d.target), edit));
      }
    }
    if (defined) e.Also(DeleteCheckpoint(ctx.dom, checkpoint, /*metadata_only=*/true));
    for (const auto& cp : plan.kept) {
      if (LookupCheckpoint(ctx.dom, cp).ok()) e.Also(DeleteCheckpoint(ctx.dom, cp, /*metadata_only=*/true));
    }
    if (!job_record.empty()) e.Also(env.UnlinkIfExists(job_record));
  }
};

// The run record, before anything changes in the overlays (no job: it says
// to the next run what a killed run left).
Status WriteOfflineRecord(const RunContext& ctx, int64_t record_id, OfflineUndo& undo) {
  const std::string path = BackupJobRecordPath(ctx.req.catalog_path, ctx.req.domain);
  BackupJobRecord job{ProcessOwner::Self(ctx.env).Encode(), "", "", undo.checkpoint,
                      ctx.req.target + "/" + ctx.req.domain, record_id, "", JoinNames(undo.plan.kept), false};
  if (Status s = WriteBackupJobRecord(ctx.env, path, job); !s.ok()) {
    return std::move(s).error().Wrap("write the backup run's record");
  }
  undo.job_record = path;
  return OkStatus();
}

// Each overlay gets the new checkpoint's bitmap (enabled, empty: it records
// any write from now on, so that a killed run can be resumed from it) and
// loses the bitmaps nothing can use (left in use by a killed QEMU, or
// barge's strays).
Status AddCheckpointBitmaps(const RunContext& ctx, const std::string& parent_checkpoint, OfflineUndo& undo) {
  const RunPlan& plan = undo.plan;
  BARGE_ASSIGN_OR_RETURN(auto trackers, ctx.catalog.ListTrackers(ctx.req.domain));
  BARGE_ASSIGN_OR_RETURN(auto known, ListCheckpointNames(ctx.dom));
  for (const auto& d : plan.disks) {
    formats::BitmapEdit edit;
    uint32_t granularity = 64 << 10;
    const auto& bitmaps = plan.bitmaps.at(d.target);
    for (const auto& b : bitmaps) {
      if (b.name == parent_checkpoint || b.name == kCbtBitmapName) granularity = b.granularity_bytes;
    }
    for (const auto& b : bitmaps) {
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
      } else if (IsTrackersCheckpointName(b.name, trackers) && !undo.IsKept(b.name) &&
                 std::find(known.begin(), known.end(), b.name) == known.end()) {
        // A stray: the bitmap of a checkpoint libvirt does not know that
        // no run resumes from (a killed offline run's, or a killed pull
        // run's whose metadata alone could be deleted).
        edit.remove.push_back(b.name);
      }
    }
    edit.add.push_back(formats::BitmapSpec{undo.checkpoint, granularity, true, {}});
    if (Status s = EditOverlayBitmaps(ctx.env, plan.overlay_of.at(d.target), edit); !s.ok()) {
      return std::move(s).error().Wrap("add the new checkpoint's bitmap to the CBT overlay of disk " + d.target);
    }
    undo.added.insert(d.target);
  }
  return OkStatus();
}

// Disk `name`'s part of its backup request offline: its overlay (the raw
// disk through the overlay's data file), incremental from the tracker's
// checkpoint bitmap read directly from the overlay. A failure keeps
// nothing: a file source is not a connection to lose.
void SetOfflineSource(const RunContext& ctx, const RunPlan& plan, const std::string& name,
                      pipeline::BackupRequest& br) {
  const CbtDisk& c = plan.overlay_of.at(name);
  br.source.location = c.overlay;
  br.source.format = "qcow2";
  br.source.allow_dirs = {DirName(c.data_file)};
  if (br.incremental) {
    br.dirty_bitmap = ctx.tracker->latest_checkpoint;
    br.since_checkpoint = ctx.tracker->latest_checkpoint;
  }
  br.keep_staged = pipeline::BackupRequest::KeepStaged::kNever;
}

// Rotate: the new checkpoint's bitmap (added before the reads) replaces the
// old one and those of the killed runs this run resumed from; then libvirt
// gets the new checkpoint's metadata, and the old one's goes (libvirt
// deletes bitmaps only from a running domain, so of these only the
// metadata goes).
Status RotateAndDefine(const RunContext& ctx, const std::string& parent_checkpoint, OfflineUndo& undo) {
  const RunPlan& plan = undo.plan;
  const std::string& checkpoint = undo.checkpoint;
  for (const auto& d : plan.disks) {
    auto now = OverlayBitmaps(ctx.env, plan.overlay_of.at(d.target));
    if (!now.ok()) return std::move(now).error().Wrap("rotate the CBT bitmap of disk " + d.target);
    formats::BitmapEdit edit;
    for (const auto& b : *now) {
      if (b.name != checkpoint && (b.name == parent_checkpoint || undo.IsKept(b.name))) {
        edit.remove.push_back(b.name);
      }
    }
    if (edit.remove.empty()) continue;
    if (Status s = EditOverlayBitmaps(ctx.env, plan.overlay_of.at(d.target), edit); !s.ok()) {
      return std::move(s).error().Wrap("rotate the CBT bitmap of disk " + d.target);
    }
  }
  BARGE_ASSIGN_OR_RETURN(std::string domain_xml, DomainXml(ctx.dom, VIR_DOMAIN_XML_INACTIVE));
  std::string xml = OfflineCheckpointXml(checkpoint, plan.all_disks, plan.selected, domain_xml);
  virDomainCheckpointPtr cp =
      virDomainCheckpointCreateXML(ctx.dom, xml.c_str(), VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE);
  if (cp == nullptr) return LastVirError("define checkpoint " + checkpoint);
  virDomainCheckpointFree(cp);
  undo.defined = true;
  if (!parent_checkpoint.empty()) {
    IgnoreError(DeleteCheckpoint(ctx.dom, parent_checkpoint, true),
                "metadata of a checkpoint whose bitmaps are gone: the tracker moves on to the new one and "
                "never plans from it again; failing here would lose a backup that is complete");
  }
  return OkStatus();
}

}  // namespace

// A shut-off domain with CBT overlays: first each overlay gets the new
// checkpoint's bitmap (enabled, empty: it records any write from now on, so
// that a killed run can be resumed from it) and loses the bitmaps nothing
// can use (left in use by a killed QEMU, or barge's strays); then every
// disk is read from its overlay (the raw disk through the overlay's data
// file), incremental from the tracker's checkpoint bitmap read directly
// from the overlay, resuming what a killed run staged (plan.kept: the
// checkpoints kept for it, plan.resumes); then the old checkpoint's bitmap
// (and the kept ones) are removed and libvirt gets the new checkpoint's
// metadata. A failure removes the new bitmap again; one during the commit's
// edit leaves a disk whose old bitmap is gone, so its next backup is full
// (never an incremental that misses writes). A run record
// (BackupJobRecord, no job) says to the next run what a killed run left.
Result<VmBackupResult> RunOfflineBackup(const RunContext& ctx, RunPlan plan) {
  const VmBackupRequest& req = ctx.req;
  VmBackupResult res;
  res.mode = "offline";
  BARGE_ASSIGN_OR_RETURN(std::string checkpoint, StartRun(ctx, res));
  OfflineUndo undo{ctx, plan, checkpoint};
  auto fail = [&](Error e) -> Error {
    undo.Undo(e);
    RecordFailure(ctx, checkpoint, res, e);
    return e;
  };

  // Prepare: the run record, then the new checkpoint's bitmaps.
  if (Status s = WriteOfflineRecord(ctx, res.record_id, undo); !s.ok()) return fail(std::move(s).error());
  if (!checkpoint.empty()) {
    if (Status s = AddCheckpointBitmaps(ctx, res.parent_checkpoint, undo); !s.ok()) return fail(s.error());
  }

  // Copy each disk from its overlay.
  std::optional<Error> first_error = CopyDisks(
      ctx, plan, checkpoint,
      [&](const std::string& name, pipeline::BackupRequest& br) { SetOfflineSource(ctx, plan, name, br); }, res,
      undo.new_files);
  if (!first_error && DomainIsActive(ctx.dom)) {
    first_error = Error::InvalidArgument("domain '" + req.domain +
                                         "' was started during its offline backup; the backup is discarded");
  }
  if (!first_error) {
    if (Status injected = InjectedFault(req, VmBackupFaults::Point::kAfterRead); !injected.ok()) {
      first_error = std::move(injected).error();
    }
  }
  if (first_error) return fail(*first_error);

  // Commit, then clean up.
  SumUp(ctx, checkpoint, res);
  if (!checkpoint.empty()) {
    if (Status s = RotateAndDefine(ctx, res.parent_checkpoint, undo); !s.ok()) return fail(s.error());
  }
  if (Status s = CommitRun(ctx, checkpoint, res); !s.ok()) return fail(s.error());
  DropKeptCheckpoints(ctx.dom, plan.kept, checkpoint, /*metadata_only=*/true);
  IgnoreError(ctx.env.UnlinkIfExists(std::exchange(undo.job_record, "")),
              "the run is committed: a run record left behind names a gone process and a checkpoint the tracker "
              "names, so the next run only removes the record");
  WarnOfStartingOver(res);
  return res;
}

}  // namespace barge::orchestrate::vm_steps
