// Trackers, checkpoint redefinition, planning and the doctor.
#include "orchestrate/vm/tracker.h"

#include <algorithm>
#include <map>
#include <optional>

#include "formats/manifest.h"
#include "pipeline/chain.h"
#include "pipeline/disk_identity.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/vm/vm_backup.h"

namespace barge::orchestrate {

std::map<std::string, std::pair<std::string, std::string>> CheckpointDisks(const std::string& xml) {
  std::map<std::string, std::pair<std::string, std::string>> out;
  std::string_view disks = xml;
  size_t a = disks.find("<disks>");
  size_t b = disks.find("</disks>");
  if (a == std::string_view::npos || b == std::string_view::npos) return out;
  disks = disks.substr(a, b - a);
  size_t pos = 0;
  while ((pos = disks.find("<disk ", pos)) != std::string_view::npos) {
    size_t end = disks.find('>', pos);
    std::string_view el = disks.substr(pos, end - pos + 1);
    out[XmlAttr(el, "disk", "name")] = {XmlAttr(el, "disk", "checkpoint"), XmlAttr(el, "disk", "size")};
    pos = end;
  }
  return out;
}

std::string NewCheckpointName(const std::string& tracker) {
  return tracker + "-" + formats::CompactTimestamp(formats::NowRfc3339());
}

namespace {

// The head of a checkpoint XML: up to its <disks> or embedded <domain>
// (a domain XML may hold elements named like the checkpoint's own).
size_t CheckpointHeadEnd(const std::string& xml) {
  size_t end = xml.size();
  for (const char* tag : {"<disks", "<domain>", "<domain "}) end = std::min(end, xml.find(tag));
  return end;
}

// Redefines `xml` (the catalog's copy) in libvirt, without its parent when
// libvirt lacks that one. Returns "" or what was left out.
Result<std::string> RedefineFromXml(virDomainPtr dom, const std::string& name, const std::string& xml) {
  std::string use = xml;
  std::string note;
  std::string parent = CheckpointParent(xml);
  if (!parent.empty() && !LookupCheckpoint(dom, parent).ok()) {
    use = WithoutCheckpointParent(xml);
    note = "without its parent " + parent + ", which libvirt no longer has";
  }
  unsigned int flags = VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE;
  // libvirt validates bitmaps only in a running QEMU.
  if (DomainIsActive(dom)) flags |= VIR_DOMAIN_CHECKPOINT_CREATE_REDEFINE_VALIDATE;
  virDomainCheckpointPtr cp = virDomainCheckpointCreateXML(dom, use.c_str(), flags);
  if (cp == nullptr) return LastVirError("redefine checkpoint " + name);
  virDomainCheckpointFree(cp);
  return note;
}

}  // namespace

std::string CheckpointParent(const std::string& xml) {
  const size_t end = CheckpointHeadEnd(xml);
  size_t a = xml.find("<parent>");
  if (a == std::string::npos || a > end) return "";
  size_t b = xml.find("</parent>", a);
  if (b == std::string::npos || b > end) return "";
  return XmlText(std::string_view(xml).substr(a, b - a), "name");
}

std::string WithoutCheckpointParent(const std::string& xml) {
  const size_t end = CheckpointHeadEnd(xml);
  size_t a = xml.find("<parent>");
  if (a == std::string::npos || a > end) return xml;
  size_t b = xml.find("</parent>", a);
  if (b == std::string::npos || b > end) return xml;
  return xml.substr(0, a) + xml.substr(b + 9);
}

Status RedefineCheckpoint(BackupCatalog& catalog, virDomainPtr dom, const std::string& name) {
  auto stored = catalog.GetCheckpoint(name);
  if (!stored.ok()) {
    if (stored.error().code() != ErrorCode::kNotFound) return std::move(stored).error();
    return Error::NotFound("checkpoint " + name + " lost: the catalog has no XML to redefine it");
  }
  BARGE_ASSIGN_OR_RETURN(std::string note, RedefineFromXml(dom, name, stored->xml));
  (void)note;
  return OkStatus();
}

Result<std::vector<RedefineOutcome>> RedefineCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                         const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto trackers, catalog.ListTrackers(domain));
  std::vector<RedefineOutcome> out(trackers.size());
  // The missing ones: index into `out` -> the stored XML (nullopt: none).
  std::map<size_t, std::optional<std::string>> pending;
  for (size_t i = 0; i < trackers.size(); ++i) {
    const auto& t = trackers[i];
    out[i] = RedefineOutcome{t.name, t.latest_checkpoint, "none", ""};
    if (t.latest_checkpoint.empty()) continue;
    auto found = LookupCheckpoint(dom, t.latest_checkpoint);
    if (found.ok()) {
      out[i].action = "present";
      continue;
    }
    if (found.error().code() != ErrorCode::kNotFound) return std::move(found).error();
    auto stored = catalog.GetCheckpoint(t.latest_checkpoint);
    if (!stored.ok() && stored.error().code() != ErrorCode::kNotFound) return std::move(stored).error();
    pending[i] = stored.ok() ? std::optional<std::string>(stored->xml) : std::nullopt;
  }
  // Parents first: take a checkpoint whose parent is not itself waiting.
  while (!pending.empty()) {
    auto next = pending.begin();
    for (auto it = pending.begin(); it != pending.end(); ++it) {
      const std::string parent = it->second ? CheckpointParent(*it->second) : "";
      bool parent_waits = false;
      for (const auto& [j, xml] : pending) parent_waits |= j != it->first && out[j].checkpoint == parent;
      if (!parent_waits) {
        next = it;
        break;
      }
    }
    RedefineOutcome& o = out[next->first];
    if (!next->second) {
      o.action = "failed";
      o.reason = "checkpoint lost: the catalog has no XML to redefine it";
    } else if (auto note = RedefineFromXml(dom, o.checkpoint, *next->second); note.ok()) {
      o.action = "redefined";
      o.reason = *note;
    } else {
      o.action = "failed";
      o.reason = note.error().message();
    }
    pending.erase(next);
  }
  return out;
}

