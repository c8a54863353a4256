// Orphaned backup jobs (a killed vm backup's libvirt job, checkpoint,
// scratch folder and socket) and stale checkpoints.
#include "orchestrate/vm/vm_orphans.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <map>
#include <set>
#include <cstdlib>
#include <functional>
#include <optional>
#include <thread>

#include "blockio/path.h"
#include "orchestrate/base/file_lock.h"
#include "pipeline/backup_resume.h"
#include "pipeline/chain.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/qemu_monitor.h"
#include "orchestrate/libvirt/remote_files.h"
#include "pipeline/disk_identity.h"

namespace barge::orchestrate {
namespace {

std::string Field(const std::string& text, const std::string& key) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
    pos = end + 1;
  }
  return "";
}

// The socket of the domain's live backup job, or nullopt when libvirt has none.
std::optional<std::string> LiveJobSocket(virDomainPtr dom) {
  if (!DomainIsActive(dom)) return std::nullopt;
  char* xml = virDomainBackupGetXMLDesc(dom, 0);
  if (xml == nullptr) return std::nullopt;
  std::string text(xml);
  ::free(xml);
  return XmlAttr(text, "server", "socket");
}

std::string OwnerPid(const std::string& owner) {
  auto o = ProcessOwner::Parse(owner);
  return o.ok() ? std::to_string(o->pid) : std::string("?");
}

}  // namespace

Status RemoveJobSocket(Env& env, const std::string& socket) {
  BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(socket));
  const std::string dir = DirName(socket);
  if (BaseName(socket) != kJobSocketName || !BaseName(dir).starts_with("barge-backup-")) return OkStatus();
  return env.RemoveTree(dir);
}

namespace {

// Where a remote job's socket folder lives on the host.
constexpr const char* kRemoteSocketRoot = "/tmp";

// Runs `op` on the storage pool over kRemoteSocketRoot (OpenRemoteFolder;
// one made for it, named after `folder`, is stopped after), up to three
// times: a pool over the root that another run made and stops meanwhile
// fails `op`, and the next try makes one of this run's.
Status OnRemoteSocketRoot(virConnectPtr conn, const std::string& folder,
                          const std::function<Status(virStoragePoolPtr)>& op) {
  Status done = OkStatus();
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string transient;
    BARGE_ASSIGN_OR_RETURN(VirPool pool, OpenRemoteFolder(conn, kRemoteSocketRoot, "barge-tmp-" + folder, &transient));
    done = op(pool.get());
    Status closed = CloseRemoteFolder(pool.get(), transient);
    if (done.ok()) return closed;
  }
  return done;
}

}  // namespace

Result<std::string> MakeRemoteJobSocketDir(virConnectPtr conn, const std::string& domain,
                                           const std::optional<std::pair<uid_t, gid_t>>& qemu_owner) {
  const std::string name = "barge-backup-" + domain + "-" + pipeline::NewChainId();
  const int64_t uid = qemu_owner ? static_cast<int64_t>(qemu_owner->first) : -1;
  const int64_t gid = qemu_owner ? static_cast<int64_t>(qemu_owner->second) : -1;
  Status made = OnRemoteSocketRoot(
      conn, name, [&](virStoragePoolPtr pool) { return CreateRemoteFolder(pool, name, 0750, uid, gid); });
  if (!made.ok()) return std::move(made).error().Wrap("create the backup job's socket folder on the host");
  return JoinPath(std::string(kRemoteSocketRoot) + "/" + name, kJobSocketName);
}

Status RemoveRemoteJobSocketDir(virConnectPtr conn, const std::string& socket) {
  const std::string dir = DirName(socket), name = BaseName(dir);
  if (BaseName(socket) != kJobSocketName || DirName(dir) != kRemoteSocketRoot || !name.starts_with("barge-backup-")) {
    return OkStatus();
  }
  Status deleted =
      OnRemoteSocketRoot(conn, name, [&](virStoragePoolPtr pool) { return DeleteRemoteFile(pool, name); });
  if (!deleted.ok()) return std::move(deleted).error().Wrap("remove the backup job's socket folder on the host");
  return OkStatus();
}

