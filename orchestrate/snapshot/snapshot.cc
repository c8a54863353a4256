// Snapshots of one disk: target resolution (image file, shut-off domain,
// running domain), the offline edit under QEMU's image lock with the
// free-space check, the online path through QMP, quiesce and hooks.
#include "orchestrate/snapshot/snapshot.h"

#include <cstdio>
#include <functional>
#include <map>
#include <memory>

#include "formats/qcow2_snapshot.h"
#include "formats/qcow2_snapshot_edit.h"
#include "orchestrate/libvirt/guest_freeze.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "orchestrate/libvirt/paused_start.h"
#include "orchestrate/libvirt/qemu_monitor.h"

namespace barge::orchestrate {
namespace {

// What a target turned out to be.
struct Resolved {
  std::string image;
  bool online = false;
  bool domain_off = false;  // a domain that is shut off
  // A running domain on another host (--connect): QMP through libvirt
  // works, its image file is that host's and is never opened here.
  std::string remote_uri;
  VirConnection conn;
  VirDomain dom;
  QemuDisk qemu;  // online
  // A shut-off domain on another host, started paused so that its QEMU
  // does the work (last: stopped before `dom` and `conn` go).
  std::unique_ptr<PausedStart> paused;
};

// What a shut-off domain on another host (its image file is that host's)
// is resolved for.
enum class RemoteOff {
  kStartPaused,  // an operation with a QMP path (create, delete, list): started paused for it
  kRefuse,       // one without (rename, rollback): refused
  kPathOnly,     // the image's path only, from the domain's XML: nothing is opened
};

Result<Resolved> Resolve(const SnapshotTarget& t, RemoteOff remote_off) {
  if (t.image.empty() == t.domain.empty()) {
    return Error::InvalidArgument("name either an image file or a domain and its disk");
  }
  Resolved r;
  if (!t.image.empty()) {
    r.image = t.image;
    return r;
  }
  if (t.disk.empty()) return Error::InvalidArgument("name the disk of domain '" + t.domain + "' (e.g. vda)");
  const std::string uri = ResolveLibvirtUri(t.libvirt_uri);
  const bool remote = !LibvirtHostKey(uri).empty();
  BARGE_ASSIGN_OR_RETURN(r.conn, ConnectLibvirt(t.libvirt_uri));
  BARGE_ASSIGN_OR_RETURN(r.dom, LookupDomain(r.conn.get(), t.domain));
  if (remote && remote_off == RemoteOff::kStartPaused && !DomainIsActive(r.dom.get())) {
    BARGE_ASSIGN_OR_RETURN(r.paused, PausedStart::Start(r.dom.get(), t.domain, RedactLibvirtUri(uri),
                                                        "edit their snapshots through QEMU"));
  }
  if (DomainIsActive(r.dom.get())) {
    if (remote) r.remote_uri = RedactLibvirtUri(uri);
    BARGE_ASSIGN_OR_RETURN(r.qemu, FindQemuDisk(r.dom.get(), t.disk));
    if (r.qemu.format != "qcow2") {
      return Error::InvalidArgument("disk '" + t.disk + "' of domain '" + t.domain + "' is " + r.qemu.format +
                                    ", not qcow2: only qcow2 images have internal snapshots");
    }
    r.image = r.qemu.file;
    r.online = true;
    return r;
  }
  if (remote && remote_off == RemoteOff::kRefuse) {
    // QEMU has no command for this operation (rename, rollback), and
    // libvirt's remote API has no call that edits a file's internal
    // snapshots.
    return Error::NotSupported("domain '" + t.domain + "' on " + RedactLibvirtUri(uri) +
                               " is shut off: renaming or rolling back a snapshot is an edit of its image file, "
                               "which is on that host, and QEMU has no command for it (create, delete and list "
                               "work: barge starts the domain paused for them); run barge on that host");
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<DomainDisk> disks, DomainDisks(r.dom.get()));
  for (const DomainDisk& d : disks) {
    if (d.target != t.disk) continue;
    if (d.source_type != "file" || d.format != "qcow2") {
      return Error::InvalidArgument("disk '" + t.disk + "' of domain '" + t.domain + "' is a " + d.source_type +
                                    " " + d.format + " disk, not a qcow2 file: only qcow2 images have internal snapshots");
    }
    r.image = d.source;
    r.domain_off = true;
    return r;
  }
  return Error::NotFound("domain '" + t.domain + "' has no disk '" + t.disk + "'");
}

// The image locked against QEMU and opened for reading, and for writing
// unless `read_only`.
struct Opened {
  std::unique_ptr<EnvLock> lock;
  std::unique_ptr<BlockSource> source;
  std::unique_ptr<BlockSink> sink;
};

Result<Opened> Open(Env& env, const std::string& path, bool read_only) {
  Opened o;
  auto lock = env.LockImage(path, read_only ? ImageAccess::kRead : ImageAccess::kExclusiveWrite);
  if (!lock.ok()) {
    Error e = std::move(lock).error();
    if (e.code() == ErrorCode::kBusy) {
      e.Wrap(std::string("cannot ") + (read_only ? "read" : "edit") + " the snapshots of '" + path +
             "' while another process has it open (a running VM: name its --domain and --disk)");
    }
    return e;
  }
  o.lock = std::move(*lock);
  BARGE_ASSIGN_OR_RETURN(o.source, env.OpenSource(path));
  if (!read_only) {
    // A few megabytes of metadata and two flushes: no write-behind.
    FileOptions options;
    options.write_behind = false;
    BARGE_ASSIGN_OR_RETURN(o.sink, env.OpenSink(path, SinkMode::kExisting, options));
  }
  return o;
}

// kNoSpace unless the file system holding `image` has `needed` bytes plus
// the margin free.
Status CheckSpace(Env& env, const std::string& image, const std::string& name, uint64_t needed,
                  const SpacePolicy& policy) {
  BARGE_ASSIGN_OR_RETURN(SpaceInfo space, env.Space(image));
  if (space.free_bytes >= needed && space.free_bytes - needed >= policy.margin_bytes) return OkStatus();
  return Error::NoSpace("not enough space for snapshot '" + name + "': it needs up to " + std::to_string(needed) +
                        " bytes of metadata plus a safety margin of " + std::to_string(policy.margin_bytes) +
                        " bytes, and the file system has " + std::to_string(space.free_bytes) + " bytes free")
      .set_path(image);
}

std::map<std::string, std::string> HookEnv(const SnapshotTarget& t, const std::string& image,
                                           const std::string& name, const char* operation) {
  std::map<std::string, std::string> env = {{"BARGE_OPERATION", operation},
                                            {"BARGE_IMAGE", image},
                                            {"BARGE_SNAPSHOT", name},
                                            {"BARGE_DISK", t.disk.empty() ? image : t.disk}};
  if (!t.domain.empty()) env["BARGE_DOMAIN"] = t.domain;
  return env;
}

Error WithImage(Error e, const std::string& image) {
  if (e.path().empty()) e.set_path(image);
  return e;
}

// A domain started paused for the operation, shut off again; the
// operation's warnings say so.
void StopPaused(Resolved& r, std::vector<std::string>& warnings) {
  if (!r.paused) return;
  Status stopped = r.paused->Stop();
  warnings.push_back(r.paused->Warning("this snapshot operation"));
  if (!stopped.ok()) {
    warnings.push_back(stopped.error().ToString() + " (libvirt shuts it off when barge's connection closes)");
  }
}

Result<formats::SnapshotInfo> FindOnline(const Resolved& r, const std::string& id_or_name) {
  auto index = formats::qcow2::FindSnapshot(r.qemu.snapshots, id_or_name);
  if (!index.ok()) return WithImage(std::move(index).error(), r.image);
  return r.qemu.snapshots[*index];
}

}  // namespace

Result<std::string> SnapshotImagePath(const SnapshotTarget& target) {
  BARGE_ASSIGN_OR_RETURN(Resolved r, Resolve(target, RemoteOff::kPathOnly));
  return r.image;
}

Result<SnapshotOpResult> CreateDiskSnapshot(Env& env, const SnapshotCreateRequest& req) {
  BARGE_RETURN_IF_ERROR(formats::qcow2::ValidateSnapshotName(req.name));
  BARGE_ASSIGN_OR_RETURN(Resolved r, Resolve(req.target, RemoteOff::kStartPaused));
  SnapshotOpResult res;
  res.image = r.image;
  res.mode = r.online ? "online" : "offline";
  bool quiesce = req.consistency.quiesce;
  if (quiesce && (!r.online || r.paused)) {
    if (!r.domain_off && !r.paused) {
      return Error::InvalidArgument("--quiesce needs a running domain (its guest agent freezes the file systems)");
    }
    res.warnings.push_back("domain '" + req.target.domain + "' is shut off: nothing to quiesce");
    quiesce = false;
  }
  const auto env_vars = HookEnv(req.target, r.image, req.name, "snapshot-create");
  HookedResult hooked;
  Status done;

  if (!r.online) {
    BARGE_ASSIGN_OR_RETURN(Opened o, Open(env, r.image, false));
    // Before anything runs: an upper bound of the metadata, then the exact
    // plan once it is known (both against the same margin).
    auto estimate = formats::EstimateSnapshotCreateBytes(*o.source);
    if (!estimate.ok()) return WithImage(std::move(estimate).error(), r.image);
    BARGE_RETURN_IF_ERROR(CheckSpace(env, r.image, req.name, *estimate, req.space));
    done = RunWithHooks(req.consistency.hooks, env_vars, [&]() -> Status {
      formats::SnapshotCreateSpec spec;
      spec.name = req.name;
      spec.allow_duplicate_name = req.allow_duplicate_name;
      formats::SnapshotEditOptions options;
      options.before_write = [&](const formats::SnapshotEditPlan& plan) {
        return CheckSpace(env, r.image, req.name, plan.write_bytes, req.space);
      };
      auto created = formats::CreateSnapshot(*o.source, *o.sink, spec, options);
      if (!created.ok()) return WithImage(std::move(created).error(), r.image);
      res.snapshot = *created;
      return OkStatus();
    }, &hooked);
  } else {
    for (const formats::SnapshotInfo& s : r.qemu.snapshots) {
      if (s.name == req.name) {
        return Error::InvalidArgument("disk '" + req.target.disk + "' already has a snapshot named '" + req.name +
                                      "' (id " + s.id + ")");
      }
    }
    if (!r.remote_uri.empty()) {
      // The image's file system is the remote host's, which barge cannot
      // see: QEMU's own writes meet a full file system there.
      res.warnings.push_back("the free space on the host of " + r.remote_uri +
                             " was not checked: the image is that host's file");
    } else {
      // QEMU holds the image; the estimate reads the header and tables as
      // QEMU last wrote them, which is enough for a bound.
      BARGE_ASSIGN_OR_RETURN(auto source, env.OpenSource(r.image));
      auto estimate = formats::EstimateSnapshotCreateBytes(*source);
      if (!estimate.ok()) return WithImage(std::move(estimate).error(), r.image);
      BARGE_RETURN_IF_ERROR(CheckSpace(env, r.image, req.name, *estimate, req.space));
    }
    done = RunWithHooks(req.consistency.hooks, env_vars, [&]() -> Status {
      GuestFreeze freeze;
      if (quiesce) {
        Status frozen = freeze.Freeze(r.dom.get());
        if (!frozen.ok()) {
          return std::move(frozen).error().Wrap("cannot quiesce domain '" + req.target.domain +
                                                "' (is its guest agent running?)");
        }
      }
      Status made = QemuCreateInternalSnapshot(r.dom.get(), r.qemu, req.name);
      // The point in time is fixed (or the attempt failed): thaw at once.
      const std::string thaw = freeze.Thaw();
      if (!made.ok()) {
        Error e = std::move(made).error();
        if (!thaw.empty()) e.Also(Error::IoError(thaw));
        return e;
      }
      if (!thaw.empty()) {
        return Error::IoError("snapshot '" + req.name + "' was created, but " + thaw).set_path(r.image);
      }
      return OkStatus();
    }, &hooked);
    if (done.ok()) {
      BARGE_ASSIGN_OR_RETURN(QemuDisk now, FindQemuDisk(r.dom.get(), req.target.disk));
      for (const formats::SnapshotInfo& s : now.snapshots) {
        if (s.name == req.name) res.snapshot = s;
      }
    }
  }
  res.hooks = hooked.runs;
  res.warnings.insert(res.warnings.end(), hooked.warnings.begin(), hooked.warnings.end());
  if (!done.ok()) return std::move(done).error();
  StopPaused(r, res.warnings);
  return res;
}

Result<SnapshotOpResult> DeleteDiskSnapshot(Env& env, const SnapshotTarget& target, const std::string& id_or_name) {
  BARGE_ASSIGN_OR_RETURN(Resolved r, Resolve(target, RemoteOff::kStartPaused));
  SnapshotOpResult res;
  res.image = r.image;
  res.mode = r.online ? "online" : "offline";
  if (r.online) {
    BARGE_ASSIGN_OR_RETURN(formats::SnapshotInfo s, FindOnline(r, id_or_name));
    BARGE_ASSIGN_OR_RETURN(formats::SnapshotInfo deleted, QemuDeleteInternalSnapshot(r.dom.get(), r.qemu, s.id, s.name));
    res.snapshot = deleted.id.empty() ? s : deleted;
    StopPaused(r, res.warnings);
    return res;
  }
  BARGE_ASSIGN_OR_RETURN(Opened o, Open(env, r.image, false));
  auto deleted = formats::DeleteSnapshot(*o.source, *o.sink, id_or_name);
  if (!deleted.ok()) return WithImage(std::move(deleted).error(), r.image);
  res.snapshot = *deleted;
  return res;
}

Result<SnapshotOpResult> RenameDiskSnapshot(Env& env, const SnapshotTarget& target, const std::string& id_or_name,
                                            const std::string& new_name) {
  BARGE_RETURN_IF_ERROR(formats::qcow2::ValidateSnapshotName(new_name));
  BARGE_ASSIGN_OR_RETURN(Resolved r, Resolve(target, RemoteOff::kRefuse));
  if (r.online) {
    return Error::NotSupported("QEMU has no command to rename an internal snapshot, and barge does not edit "
                               "an image a running domain has open; rename it once domain '" +
                               target.domain + "' is shut off")
        .set_path(r.image);
  }
  SnapshotOpResult res;
  res.image = r.image;
  res.mode = "offline";
  BARGE_ASSIGN_OR_RETURN(Opened o, Open(env, r.image, false));
  auto renamed = formats::RenameSnapshot(*o.source, *o.sink, id_or_name, new_name);
  if (!renamed.ok()) return WithImage(std::move(renamed).error(), r.image);
  res.snapshot = *renamed;
  return res;
}

Result<SnapshotOpResult> RollbackDiskSnapshot(Env& env, const SnapshotTarget& target, const std::string& id_or_name,
                                              bool discard_newer) {
  BARGE_ASSIGN_OR_RETURN(Resolved r, Resolve(target, RemoteOff::kRefuse));
  if (r.online) {
    return Error::Busy("domain '" + target.domain +
                       "' is running: a rollback replaces the disk under the guest; shut the domain off "
                       "first (virsh shutdown " + target.domain + ")")
        .set_path(r.image);
  }
  SnapshotOpResult res;
  res.image = r.image;
  res.mode = "offline";
  BARGE_ASSIGN_OR_RETURN(Opened o, Open(env, r.image, false));
  auto rolled = formats::RollbackSnapshot(*o.source, *o.sink, id_or_name, discard_newer);
  if (!rolled.ok()) return WithImage(std::move(rolled).error(), r.image);
  res.snapshot = rolled->target;
  res.discarded = rolled->discarded;
  return res;
}

Result<SnapshotListing> ListDiskSnapshots(Env& env, const SnapshotTarget& target) {
  BARGE_ASSIGN_OR_RETURN(Resolved r, Resolve(target, RemoteOff::kStartPaused));
  SnapshotListing out;
  out.image = r.image;
  out.mode = r.online ? "online" : "offline";
  auto fill = [&](const formats::SnapshotMetricsReport& m) {
    out.cluster_size = m.cluster_size;
    out.active = m.active;
    out.has_usage = true;
  };
  if (!r.online) {
    BARGE_ASSIGN_OR_RETURN(Opened o, Open(env, r.image, true));
    auto metrics = formats::ComputeSnapshotMetrics(*o.source);
    if (!metrics.ok()) return WithImage(std::move(metrics).error(), r.image);
    fill(*metrics);
    for (const auto& s : metrics->snapshots) out.snapshots.push_back({s.info, s.usage, true});
    return out;
  }
  // QEMU's list is the truth; the file may lag behind QEMU's caches.
  std::map<std::string, formats::SnapshotUsage> usage;
  if (!r.remote_uri.empty()) {
    out.warnings.push_back("metrics unavailable for a domain on " + r.remote_uri +
                           ": they read the image file, which is on that host");
  } else {
    auto source = env.OpenSource(r.image);
    Result<formats::SnapshotMetricsReport> metrics =
        source.ok() ? formats::ComputeSnapshotMetrics(**source)
                    : Result<formats::SnapshotMetricsReport>(source.error());
    if (metrics.ok()) {
      fill(*metrics);
      for (const auto& s : metrics->snapshots) usage[s.info.id] = s.usage;
    } else {
      out.warnings.push_back("metrics unavailable while the domain runs: " + metrics.error().ToString());
    }
  }
  for (const formats::SnapshotInfo& s : r.qemu.snapshots) {
    SnapshotListEntry e{s, {}, false};
    if (auto it = usage.find(s.id); it != usage.end()) {
      e.usage = it->second;
      e.has_usage = true;
    }
    out.snapshots.push_back(e);
  }
  StopPaused(r, out.warnings);
  return out;
}

std::string SnapshotMetricsText(const SnapshotListing& listing,
                                const std::function<Labels(const SnapshotListEntry&)>& extra_labels) {
  auto escape = [](const std::string& v) {
    std::string out;
    for (char c : v) {
      if (c == '\\' || c == '"') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    return out;
  };
  struct Metric {
    const char* name;
    const char* help;
    std::function<double(const SnapshotListEntry&)> value;
  };
  const std::vector<Metric> metrics = {
      {"barge_snapshot_vol_size_bytes", "Disk size of the snapshot.",
       [](const SnapshotListEntry& e) { return double(e.usage.vol_size); }},
      {"barge_snapshot_referenced_bytes", "Bytes of the image file the snapshot references.",
       [](const SnapshotListEntry& e) { return double(e.usage.referenced); }},
      {"barge_snapshot_logical_referenced_bytes", "Guest bytes the snapshot maps to data.",
       [](const SnapshotListEntry& e) { return double(e.usage.logical_referenced); }},
      {"barge_snapshot_used_bytes", "Bytes deleting the snapshot would free.",
       [](const SnapshotListEntry& e) { return double(e.usage.used); }},
      {"barge_snapshot_written_bytes", "Data bytes written between the previous snapshot and this one.",
       [](const SnapshotListEntry& e) { return double(e.usage.written); }},
      {"barge_snapshot_compress_ratio", "Logical over stored bytes of the snapshot's data.",
       [](const SnapshotListEntry& e) { return e.usage.compress_ratio; }},
      {"barge_snapshot_creation_time_seconds", "When the snapshot was taken (Unix time).",
       [](const SnapshotListEntry& e) { return double(e.info.date_sec) + double(e.info.date_nsec) * 1e-9; }},
  };
  std::string out;
  for (const Metric& m : metrics) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n# TYPE " + m.name + " gauge\n";
    for (const SnapshotListEntry& e : listing.snapshots) {
      if (!e.has_usage && std::string(m.name) != "barge_snapshot_creation_time_seconds") continue;
      Labels labels = {{"image", listing.image}, {"id", e.info.id}, {"name", e.info.name}};
      if (extra_labels) {
        Labels more = extra_labels(e);
        labels.insert(labels.end(), more.begin(), more.end());
      }
      std::string l;
      for (const auto& [k, v] : labels) l += (l.empty() ? "" : ",") + k + "=\"" + escape(v) + "\"";
      char value[64];
      std::snprintf(value, sizeof value, "%.17g", m.value(e));
      out += std::string(m.name) + "{" + l + "} " + value + "\n";
    }
  }
  return out;
}

}  // namespace barge::orchestrate