namespace {

// Why `now` cannot extend `chain` ("" = it is the chain's disk): for a
// domain disk whose file behind the target changed (swapped disks), in
// those words; else OtherDiskReason's sentence.
Result<std::string> OtherDiskFullReason(const pipeline::ChainFolder& chain, const formats::DiskIdentity& now) {
  BARGE_ASSIGN_OR_RETURN(std::string other, pipeline::OtherDiskReason(chain, now));
  if (other.empty()) return other;
  const formats::BackupManifest& latest = chain.latest().manifest;
  if (latest.disk_identity && !latest.disk_identity->source.empty() && !now.source.empty() &&
      latest.disk_identity->source != now.source) {
    return "disk " + now.target + " is now " + now.source + ", was " + latest.disk_identity->source + " (backup " +
           latest.id + "): a new chain starts";
  }
  return other + ": a new chain starts";
}

}  // namespace

Result<std::vector<DiskPlan>> PlanDisks(Env& env, const TrackerRecord* tracker, virDomainPtr dom,
                                        const std::vector<DomainDisk>& disks,
                                        const std::map<std::string, formats::DiskIdentity>& identities,
                                        bool force_full, const std::string& target_dir, const std::string& domain,
                                        const std::string& uncommitted) {
  std::vector<DiskPlan> plans;
  auto all_full = [&](const std::string& reason) {
    for (const auto& d : disks) plans.push_back({d.target, false, reason});
    return plans;
  };
  if (tracker == nullptr) return all_full("no tracker");
  if (force_full) return all_full("--force-full");
  if (tracker->needs_full) {
    return all_full(tracker->needs_full_reason.empty() ? "tracker needs full" : tracker->needs_full_reason);
  }
  if (tracker->latest_checkpoint.empty()) return all_full("tracker empty");
  // The checkpoint's bitmaps are on the host it was made on: a backup
  // through another host's libvirt (a domain that moved) starts a new chain.
  if (const std::string here = ConnectionUri(dom); LibvirtHostKey(here) != LibvirtHostKey(tracker->host)) {
    auto where = [](const std::string& uri) {
      const std::string key = LibvirtHostKey(uri);
      return key.empty() ? std::string("this machine") : "host " + key;
    };
    return all_full("checkpoint " + tracker->latest_checkpoint + " of tracker " + tracker->name + " is on " +
                    where(tracker->host) + ", this backup connects to " + where(here));
  }
  auto cp = LookupCheckpoint(dom, tracker->latest_checkpoint);
  if (!cp.ok()) {
    if (cp.error().code() == ErrorCode::kNotFound) {
      return all_full("checkpoint " + tracker->latest_checkpoint + " missing in libvirt ('barge checkpoint redefine "
                      "--domain " + domain + "' redefines it from the catalog)");
    }
    return cp.error();
  }
  bool running = DomainIsActive(dom);
  BARGE_ASSIGN_OR_RETURN(std::string xml,
                         CheckpointXml(cp->get(), running ? VIR_DOMAIN_CHECKPOINT_XML_SIZE : 0));
  auto cp_disks = CheckpointDisks(xml);
  for (const auto& d : disks) {
    DiskPlan p{d.target, false, ""};
    auto it = cp_disks.find(d.target);
    auto known = tracker->disks.find(d.target);
    if (it == cp_disks.end() || it->second.first != "bitmap" || known == tracker->disks.end()) {
      p.reason = "disk not in checkpoint " + tracker->latest_checkpoint;
    } else if (running && it->second.second.empty()) {
      // libvirt computes a size only from a usable bitmap. One missing in
      // QEMU is inconsistent too: a checkpoint's bitmap reaches the image
      // only when QEMU closes it, so a crash loses it as often as it leaves
      // it marked in use, and QEMU cannot tell which.
      p.reason = "bitmap inconsistent";
    } else {
      auto cap = DiskCapacity(dom, d.target);
      if (!cap.ok()) return cap.error();
      if (*cap != known->second) {
        p.reason = "disk size changed";
      } else if (!target_dir.empty()) {
        std::string chain_dir = target_dir + "/" + domain + "/" + d.target;
        auto chain = pipeline::LoadChainFolder(env, chain_dir);
        // A killed run's point, removed before this run plans
        // (RecoverOrphanedBackupJob): planned as if gone already.
        if (chain.ok() && !chain->empty() && !uncommitted.empty() &&
            chain->latest().manifest.checkpoint == uncommitted) {
          chain->points.pop_back();
        }
        if (!chain.ok() || chain->empty()) {
          p.reason = "no backup chain in the target";
        } else if (chain->latest().manifest.checkpoint != tracker->latest_checkpoint) {
          p.reason = "chain does not end at checkpoint " + tracker->latest_checkpoint;
        } else {
          // A chain whose parent links are broken is left to the backup
          // pipeline, which refuses to extend it.
          auto id = identities.find(d.target);
          auto other = id == identities.end() ? Result<std::string>(std::string())
                                              : OtherDiskFullReason(*chain, id->second);
          if (other.ok() && !other->empty()) {
            p.reason = std::move(*other);
          } else {
            p.incremental = true;
            p.reason = "incremental since " + tracker->latest_checkpoint;
          }
        }
      } else {
        p.incremental = true;
        p.reason = "incremental since " + tracker->latest_checkpoint;
      }
    }
    plans.push_back(std::move(p));
  }
  return plans;
}