std::string BackupJobRecordPath(const std::string& catalog_path, const std::string& domain) {
  // Beside the domain's lock (locks/domains/<name>.lock), escaped the same way.
  std::string lock = CatalogLockPath(catalog_path, LockKind::kDomain, domain);
  return lock.substr(0, lock.size() - std::string_view(".lock").size()) + ".backup-job";
}

Status WriteBackupJobRecord(Env& env, const std::string& path, const BackupJobRecord& r) {
  std::string text = "owner=" + r.owner + "\nsocket=" + r.socket + "\nscratch_dir=" + r.scratch_dir +
                     "\ncheckpoint=" + r.checkpoint + "\nchains_dir=" + r.chains_dir + "\nrecord_id=" + std::to_string(r.record_id) +
                     "\nhost=" + r.host + "\nresumed_checkpoints=" + r.resumed_checkpoints +
                     "\nkept_after_failure=" + (r.kept_after_failure ? "1" : "0") + "\n";
  return env.WriteFileAtomic(path, std::string_view(text));
}

Result<BackupJobState> InspectBackupJob(Env& env, const std::string& catalog_path, virDomainPtr dom,
                                        const std::string& domain) {
  BackupJobState st;
  std::optional<std::string> live = LiveJobSocket(dom);
  st.job_active = live.has_value();
  if (live) st.job_socket = *live;
  const std::string path = BackupJobRecordPath(catalog_path, domain);
  auto text = env.ReadFile(path, 1 << 16);
  bool have_record = false;
  if (text.ok()) {
    have_record = true;
    st.record.owner = Field(*text, "owner");
    st.record.socket = Field(*text, "socket");
    st.record.scratch_dir = Field(*text, "scratch_dir");
    st.record.checkpoint = Field(*text, "checkpoint");
    st.record.chains_dir = Field(*text, "chains_dir");
    st.record.record_id = std::atoll(Field(*text, "record_id").c_str());
    st.record.host = Field(*text, "host");
    st.record.resumed_checkpoints = Field(*text, "resumed_checkpoints");
    st.record.kept_after_failure = Field(*text, "kept_after_failure") == "1";
  } else if (text.error().code() != ErrorCode::kNotFound) {
    return std::move(text).error();
  }
  if (have_record && (!st.job_active || st.job_socket == st.record.socket)) {
    if (st.record.kept_after_failure) {
      st.state = "orphaned";
      st.message = "barge's backup run of process " + OwnerPid(st.record.owner) +
                   " failed (its NBD connection lost) and kept the data it staged" +
                   (st.record.checkpoint.empty() ? "" : " and its checkpoint " + st.record.checkpoint) +
                   ": the next vm backup of domain '" + domain + "' resumes from them";
    } else if (OwnerIsGone(env, st.record.owner)) {
      st.state = "orphaned";
      st.message = "backup job of barge's killed run (process " + OwnerPid(st.record.owner) + " is gone)" +
                   (st.job_active ? " still runs in libvirt" : " left its files") +
                   (st.record.checkpoint.empty() ? "" : ", checkpoint " + st.record.checkpoint) +
                   ": the next vm backup of domain '" + domain +
                   "' aborts it, resumes from what it staged where it can and cleans up the rest";
    } else {
      st.state = "running";
      st.message = "a backup of domain '" + domain + "' by process " + OwnerPid(st.record.owner) +
                   " is running (" +
                   (st.record.socket.empty() ? std::string("NBD export on TCP") : "socket " + st.record.socket) + ")";
    }
    return st;
  }
  if (st.job_active) {
    st.state = "foreign";
    st.message = "domain '" + domain + "' has a backup job that barge did not start with this catalog (socket " +
                 (st.job_socket.empty() ? std::string("none: an export on TCP") : st.job_socket) +
                 "); barge leaves it alone: end it with 'virsh domjobabort " + domain + "' if nothing uses it";
  }
  return st;
}

