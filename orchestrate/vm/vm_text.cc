#include "orchestrate/vm/vm_text.h"

#include <sstream>

#include "formats/units.h"

namespace barge::orchestrate {

using formats::HumanBytes;
using formats::HumanSeconds;

std::string DiskPlanText(const DiskPlan& p) {
  std::string o = "  " + p.disk + ": " + (p.incremental ? "incremental" : "full") + " (" + p.reason + ")";
  if (p.staged == "resume") o += ", resumes the data staged by an interrupted run (checkpoint " + p.resume_from + ")";
  if (p.staged == "start over") o += ", starts over: staged data not reusable: " + p.resume_refused;
  return o + "\n";
}

std::string DoctorText(const DoctorReport& r, const BackupJobState& job, const std::vector<StaleCheckpoint>& stale) {
  std::ostringstream o;
  o << "domain " << r.domain << " (" << r.state << ")\n";
  for (const auto& t : r.trackers) {
    o << "tracker " << t.name << ": checkpoint " << (t.latest_checkpoint.empty() ? "(none)" : t.latest_checkpoint)
      << (t.needs_full ? ", needs full: " + t.needs_full_reason : "") << "\n";
  }
  o << "libvirt checkpoints:";
  for (const auto& n : r.libvirt_checkpoints) o << " " << n;
  o << (r.libvirt_checkpoints.empty() ? " (none)\n" : "\n");
  for (const auto& c : r.tracker_checkpoints) {
    o << "checkpoint " << c.name << ": " << (c.in_libvirt ? "in libvirt" : "MISSING in libvirt") << "\n";
    for (const auto& [d, f] : c.disks) o << "  " << d << ": " << f << "\n";
  }
  if (job.state != "none") o << "backup job: " << job.state << ": " << job.message << "\n";
  for (const auto& c : stale) {
    o << "checkpoint " << c.name << ": STALE, its bitmaps are gone ("
      << (c.barges ? "barge's: the next vm backup removes it"
                   : "not barge's: 'virsh checkpoint-delete " + r.domain + " " + c.name + " --metadata'")
      << ")\n";
  }
  o << "next backup" << (r.next_tracker.empty() ? "" : " (tracker " + r.next_tracker + ")") << ", "
    << (r.next_mode == "pull" ? "pull mode" : "offline, from the CBT overlays")
    << (r.next_refusal.empty() ? "" : ": refused: " + r.next_refusal) << ":\n";
  for (const auto& p : r.next_backup) o << DiskPlanText(p);
  return o.str();
}

std::string VmBackupPlanText(const std::string& domain, const VmBackupForecast& f) {
  // A refusal found before the mode is known (a missing target) names none.
  const std::string mode = f.mode == "pull"      ? ", pull mode"
                           : f.mode == "offline" ? ", offline, from the CBT overlays"
                                                 : "";
  std::string o = "vm backup of " + domain + " (dry run)" + (f.tracker.empty() ? "" : ", tracker " + f.tracker) +
                  mode + (f.refusal.empty() ? "" : ": refused: " + f.refusal) + (f.disks.empty() ? "\n" : ":\n");
  for (const auto& p : f.disks) o += DiskPlanText(p);
  return o;
}

std::string VmBackupResultText(const std::string& domain, const VmBackupResult& r) {
  std::ostringstream o;
  o << r.backup_type << " backup of " << domain << " (" << r.reason << ")\n"
    << "  checkpoint: " << (r.checkpoint.empty() ? "(none, no tracker)" : r.checkpoint) << "\n";
  for (const auto& d : r.disks) {
    o << "  " << d.disk << ": " << (d.incremental ? "incremental" : "full") << ", read " << HumanBytes(d.bytes_read)
      << ", wrote " << HumanBytes(d.bytes_written) << " -> " << d.image_path << "\n";
    if (d.resume && d.resume->resumed) {
      o << "    resumed from " << HumanBytes(d.resume->staged_bytes) << " staged by an interrupted run"
        << (d.resume->problem.empty() ? "" : "; copied again from " + d.resume->problem) << "\n";
    }
  }
  o << "  duration: " << HumanSeconds(r.seconds) << "\n";
  return o.str();
}

std::string TrackerLine(const TrackerRecord& t) {
  return t.name + "\t" + t.domain + "\t" + (t.latest_checkpoint.empty() ? "-" : t.latest_checkpoint) +
         (t.needs_full ? "\tneeds full: " + t.needs_full_reason : "") + "\n";
}

std::string TrackerText(const TrackerRecord& t) {
  std::ostringstream o;
  o << "tracker:           " << t.name << "\ndomain:            " << t.domain << "\ncreated:           "
    << t.created_at << "\nlatest checkpoint: "
    << (t.latest_checkpoint.empty() ? "(none)" : t.latest_checkpoint + " at " + t.checkpoint_created_at)
    << (t.latest_checkpoint.empty() || t.host.empty() ? "" : " on " + t.host) << "\n";
  for (const auto& [d, size] : t.disks) o << "  disk " << d << ": " << HumanBytes(size) << "\n";
  if (t.needs_full) o << "next backup:       full (" << t.needs_full_reason << ")\n";
  return o.str();
}

std::string RedefineText(const std::vector<RedefineOutcome>& outcomes) {
  std::string text;
  for (const auto& o : outcomes) {
    const bool failed = o.action == "failed";
    text += o.tracker + ": " + (o.checkpoint.empty() ? "(no checkpoint)" : o.checkpoint) + " " + o.action +
            (o.reason.empty() ? "" : " (" + o.reason + (failed ? "; its next backup is full" : "") + ")") + "\n";
  }
  return text;
}

std::string RedefineFailures(const std::vector<RedefineOutcome>& outcomes) {
  std::string failures;
  for (const auto& o : outcomes) {
    if (o.action != "failed") continue;
    failures += (failures.empty() ? "" : "; ") + o.tracker + " " + o.checkpoint + ": " + o.reason;
  }
  return failures;
}

std::string CbtStatusText(const CbtStatus& s) {
  std::string o = "CBT for " + s.domain + ": " + s.state + (s.host.empty() ? "" : " on " + s.host) + "\n";
  for (const auto& d : s.disks) o += "  " + d.disk + ": " + d.overlay + " over " + d.data_file + "\n";
  return o;
}

std::string InstantRestoreText(const std::string& domain, const InstantRestoreResult& r) {
  if (r.abandoned) {
    return "abandoned the instant restore of " + domain + ": " + r.target +
           " is back on its original disk; the overlay and " + r.disk + " are removed\n";
  }
  return "domain " + domain + " runs on " + r.disk + " (" + r.target + ", point " + r.point_id + "; " +
         HumanBytes(r.verified_bytes) + " verified, " + HumanBytes(r.guest_written_bytes) +
         " written by the guest meanwhile) after " + HumanSeconds(r.seconds) + "\n";
}

}  // namespace barge::orchestrate