Result<DoctorReport> Diagnose(BackupCatalog& catalog, virDomainPtr dom, const std::string& domain,
                              const std::string& target, const std::string& tracker) {
  DoctorReport r;
  r.domain = domain;
  int state = VIR_DOMAIN_NOSTATE;
  if (virDomainGetState(dom, &state, nullptr, 0) < 0) return LastVirError("state of domain '" + domain + "'");
  r.state = DomainStateName(state);
  r.running = state == VIR_DOMAIN_RUNNING;
  const bool active = DomainIsActive(dom);  // running or paused: QEMU has the bitmaps
  BARGE_ASSIGN_OR_RETURN(r.trackers, catalog.ListTrackers(domain));
  BARGE_ASSIGN_OR_RETURN(r.libvirt_checkpoints, ListCheckpointNames(dom));
  for (const auto& t : r.trackers) {
    if (t.latest_checkpoint.empty()) continue;
    CheckpointState s;
    s.name = t.latest_checkpoint;
    auto cp = LookupCheckpoint(dom, t.latest_checkpoint);
    s.in_libvirt = cp.ok();
    if (cp.ok()) {
      auto xml = CheckpointXml(cp->get(), active ? VIR_DOMAIN_CHECKPOINT_XML_SIZE : 0);
      if (xml.ok()) {
        for (const auto& [disk, v] : CheckpointDisks(*xml)) {
          std::string flag = v.first;
          if (flag == "bitmap" && active) {
            flag = v.second.empty() ? "bitmap (no size: missing or inconsistent)"
                                    : "bitmap (consistent, " + v.second + " bytes dirty)";
          }
          s.disks.emplace_back(disk, flag);
        }
      }
    }
    r.tracker_checkpoints.push_back(std::move(s));
  }
  BARGE_ASSIGN_OR_RETURN(TrackerChoice choice, ResolveTracker(catalog, domain, tracker));
  if (!choice.ambiguous.empty()) {
    r.next_mode = DomainIsActive(dom) ? "pull" : "offline";
    r.next_refusal = choice.ambiguous;
    return r;
  }
  const TrackerRecord* t = choice.tracker ? &*choice.tracker : nullptr;
  if (t) r.next_tracker = t->name;
  VmBackupRequest req;
  req.domain = domain;
  req.target = target;
  BARGE_ASSIGN_OR_RETURN(VmBackupForecast f, ForecastVmBackup(catalog.env(), catalog, dom, req, t));
  r.next_backup = std::move(f.disks);
  r.next_mode = std::move(f.mode);
  r.next_refusal = std::move(f.refusal);
  return r;
}

}  // namespace barge::orchestrate