Result<OrphanOutlook> ForeseeOrphanRecovery(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                            const std::string& domain, const BackupJobRecord& r,
                                            bool keep_resumable) {
  OrphanOutlook out;
  // The checkpoints a resume journal names (the staged points' times).
  std::set<std::string> journaled;
  if (keep_resumable && !r.chains_dir.empty()) {
    BARGE_ASSIGN_OR_RETURN(auto disks, DomainDisks(dom));
    for (const auto& d : disks) {
      auto j = pipeline::LoadResumeJournal(
          env, r.chains_dir + "/" + d.target + "/" + std::string(pipeline::kResumeJournalName));
      if (j.ok() && !j->key.checkpoint.empty()) journaled.insert(j->key.checkpoint);
    }
  }
  std::vector<std::string> checkpoints;
  if (!r.checkpoint.empty()) checkpoints.push_back(r.checkpoint);
  for (size_t a = 0; a < r.resumed_checkpoints.size();) {
    size_t b = r.resumed_checkpoints.find(',', a);
    if (b == std::string::npos) b = r.resumed_checkpoints.size();
    if (b > a) checkpoints.push_back(r.resumed_checkpoints.substr(a, b - a));
    a = b + 1;
  }
  BARGE_ASSIGN_OR_RETURN(auto trackers, catalog.ListTrackers(domain));
  auto named = [&trackers](const std::string& cp) {
    bool n = false;
    for (const auto& t : trackers) n |= t.latest_checkpoint == cp;
    return n;
  };
  for (const std::string& cp : checkpoints) {
    if (!LookupCheckpoint(dom, cp).ok()) {
      // An offline run's checkpoint is only its bitmaps in the CBT overlays
      // until its commit defines it in libvirt: kept for a resume where a
      // journal names it, else left to the next offline backup, which
      // removes such stray bitmaps (a pull job never reads them).
      if (journaled.count(cp)) out.kept_checkpoints.push_back(cp);
      continue;
    }
    // Never committed: a tracker that named it would have been advanced by
    // the run that was killed before its commit, so this is only a check.
    if (named(cp)) continue;
    if (journaled.count(cp)) {
      out.kept_checkpoints.push_back(cp);
    } else {
      out.deleted_checkpoints.push_back(cp);
    }
  }
  // Killed after its commit, before removing its record: its points are
  // the tracker's.
  if (!r.checkpoint.empty() && !r.chains_dir.empty() && !named(r.checkpoint)) {
    out.uncommitted_checkpoint = r.checkpoint;
  }
  return out;
}

