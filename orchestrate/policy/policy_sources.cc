// The default SourceBackend (images, NBD exports, domains), the scan of a
// source's points on the policy's targets, and carrying out retention
// plans (orchestrate/policy/policy_runner.h).
#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "blockio/path.h"
#include "formats/image.h"
#include "formats/qcow2_bitmap_edit.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/policy/policy_runner.h"
#include "orchestrate/state/state_migrate.h"
#include "orchestrate/schedule/time_text.h"
#include "orchestrate/vm/vm_backup.h"
#include "pipeline/backup.h"
#include "pipeline/base_refs.h"
#include "pipeline/small_file.h"
#include "pipeline/chain.h"
#include "pipeline/disk_identity.h"
#include "pipeline/endpoints.h"
#include "pipeline/export_lock.h"
#include "pipeline/merge.h"
#include "pipeline/object_lock.h"

namespace barge::orchestrate {

namespace {

// An image source's header (bitmaps, data file) as the policy code reads
// it: no backing or data file opened, and none allowed outside the image's
// folder (as Backup opens it).
Result<std::unique_ptr<formats::Image>> OpenImageHeader(Env& env, const std::string& path) {
  formats::OpenOptions o;
  o.open_backing = false;
  o.open_data_file = false;
  o.allowed_dirs = {DirName(path)};
  return formats::OpenImage(path, [&env](const std::string& p) { return env.OpenSource(p); }, o);
}

std::string Stem(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

class DefaultBackend final : public SourceBackend {
 public:
  explicit DefaultBackend(Env& env) : env_(env) {}

  Result<uint64_t> AllocatedBytes(const PolicySource& s) override {
    switch (s.kind) {
      case PolicySourceKind::kImage: {
        BARGE_ASSIGN_OR_RETURN(FileStat st, env_.Stat(s.location));
        if (!st.is_block_device()) return st.allocated_bytes + DataFileBytes(s.location);
        [[fallthrough]];
      }
      case PolicySourceKind::kNbd: {
        pipeline::SourceSpec spec;
        spec.location = s.location;
        spec.nbd.connections = 1;
        BARGE_ASSIGN_OR_RETURN(auto opened, pipeline::OpenSource(env_, spec));
        return opened.image->size_bytes();
      }
      case PolicySourceKind::kDomain: {
        BARGE_ASSIGN_OR_RETURN(auto conn, ConnectLibvirt(s.connect));
        BARGE_ASSIGN_OR_RETURN(auto dom, LookupDomain(conn.get(), s.location));
        BARGE_ASSIGN_OR_RETURN(auto disks, DomainDisks(dom.get()));
        uint64_t total = 0;
        for (const auto& d : disks) {
          BARGE_ASSIGN_OR_RETURN(uint64_t a, DiskAllocation(dom.get(), d.target));
          total += a;
        }
        return total;
      }
    }
    return Error::Internal("unknown source kind");
  }

  Result<std::optional<formats::DiskIdentity>> IdentifyDisk(const PolicySource& s) override {
    if (!s.disk_id.empty() && s.kind != PolicySourceKind::kDomain) {
      // A named disk is its name: its image or export is not opened here.
      return std::optional<formats::DiskIdentity>(pipeline::NamedIdentity(s.disk_id, 0));
    }
    if (s.kind != PolicySourceKind::kImage) return std::optional<formats::DiskIdentity>();
    pipeline::SourceSpec spec;
    spec.location = s.location;
    spec.allow_dirs = {DirName(s.location)};  // as Backup opens it
    BARGE_ASSIGN_OR_RETURN(formats::DiskIdentity id, pipeline::IdentifySource(env_, spec));
    if (id.kind == "file" || id.kind == "block") id.moved_from = FollowStateMigrations(env_)(id.location);
    return std::optional<formats::DiskIdentity>(std::move(id));
  }

  Result<std::string> IncrementalBlocker(const PolicySource& s, const std::string& chain_latest,
                                         const std::string& last_cleared) override {
    if (s.kind != PolicySourceKind::kImage) return std::string();  // domains: the tracker decides
    if (s.bitmap.empty()) return std::string();  // digests: the chain itself is compared
    BARGE_ASSIGN_OR_RETURN(auto bitmaps, Bitmaps(s.location));
    auto it = std::find_if(bitmaps.begin(), bitmaps.end(), [&](const auto& b) { return b.name == s.bitmap; });
    if (it == bitmaps.end()) return "bitmap " + s.bitmap + " missing in " + s.location;
    if (it->in_use) return "bitmap " + s.bitmap + " in use (the image is open in QEMU or was not closed cleanly)";
    if (!it->enabled) return "bitmap " + s.bitmap + " disabled";
    // The bitmap holds the writes since the policy's last successful run
    // cleared it; that run's point must still end the chain.
    if (last_cleared.empty() || chain_latest != last_cleared) {
      return "the chain does not end at the point bitmap " + s.bitmap + " was cleared after";
    }
    return std::string();
  }

  Result<SourceBackupResult> Backup(const SourceBackupRequest& r) override {
    const PolicySource& s = *r.source;
    if (s.kind == PolicySourceKind::kDomain) return BackupDomain(r);
    // A bitmap's image is locked as QEMU locks it for writing: no QEMU
    // process writes between the read and the clear of the bitmap.
    std::unique_ptr<EnvLock> lock;
    if (s.kind == PolicySourceKind::kImage) {
      BARGE_ASSIGN_OR_RETURN(lock, env_.LockImage(s.location, s.bitmap.empty() ? ImageAccess::kRead
                                                                                : ImageAccess::kExclusiveWrite));
    }
    pipeline::BackupRequest br;
    br.source.location = s.location;
    br.source.allow_dirs = {DirName(s.location)};
    br.target_dir = r.target_dir;
    br.disk_name = s.name;
    br.access = r.access;
    br.incremental = r.incremental;
    br.previous_location = FollowStateMigrations(env_);
    if (!s.disk_id.empty()) br.disk_identity = pipeline::NamedIdentity(s.disk_id, 0);
    if (r.incremental && !s.bitmap.empty()) br.dirty_bitmap = s.bitmap;
    // A chain that detects by digest keeps its SHA-256 tables from its
    // full on, so its incrementals compare without reading the chain.
    if (s.changed_by == "digests" || (!r.incremental && s.changed_by == "bitmap+digests")) {
      br.changed_by = pipeline::ChangedBy::kDigests;
    } else if (r.incremental && s.changed_by == "bitmap+digests") {
      br.changed_by = pipeline::ChangedBy::kRecordAndDigests;
    }
    br.reason = r.reason;
    br.compression = r.compression;
    br.compression_level = r.compression_level;
    br.copy = r.copy;
    br.tool_version = BargeVersion();
    BARGE_ASSIGN_OR_RETURN(auto done, pipeline::RunBackup(env_, br));
    SourceBackupResult out;
    out.points.push_back({done.chain_dir, done.manifest.id});
    // A disk file replaced under its path is backed up as a full
    // (BackupResult::replaced), whatever the plan said.
    out.type = r.incremental && done.replaced.empty() ? "incremental" : "full";
    out.type_reason = done.replaced.empty() ? r.reason : done.replaced;
    out.bytes_read = done.bytes_read;
    out.bytes_written = done.image_bytes;
    if (done.missed_clusters > 0) {
      out.warning = "bitmap " + s.bitmap + " missed " + std::to_string(done.missed_clusters) +
                    " changed clusters (found by digest and written; the manifest records the drift)";
    }
    if (s.kind == PolicySourceKind::kImage && !s.bitmap.empty()) {
      // Start the bitmap afresh: the next incremental holds the writes
      // after this point. A failure leaves it holding more than needed,
      // which is safe (an incremental with extra clusters).
      Status cleared = ClearBitmap(s);
      if (!cleared.ok()) {
        out.warning += std::string(out.warning.empty() ? "" : "; ") + "bitmap " + s.bitmap +
                       " not cleared: " + cleared.error().ToString();
      }
    }
    return out;
  }

 private:
  // A CBT overlay's data file (the raw disk) holds the data: its allocated
  // bytes (0 when the image has none or it cannot be read: the backup
  // itself then says why).
  uint64_t DataFileBytes(const std::string& path) {
    auto image = OpenImageHeader(env_, path);
    if (!image.ok() || (*image)->info().data_file.empty()) return 0;
    // Stored relative to the image's folder unless absolute.
    const std::string data = JoinPath(DirName(path), (*image)->info().data_file);
    auto st = env_.Stat(data);
    return st.ok() ? (st->is_block_device() ? (*image)->size_bytes() : st->allocated_bytes) : 0;
  }
  Result<std::vector<formats::BitmapInfo>> Bitmaps(const std::string& path) {
    BARGE_ASSIGN_OR_RETURN(auto image, OpenImageHeader(env_, path));
    return image->info().bitmaps;
  }
  formats::SourceOpener Opener() {
    return [this](const std::string& p) { return env_.OpenSource(p); };
  }
  Status ClearBitmap(const PolicySource& s) {
    BARGE_ASSIGN_OR_RETURN(auto bitmaps, Bitmaps(s.location));
    bool exists = std::any_of(bitmaps.begin(), bitmaps.end(), [&](const auto& b) { return b.name == s.bitmap; });
    formats::SinkOpener sink = [this](const std::string& p) { return env_.OpenSink(p, SinkMode::kExisting); };
    if (exists) return formats::RotateBitmap(s.location, Opener(), sink, s.bitmap, s.bitmap);
    formats::BitmapEdit edit;
    edit.add.push_back(formats::BitmapSpec{s.bitmap, 64 << 10, true, {}});
    return formats::EditBitmaps(s.location, Opener(), sink, edit);
  }

  Result<SourceBackupResult> BackupDomain(const SourceBackupRequest& r) {
    const PolicySource& s = *r.source;
    const std::string tracker = s.tracker.empty() ? r.policy : s.tracker;
    {
      BARGE_ASSIGN_OR_RETURN(auto catalog, BackupCatalog::Open(env_, r.catalog_path));
      auto t = catalog->GetTracker(tracker);
      if (!t.ok()) {
        if (t.error().code() != ErrorCode::kNotFound) return t.error();
        BARGE_RETURN_IF_ERROR(catalog->CreateTracker(tracker, s.location));
      } else if (t->domain != s.location) {
        return Error::InvalidArgument("tracker '" + tracker + "' belongs to domain '" + t->domain + "'");
      }
    }
    VmBackupRequest vr;
    vr.domain = s.location;
    vr.tracker = tracker;
    vr.target = r.target_dir;
    vr.access = r.access;
    vr.catalog_path = r.catalog_path;
    vr.libvirt_uri = s.connect;
    vr.skip_quiesce = !s.quiesce;
    vr.nbd.tls_certificates = s.tls_certificates;
    if (!s.nbd_port_range.empty()) {
      BARGE_ASSIGN_OR_RETURN(vr.nbd_ports, ParsePortRange(s.nbd_port_range));
    }
    vr.force_full = !r.incremental;
    vr.copy = r.copy;
    vr.compression = r.compression;
    vr.compression_level = r.compression_level;
    BARGE_ASSIGN_OR_RETURN(auto done, RunVmBackup(env_, vr));
    SourceBackupResult out;
    out.type = done.backup_type == "Incremental" ? "incremental" : "full";
    out.type_reason = done.reason;
    // What vm backup tells its user goes on the record: what it found and
    // cleaned up (a killed run's job, its checkpoint kept for the resume)
    // and each disk's resume of what a killed run staged (a resume refused
    // is among the warnings).
    std::vector<std::string> notes = done.warnings;
    for (const auto& d : done.disks) {
      out.points.push_back({d.chain_dir, Stem(d.manifest_path)});
      out.bytes_read += d.bytes_read;
      out.bytes_written += d.bytes_written;
      if (d.resume && d.resume->resumed) {
        notes.push_back("disk " + d.disk + ": resumed from " + std::to_string(d.resume->staged_bytes) +
                        " bytes staged by an interrupted run" +
                        (d.resume->problem.empty() ? "" : "; copied again: " + d.resume->problem));
      }
    }
    for (const std::string& n : notes) out.warning += (out.warning.empty() ? "" : "; ") + n;
    return out;
  }

  Env& env_;
};

// The linear chains of a loaded folder, and for each of its points the
// index of its chain. kCorruption when a point does not extend the end of
// a chain (retention leaves such a folder alone).
struct LinkedChains {
  std::vector<ChainView> chains;
  std::vector<size_t> chain_of;  // per folder point
};
Result<LinkedChains> LinkChains(const pipeline::ChainFolder& folder) {
  LinkedChains out;
  std::map<std::string, size_t> chain_of_last;  // id ending a chain -> chain index
  for (const auto& p : folder.points) {
    const auto& m = p.manifest;
    if (!m.parent) {
      out.chains.push_back({.chain_dir = folder.dir, .ids = {m.id}});
    } else {
      auto it = chain_of_last.find(m.parent->id);
      if (it == chain_of_last.end()) {
        return Error::Corruption("point " + m.id + " does not extend the end of a chain (parent " + m.parent->id +
                                 "); retention leaves this source alone")
            .set_path(folder.dir);
      }
      out.chains[it->second].ids.push_back(m.id);
      chain_of_last.erase(it);
    }
    chain_of_last[m.id] = out.chains.size() - 1;
    out.chain_of.push_back(chain_of_last[m.id]);
  }
  return out;
}

SysSeconds PointTime(const formats::BackupManifest& m) {
  auto t = ParseRfc3339(m.started_at);
  return t.ok() ? *t : SysSeconds{};
}

Error BusyChain(const Error& e, const std::string& dir) {
  if (e.retryable()) return Error::Busy("a backup, merge or export of chain " + dir + " runs; retention skipped it");
  return e;
}

}  // namespace

std::function<std::string(const std::string&)> FollowStateMigrations(Env& env) {
  return [&env](const std::string& path) { return MovedFromLocation(env, path); };
}

std::unique_ptr<SourceBackend> NewDefaultSourceBackend(Env& env) { return std::make_unique<DefaultBackend>(env); }

Result<SourcePoints> ScanSource(Env& env, const Policy& policy, const PolicySource& source) {
  SourcePoints out;
  std::optional<SysSeconds> newest_time;
  for (const auto& target : policy.targets) {
    const std::string base = target + "/" + policy.name + "/" +
                             (source.kind == PolicySourceKind::kDomain ? source.location : source.name);
    if (!env.Exists(base)) continue;
    std::vector<std::string> dirs;
    if (source.kind == PolicySourceKind::kDomain) {
      BARGE_ASSIGN_OR_RETURN(auto names, env.ListDir(base));
      for (const auto& n : names) {
        if (n.empty() || n[0] == '.') continue;
        auto st = env.Stat(base + "/" + n);
        if (st.ok() && st->is_directory()) dirs.push_back(base + "/" + n);
      }
    } else {
      dirs.push_back(base);
    }
    // Domain points group the disks' points of one run by checkpoint.
    std::map<std::string, size_t> point_index;
    for (const auto& dir : dirs) {
      BARGE_ASSIGN_OR_RETURN(auto folder, pipeline::LoadChainFolder(env, dir));
      BARGE_ASSIGN_OR_RETURN(LinkedChains linked, LinkChains(folder));
      for (size_t i = 0; i < folder.points.size(); ++i) {
        const auto& m = folder.points[i].manifest;
        const SysSeconds when = PointTime(m);
        std::string key = source.kind == PolicySourceKind::kDomain
                              ? base + "|" + (m.checkpoint.empty() ? m.id.substr(m.id.find('-') + 1) : m.checkpoint)
                              : dir + "|" + m.id;
        auto [pi, fresh] = point_index.emplace(key, out.points.size());
        if (fresh) out.points.push_back({key, when, {}});
        RestorePoint& rp = out.points[pi->second];
        rp.time = std::min(rp.time, when);
        rp.parts.push_back({dir, m.id});
        if (!newest_time || when >= *newest_time) {  // same second: the later point in the folder
          newest_time = when;
          out.newest_chain = ChainSummary{target, linked.chains[linked.chain_of[i]].ids.size()};
          out.newest_chain_dir = dir;
          out.newest_id = m.id;
        }
      }
      BARGE_RETURN_IF_ERROR(PinBases(env, linked.chains, /*sweep=*/false));
      for (auto& c : linked.chains) out.chains.push_back(std::move(c));
      if (out.newest_chain_dir == dir) out.newest_folder = std::move(folder);
    }
  }
  return out;
}

Status PinBases(Env& env, std::vector<ChainView>& chains, bool sweep) {
  std::map<std::string, std::map<std::string, std::vector<std::string>>> by_dir;
  for (ChainView& c : chains) {
    auto it = by_dir.find(c.chain_dir);
    if (it == by_dir.end()) {
      BARGE_ASSIGN_OR_RETURN(auto live, pipeline::LiveDependents(env, c.chain_dir, sweep));
      it = by_dir.emplace(c.chain_dir, std::move(live)).first;
    }
    for (const std::string& id : c.ids) {
      auto d = it->second.find(id);
      if (d == it->second.end()) continue;
      c.pinned[id] = "base of " + std::to_string(d->second.size()) + " chain" + (d->second.size() == 1 ? "" : "s");
    }
  }
  return OkStatus();
}

Result<SourcePoints> ScanChainFolder(const pipeline::ChainFolder& folder) {
  SourcePoints out;
  BARGE_ASSIGN_OR_RETURN(LinkedChains linked, LinkChains(folder));
  std::optional<SysSeconds> newest_time;
  for (size_t i = 0; i < folder.points.size(); ++i) {
    const auto& m = folder.points[i].manifest;
    const SysSeconds when = PointTime(m);
    out.points.push_back({folder.dir + "|" + m.id, when, {{folder.dir, m.id}}});
    if (!newest_time || when >= *newest_time) {
      newest_time = when;
      out.newest_chain = ChainSummary{folder.dir, linked.chains[linked.chain_of[i]].ids.size()};
      out.newest_chain_dir = folder.dir;
      out.newest_id = m.id;
    }
  }
  out.chains = std::move(linked.chains);
  return out;
}

Result<size_t> MarkMissingPointsRemoved(Env& env, PolicyCatalog& catalog, const Policy& policy,
                                        const PolicySource& source, const SourcePoints& points) {
  std::set<std::pair<std::string, std::string>> present;
  for (const auto& p : points.points) {
    for (const auto& part : p.parts) present.emplace(part.chain_dir, part.id);
  }
  RunFilter filter;
  filter.policy = policy.name;
  filter.source = source.name;
  BARGE_ASSIGN_OR_RETURN(auto runs, catalog.ListRuns(filter));
  size_t marked = 0;
  for (const auto& r : runs) {
    if (r.result != "success" || (r.point_state != "present" && r.point_state != "partly removed")) continue;
    for (const auto& part : r.points) {
      if (present.count({part.chain_dir, part.id}) || !env.Exists(part.chain_dir)) continue;
      BARGE_ASSIGN_OR_RETURN(size_t n, catalog.MarkPointRemoved(part.chain_dir, part.id, "removed"));
      marked += n;
    }
  }
  return marked;
}

Status ApplyRetention(Env& env, const RetentionPlan& plan, PolicyCatalog* catalog, const pipeline::CopyOptions& copy,
                      const pipeline::ChainLock* held) {
  // Nothing starts while one of the files is under S3 Object Lock.
  BARGE_RETURN_IF_ERROR(pipeline::CheckNotLocked(env, PlanTouchedFiles(plan)));
  for (const auto& a : plan.actions) {
    if (a.kind == RetentionActionKind::kMergeThrough) {
      pipeline::MergeRequest mr;
      mr.chain_dir = a.chain_dir;
      mr.through = a.through;
      mr.held = held;
      mr.copy = copy;
      auto merged = pipeline::RunMerge(env, mr);
      if (!merged.ok()) return BusyChain(merged.error(), a.chain_dir).Wrap("merge " + a.chain_dir + " through " + a.through);
      if (catalog != nullptr) {
        for (const auto& id : merged->folded_ids) {
          if (id == a.through) continue;
          BARGE_RETURN_IF_ERROR(catalog->MarkPointRemoved(a.chain_dir, id, "merged into " + a.through));
        }
      }
      continue;
    }
    std::optional<pipeline::ChainLock> own_lock;
    if (held == nullptr) {
      auto lock = pipeline::ChainLock::Acquire(env, a.chain_dir, /*wait=*/false);
      if (!lock.ok()) return BusyChain(lock.error(), a.chain_dir);
      own_lock.emplace(std::move(*lock));
    }
    // Points are removed below: never from under an export (pipeline/export_lock.h).
    if (Status exported = pipeline::CheckNotExported(env, a.chain_dir); !exported.ok()) return exported;
    // A chain over a base removed whole: its reference in the base goes
    // too (else swept there later as stale).
    std::optional<formats::ManifestBase> based;
    std::string based_chain_id;
    if (a.kind == RetentionActionKind::kRemoveChain && !a.ids.empty()) {
      if (auto text = pipeline::ReadSmallFile(env, a.chain_dir + "/" + a.ids.front() + ".json"); text.ok()) {
        if (auto m = formats::DecodeManifest(*text); m.ok() && m->base) {
          based = m->base;
          based_chain_id = m->chain_id;
        }
      }
    }
    // Newest first: a stop half way leaves a shorter chain whose every
    // point still restores. Each point's manifest goes first, so nothing
    // looks like a backup once its image is gone.
    for (auto it = a.ids.rbegin(); it != a.ids.rend(); ++it) {
      for (const char* ext : kPointFileExtensions) {
        Status s = env.Unlink(a.chain_dir + "/" + *it + ext);
        if (!s.ok() && s.error().code() != ErrorCode::kNotFound) return s;
        if (std::string(ext) == ".json") BARGE_RETURN_IF_ERROR(env.SyncDir(a.chain_dir));
      }
      BARGE_RETURN_IF_ERROR(env.SyncDir(a.chain_dir));
      if (catalog != nullptr) BARGE_RETURN_IF_ERROR(catalog->MarkPointRemoved(a.chain_dir, *it, "removed"));
    }
    if (based) {
      IgnoreError(pipeline::RemoveBaseRef(env, LexicallyNormal(JoinPath(a.chain_dir, based->chain)), based_chain_id),
                  "a stale reference is swept by the base chain's next forget or merge");
    }
  }
  return OkStatus();
}

std::vector<std::string> PolicyWarnings(Env& env, const Policy& policy) {
  std::vector<std::string> out;
  for (const auto& t : policy.targets) {
    // A bucket is not contacted here (nor are domains and NBD exports).
    if (IsBucketTarget(t)) continue;
    auto st = env.Stat(t);
    if (!st.ok()) {
      out.push_back("target " + t + ": " + (st.error().code() == ErrorCode::kNotFound ? "does not exist"
                                                                                   : st.error().ToString()));
      continue;
    }
    if (!st->is_directory()) {
      out.push_back("target " + t + ": not a folder");
      continue;
    }
    auto owner = PolicyFolderOwner(env, t, policy.name);
    if (!owner.ok()) {
      out.push_back("target " + t + ": " + owner.error().ToString());
    } else if (!owner->empty() && !policy.file.empty() && *owner != policy.file) {
      out.push_back("target " + t + ": its folder " + policy.name + " belongs to policy file " + *owner +
                    ", which has the same name: runs of this file will be refused; give one of them another `name`");
    }
  }
  for (const auto& s : policy.sources) {
    if (s.kind != PolicySourceKind::kImage) continue;
    auto image = OpenImageHeader(env, s.location);
    if (!image.ok()) {
      out.push_back("source " + s.name + ": image " + s.location + ": " +
                    (image.error().code() == ErrorCode::kNotFound ? "does not exist" : image.error().ToString()));
      continue;
    }
    if (s.bitmap.empty()) continue;
    const auto& bitmaps = (*image)->info().bitmaps;
    if (std::none_of(bitmaps.begin(), bitmaps.end(), [&](const auto& b) { return b.name == s.bitmap; })) {
      out.push_back("source " + s.name + ": image " + s.location + " has no bitmap " + s.bitmap +
                    ": every backup is full until the first one adds it");
    }
  }
  return out;
}

}  // namespace barge::orchestrate