Result<OrphanRecovery> RecoverOrphanedBackupJob(Env& env, BackupCatalog& catalog, virDomainPtr dom,
                                                const std::string& domain, bool keep_resumable) {
  BARGE_ASSIGN_OR_RETURN(BackupJobState st, InspectBackupJob(env, catalog.path(), dom, domain));
  OrphanRecovery out;
  if (st.state == "none") return out;
  if (st.state != "orphaned") return Error::Busy(st.message);
  const BackupJobRecord& r = st.record;
  std::string done;
  if (st.job_active) {
    if (virDomainAbortJob(dom) < 0) return LastVirError("abort the orphaned backup job of domain " + domain);
    // QEMU holds the scratch files until the job is gone (as Cleanup::EndJob).
    for (int i = 0; i < 300; ++i) {
      virDomainJobInfo info{};
      if (virDomainGetJobInfo(dom, &info) < 0 || info.type == VIR_DOMAIN_JOB_NONE) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    done = "aborted the backup job";
  }
  // A remote host's scratch files are that host's (libvirt removes the
  // scratch files it made when the job ends); the socket's folder goes
  // through its libvirt. An offline run (shut-off domain) has neither.
  // A folder that cannot go (QEMU killed with the socket in it) does not
  // stop the backup: the warning names it.
  if (!r.host.empty() && !r.socket.empty()) {
    Status removed = RemoveRemoteJobSocketDir(virDomainGetConnect(dom), r.socket);
    done += std::string(done.empty() ? "" : ", ") +
            (removed.ok() ? "removed its socket folder on the host"
                          : "left its socket folder " + DirName(r.socket) + " on the host (" +
                                removed.error().message() + ")");
  }
  if (r.host.empty() && (!r.socket.empty() || !r.scratch_dir.empty())) {
    if (!r.socket.empty()) BARGE_RETURN_IF_ERROR(RemoveJobSocket(env, r.socket));
    if (!r.scratch_dir.empty()) BARGE_RETURN_IF_ERROR(env.RemoveTree(r.scratch_dir));
    done += std::string(done.empty() ? "" : ", ") + "removed its socket and scratch folder";
  }
  BARGE_ASSIGN_OR_RETURN(OrphanOutlook outlook, ForeseeOrphanRecovery(env, catalog, dom, domain, r, keep_resumable));
  const bool active = DomainIsActive(dom);
  for (const std::string& cp : outlook.kept_checkpoints) {
    out.kept_checkpoints.push_back(cp);
    done += ", kept its checkpoint " + cp + " to resume the data it staged";
  }
  for (const std::string& cp : outlook.deleted_checkpoints) {
    // libvirt deletes a checkpoint's bitmaps only from a running domain: of
    // a shut-off one the metadata goes, and the next offline backup removes
    // the bitmaps left in the CBT overlays as strays.
    BARGE_RETURN_IF_ERROR(DeleteCheckpoint(dom, cp, /*metadata_only=*/!active));
    done += ", deleted its uncommitted checkpoint " + cp;
  }
  if (!outlook.uncommitted_checkpoint.empty()) {
    // The points the killed run wrote for its checkpoint were never
    // committed: a chain ending at them would not end at the tracker's
    // checkpoint, and the next backup would be a needless full.
    BARGE_ASSIGN_OR_RETURN(auto disks, DomainDisks(dom));
    for (const auto& d : disks) {
      auto chain = pipeline::LoadChainFolder(env, r.chains_dir + "/" + d.target);
      if (!chain.ok() || chain->empty() || chain->latest().manifest.checkpoint != r.checkpoint) continue;
      const auto& m = chain->latest().manifest;
      for (const std::string& f : {m.image.empty() ? std::string() : chain->PathOf(m.image),
                                   m.digest_table.empty() ? std::string() : chain->PathOf(m.digest_table),
                                   chain->latest().manifest_path}) {
        if (!f.empty()) BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(f));
      }
      done += ", removed its uncommitted point " + m.id + " of disk " + d.target;
    }
  }
  if (r.record_id > 0) {
    auto rec = catalog.GetBackup(r.record_id);
    if (rec.ok() && rec->result == "running") {
      BackupRecord failed = *rec;
      failed.error = "the run's process " + OwnerPid(r.owner) + " ended without finishing (killed?); " +
                     "the next run aborted its backup job";
      BARGE_RETURN_IF_ERROR(catalog.FailBackup(r.record_id, failed));
    }
  }
  BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(BackupJobRecordPath(catalog.path(), domain)));
  out.warning = "an earlier backup of domain '" + domain + "' (process " + OwnerPid(r.owner) + ") " +
                (r.kept_after_failure ? "lost its NBD connection and kept what it staged: " : "was killed: ") +
                (done.rfind(", ", 0) == 0 ? done.substr(2) : done);
  return out;
}

namespace {

// Per disk of a checkpoint XML with checkpoint='bitmap': the bitmap's name
// (libvirt names it after the checkpoint unless the XML says otherwise).
std::map<std::string, std::string> CheckpointBitmaps(const std::string& xml, const std::string& checkpoint) {
  std::map<std::string, std::string> out;
  size_t a = xml.find("<disks>");
  size_t b = xml.find("</disks>");
  if (a == std::string::npos || b == std::string::npos || b < a) return out;
  std::string_view disks = std::string_view(xml).substr(a, b - a);
  size_t pos = 0;
  while ((pos = disks.find("<disk ", pos)) != std::string_view::npos) {
    size_t end = disks.find('>', pos);
    if (end == std::string_view::npos) break;
    std::string_view el = disks.substr(pos, end - pos + 1);
    if (XmlAttr(el, "disk", "checkpoint") == "bitmap") {
      std::string bitmap = XmlAttr(el, "disk", "bitmap");
      out[XmlAttr(el, "disk", "name")] = bitmap.empty() ? checkpoint : bitmap;
    }
    pos = end;
  }
  return out;
}

}  // namespace

bool IsBargeCheckpointName(const std::string& name) {
  // <tracker>-YYYYMMDDTHHMMSSZ
  constexpr size_t kStamp = 16;
  if (name.size() < kStamp + 2 || name[name.size() - kStamp - 1] != '-') return false;
  const std::string stamp = name.substr(name.size() - kStamp);
  for (size_t i = 0; i < kStamp; ++i) {
    const char c = stamp[i];
    const bool ok = i == 8 ? c == 'T' : i == 15 ? c == 'Z' : std::isdigit(static_cast<unsigned char>(c)) != 0;
    if (!ok) return false;
  }
  const std::string tracker = name.substr(0, name.size() - kStamp - 1);
  return std::all_of(tracker.begin(), tracker.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '.' || c == '-';
  });
}

Result<std::vector<StaleCheckpoint>> FindStaleCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                          const std::string& domain) {
  std::vector<StaleCheckpoint> out;
  // A running backup job puts its filter node on top of each disk, which
  // lists no bitmaps: ask only when no job runs.
  if (!DomainIsActive(dom) || LiveJobSocket(dom)) return out;
  BARGE_ASSIGN_OR_RETURN(auto trackers, catalog.ListTrackers(domain));
  std::set<std::string> in_use;
  for (const auto& t : trackers) in_use.insert(t.latest_checkpoint);
  BARGE_ASSIGN_OR_RETURN(auto names, ListCheckpointNames(dom));
  std::map<std::string, std::set<std::string>> qemu_bitmaps;  // disk -> names, asked once per disk
  for (const auto& name : names) {
    if (in_use.count(name)) continue;
    auto cp = LookupCheckpoint(dom, name);
    if (!cp.ok()) continue;  // deleted meanwhile
    BARGE_ASSIGN_OR_RETURN(std::string xml, CheckpointXml(cp->get()));
    auto bitmaps = CheckpointBitmaps(xml, name);
    if (bitmaps.empty()) continue;
    StaleCheckpoint s{name, IsBargeCheckpointName(name), {}};
    bool all_gone = true;
    for (const auto& [disk, bitmap] : bitmaps) {
      auto known = qemu_bitmaps.find(disk);
      if (known == qemu_bitmaps.end()) {
        auto qd = FindQemuDisk(dom, disk);
        if (!qd.ok()) {
          // A disk QEMU does not list (removed since): its bitmap is gone too.
          if (qd.error().code() != ErrorCode::kNotFound) return std::move(qd).error();
          known = qemu_bitmaps.emplace(disk, std::set<std::string>{}).first;
        } else {
          std::set<std::string> names;
          for (const auto& b : qd->bitmaps) names.insert(b.name);
          known = qemu_bitmaps.emplace(disk, std::move(names)).first;
        }
      }
      if (known->second.count(bitmap)) {
        all_gone = false;
        break;
      }
      s.disks.push_back(disk);
    }
    if (all_gone) out.push_back(std::move(s));
  }
  return out;
}

Result<std::vector<std::string>> RemoveStaleCheckpoints(BackupCatalog& catalog, virDomainPtr dom,
                                                        const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto stale, FindStaleCheckpoints(catalog, dom, domain));
  std::vector<std::string> warnings;
  for (const auto& s : stale) {
    std::string what = "checkpoint " + s.name + " of domain '" + domain + "' has lost its bitmaps";
    if (!s.barges) {
      warnings.push_back(what + "; barge did not make it and keeps it (remove it with 'virsh checkpoint-delete " +
                         domain + " " + s.name + " --metadata')");
      continue;
    }
    Status deleted = DeleteCheckpoint(dom, s.name, /*metadata_only=*/true);
    warnings.push_back(deleted.ok() ? what + "; barge made it and removed it (metadata only)"
                                    : what + "; removing it failed: " + deleted.error().message());
  }
  return warnings;
}

}  // namespace barge::orchestrate
