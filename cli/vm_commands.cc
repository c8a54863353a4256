// barge tracker|checkpoint|doctor|vm|cbt|catalog: orchestration of libvirt
// domains (trackers, checkpoints, VM backups, CBT overlays, the catalog).
#include <signal.h>

#include <cctype>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "blockio/s3_client.h"
#include "cli/catalog_json.h"
#include "cli/common.h"
#include "cli/connect_flag.h"
#include "cli/copy_flags.h"
#include "cli/group_flag.h"
#include "cli/hook_flags.h"
#include "cli/owner_flag.h"
#include "cli/progress.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/vm/hooked_backup.h"
#include "orchestrate/vm/instant_restore.h"
#include "cli/interrupt.h"
#include "pipeline/chain.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/vm/tracker.h"
#include "orchestrate/vm/tracker_admin.h"
#include "orchestrate/vm/vm_backup.h"
#include "orchestrate/vm/vm_dry_run.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/vm/vm_orphans.h"
#include "orchestrate/vm/vm_request.h"
#include "orchestrate/vm/vm_text.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Result<std::unique_ptr<orc::BackupCatalog>> OpenCatalog(const std::string& flag) {
  BARGE_ASSIGN_OR_RETURN(std::string path, orc::CatalogPathFromFlag(Env::Default(), flag));
  return orc::BackupCatalog::Open(Env::Default(), path);
}

// The catalog, a libvirt connection and one domain, opened together (the
// connection must outlive the domain: members are destroyed bottom up).
struct DomainSession {
  std::unique_ptr<orc::BackupCatalog> catalog;
  orc::VirConnection conn;
  orc::VirDomain dom;
};

Result<DomainSession> OpenDomainSession(const std::string& catalog_flag, const std::string& domain,
                                        const std::string& uri) {
  DomainSession s;
  BARGE_ASSIGN_OR_RETURN(s.catalog, OpenCatalog(catalog_flag));
  BARGE_ASSIGN_OR_RETURN(s.conn, orc::ConnectLibvirt(uri));
  BARGE_ASSIGN_OR_RETURN(s.dom, orc::LookupDomain(s.conn.get(), domain));
  return s;
}

}  // namespace

// Shared with `catalog list` (cli/catalog_json.h).
json TrackerJson(const orc::TrackerRecord& t) {
  json disks = json::array();
  for (const auto& [d, size] : t.disks) disks.push_back({{"name", d}, {"virtual_size", size}});
  json latest = t.latest_checkpoint.empty()
                    ? json(nullptr)
                    : json{{"name", t.latest_checkpoint}, {"created_at", t.checkpoint_created_at},
                           {"disks", disks}, {"host", t.host}};
  return {{"name", t.name}, {"domain", t.domain}, {"created_at", t.created_at}, {"latest_checkpoint", latest},
          {"needs_full", t.needs_full}, {"needs_full_reason", t.needs_full_reason}};
}

json BackupResultJson(const orc::VmBackupResult& r) {
  json disks = json::array();
  for (const auto& d : r.disks) {
    disks.push_back({{"disk", d.disk}, {"backup_type", d.incremental ? "incremental" : "full"},
                     {"reason", d.reason}, {"chain_dir", d.chain_dir}, {"image", d.image_path},
                     {"manifest", d.manifest_path}, {"virtual_size", d.virtual_size},
                     {"bytes_read", d.bytes_read}, {"bytes_written", d.bytes_written}});
    if (d.resume) {
      disks.back()["resume"] = {
          {"resumed", d.resume->resumed}, {"staged_bytes", d.resume->staged_bytes}, {"problem", d.resume->problem}};
    }
  }
  return {{"backup_type", Lower(r.backup_type)}, {"reason", r.reason}, {"checkpoint", r.checkpoint},
          {"parent_checkpoint", r.parent_checkpoint}, {"tracker", r.tracker}, {"mode", r.mode},
          {"transport", r.transport}, {"nbd_port", r.nbd_port},
          {"record_id", r.record_id}, {"disks", disks}, {"duration_seconds", r.seconds}};
}

json RecordJson(const orc::BackupRecord& r) {
  json disks = json::array();
  for (const auto& d : r.disks) {
    disks.push_back({{"disk", d.disk}, {"type", d.type}, {"reason", d.reason}, {"image", d.image_path},
                     {"virtual_size", d.virtual_size}, {"bytes_read", d.bytes_read},
                     {"bytes_written", d.bytes_written}});
  }
  return {{"id", r.id}, {"domain", r.domain}, {"tracker", r.tracker}, {"type", Lower(r.type)},
          {"reason", r.reason}, {"checkpoint", r.checkpoint}, {"parent_checkpoint", r.parent_checkpoint},
          {"target", r.target}, {"disks", disks}, {"started_at", r.started_at},
          // A running record has no end yet: null, not "" (times are RFC 3339).
          {"finished_at", r.finished_at.empty() ? json(nullptr) : json(r.finished_at)},
          {"duration_seconds", r.duration_seconds}, {"result", r.result},
          {"error", r.error}};
}

namespace {

json CbtJson(const orc::CbtStatus& s) {
  json disks = json::array();
  for (const auto& d : s.disks) disks.push_back({{"disk", d.disk}, {"data_file", d.data_file}, {"overlay", d.overlay}});
  json j = {{"domain", s.domain}, {"state", s.state}, {"state_dir", s.state_dir}, {"disks", disks}};
  if (!s.host.empty()) j["host"] = s.host;  // a domain on another host: where the paths are
  return j;
}

void RegisterTracker(CLI::App& app, int& exit_code) {
  auto* tracker = AddGroup(app, "tracker", "Backup trackers (latest checkpoint of a domain)");
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, std::string, std::string>>();
    auto* cmd = AddCommand(*tracker, "create", "Create an empty tracker for a domain", exit_code, [a](Output& out) {
      auto cat = OpenCatalog(std::get<2>(*a));
      if (!cat.ok()) return out.Fail(cat.error());
      Status s = orc::CreateTrackerForDomain(**cat, std::get<0>(*a), std::get<1>(*a), std::get<3>(*a));
      if (!s.ok()) return out.Fail(s.error());
      out.Result({{"tracker", std::get<0>(*a)}, {"domain", std::get<1>(*a)}});
      out.text() << "created tracker " << std::get<0>(*a) << " for domain " << std::get<1>(*a) << "\n";
      return int{kExitOk};
    });
    cmd->add_option("name", std::get<0>(*a), "Tracker name")->required();
    cmd->add_option("--domain", std::get<1>(*a), "libvirt domain")->required();
    cmd->add_option("--catalog", std::get<2>(*a), "Catalog database");
    AddConnectOption(cmd, std::get<3>(*a));
  }
  {
    auto a = std::make_shared<std::tuple<std::string, std::string>>();
    auto* cmd = AddCommand(*tracker, "list", "List trackers", exit_code, [a](Output& out) {
      auto cat = OpenCatalog(std::get<1>(*a));
      if (!cat.ok()) return out.Fail(cat.error());
      auto list = (*cat)->ListTrackers(std::get<0>(*a));
      if (!list.ok()) return out.Fail(list.error());
      json arr = json::array();
      for (const auto& t : *list) arr.push_back(TrackerJson(t));
      out.Result({{"trackers", arr}});
      for (const auto& t : *list) out.text() << orc::TrackerLine(t);
      return int{kExitOk};
    });
    cmd->add_option("--domain", std::get<0>(*a), "Only this domain's");
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
  }
  {
    auto a = std::make_shared<std::tuple<std::string, std::string>>();
    auto* cmd = AddCommand(*tracker, "show", "Show a tracker", exit_code, [a](Output& out) {
      auto cat = OpenCatalog(std::get<1>(*a));
      if (!cat.ok()) return out.Fail(cat.error());
      auto t = (*cat)->GetTracker(std::get<0>(*a));
      if (!t.ok()) return out.Fail(t.error());
      out.Result({{"tracker", TrackerJson(*t)}});
      out.text() << orc::TrackerText(*t);
      return int{kExitOk};
    });
    cmd->add_option("name", std::get<0>(*a), "Tracker name")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
  }
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, std::string>>();
    auto* cmd = AddCommand(*tracker, "delete", "Delete a tracker (and its libvirt checkpoint)", exit_code,
                           [a](Output& out) {
      auto cat = OpenCatalog(std::get<1>(*a));
      if (!cat.ok()) return out.Fail(cat.error());
      auto d = orc::DeleteTrackerAndCheckpoint(**cat, std::get<0>(*a), std::get<2>(*a));
      if (!d.ok()) return out.Fail(d.error());
      if (!d->warning.empty()) out.Warning(d->warning);
      out.Result({{"tracker", d->tracker}, {"checkpoint_deleted", d->checkpoint_deleted}});
      out.text() << "deleted tracker " << d->tracker << "\n";
      return int{kExitOk};
    });
    cmd->add_option("name", std::get<0>(*a), "Tracker name")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    AddConnectOption(cmd, std::get<2>(*a));
  }
}

// A disk's planned backup as doctor and `vm backup --dry-run` show it
// (docs/json.md): its type and reason, and what becomes of the data a
// killed run staged for it.
json DiskPlanJson(const orc::DiskPlan& p) {
  return {{"disk", p.disk}, {"backup_type", p.incremental ? "incremental" : "full"}, {"reason", p.reason},
          {"staged", p.staged}, {"resume_from", p.resume_from}, {"resume_refused", p.resume_refused}};
}
// doctor's "backup_job": the domain's backup job as barge sees it.
json BackupJobJson(const orc::BackupJobState& j) {
  json r = {{"state", j.state}, {"job_active", j.job_active}, {"message", j.message}};
  if (j.state == "orphaned" || j.state == "running") {
    auto owner = orc::ProcessOwner::Parse(j.record.owner);
    r["owner_pid"] = owner.ok() ? owner->pid : 0;
    r["socket"] = j.record.socket;
    r["scratch_dir"] = j.record.scratch_dir;
    r["checkpoint"] = j.record.checkpoint;
  } else if (j.state == "foreign") {
    r["socket"] = j.job_socket;
  }
  return r;
}

void RegisterCheckpointAndDoctor(CLI::App& app, int& exit_code) {
  auto* cp = AddGroup(app, "checkpoint", "libvirt checkpoints of trackers");
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, std::string>>();
    auto* cmd = AddCommand(*cp, "redefine", "Redefine trackers' checkpoints libvirt lost (after a libvirtd restart)",
                           exit_code, [a](Output& out) {
      auto session = OpenDomainSession(std::get<1>(*a), std::get<0>(*a), std::get<2>(*a));
      if (!session.ok()) return out.Fail(session.error());
      auto r = orc::RedefineCheckpoints(*session->catalog, session->dom.get(), std::get<0>(*a));
      if (!r.ok()) return out.Fail(r.error());
      json arr = json::array();
      for (const auto& o : *r) {
        arr.push_back({{"tracker", o.tracker}, {"checkpoint", o.checkpoint}, {"action", o.action}, {"reason", o.reason}});
      }
      out.Result({{"domain", std::get<0>(*a)}, {"checkpoints", arr}});
      out.text() << orc::RedefineText(*r);
      const std::string failures = orc::RedefineFailures(*r);
      // The per-tracker result first, then the error (docs/json.md).
      if (!failures.empty()) {
        return out.Fail(Error::IoError("domain '" + std::get<0>(*a) + "': checkpoints not redefined: " + failures));
      }
      return int{kExitOk};
    });
    cmd->add_option("--domain", std::get<0>(*a), "libvirt domain")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    AddConnectOption(cmd, std::get<2>(*a));
  }
  auto a = std::make_shared<std::tuple<std::string, std::string, std::string, std::string, std::string>>();
  auto* doc = AddCommand(app, "doctor", "What barge and libvirt know about a domain's backups", exit_code,
                         [a](Output& out) {
    auto session = OpenDomainSession(std::get<1>(*a), std::get<0>(*a), std::get<4>(*a));
    if (!session.ok()) return out.Fail(session.error());
    auto r = orc::Diagnose(*session->catalog, session->dom.get(), std::get<0>(*a), std::get<2>(*a),
                           std::get<3>(*a));
    if (!r.ok()) return out.Fail(r.error());
    auto job = orc::InspectBackupJob(Env::Default(), session->catalog->path(), session->dom.get(), std::get<0>(*a));
    if (!job.ok()) return out.Fail(job.error());
    auto stale = orc::FindStaleCheckpoints(*session->catalog, session->dom.get(), std::get<0>(*a));
    if (!stale.ok()) out.Warning("checkpoints whose bitmaps are gone were not looked for: " + stale.error().message());
    const std::vector<orc::StaleCheckpoint> stale_list = stale.ok() ? *stale : std::vector<orc::StaleCheckpoint>{};
    json stale_json = json::array();
    for (const auto& c : stale_list) stale_json.push_back({{"name", c.name}, {"barge", c.barges}, {"disks", c.disks}});
    json trackers = json::array();
    for (const auto& t : r->trackers) trackers.push_back(TrackerJson(t));
    json cps = json::array();
    for (const auto& c : r->tracker_checkpoints) {
      json disks = json::object();
      for (const auto& [d, f] : c.disks) disks[d] = f;
      cps.push_back({{"name", c.name}, {"in_libvirt", c.in_libvirt}, {"disks", disks}});
    }
    json next = json::array();
    for (const auto& p : r->next_backup) next.push_back(DiskPlanJson(p));
    out.Result({{"domain", r->domain}, {"state", r->state}, {"running", r->running}, {"trackers", trackers},
                {"libvirt_checkpoints", r->libvirt_checkpoints}, {"tracker_checkpoints", cps},
                {"next_tracker", r->next_tracker}, {"next_mode", r->next_mode}, {"next_refusal", r->next_refusal},
                {"next_backup", next}, {"backup_job", BackupJobJson(*job)}, {"stale_checkpoints", stale_json}});
    out.text() << orc::DoctorText(*r, *job, stale_list);
    return int{kExitOk};
  });
  doc->add_option("--domain", std::get<0>(*a), "libvirt domain")->required();
  doc->add_option("--catalog", std::get<1>(*a), "Catalog database");
  doc->add_option("--target", std::get<2>(*a),
                  "Backup folder the forecast checks the chains of (as vm backup --target)");
  doc->add_option("--tracker", std::get<3>(*a), "Forecast for this tracker (default: as vm backup picks)");
  AddConnectOption(doc, std::get<4>(*a));
}

// Progress of a VM backup's disks, copied in parallel: under --json one
// `progress` event stream per disk (job "vm backup", `disk` naming it), on
// a terminal one bar over the disks reported so far. Thread-safe.
class VmBackupProgress {
 public:
  explicit VmBackupProgress(Output& out) : out_(out), bar_(out, "vm backup") {}

  void Update(const std::string& disk, uint64_t done, uint64_t total) {
    if (out_.json()) {
      ProgressReporter* r = nullptr;
      {
        std::lock_guard lock(mu_);
        auto& slot = per_disk_[disk];
        if (!slot) slot = std::make_unique<ProgressReporter>(out_, "vm backup", json{{"disk", disk}}, start_);
        r = slot.get();
      }
      r->Update(done, total);
      return;
    }
    uint64_t all_done = 0;
    uint64_t all_total = 0;
    {
      std::lock_guard lock(mu_);
      sums_[disk] = {done, total};
      for (const auto& [d, v] : sums_) {
        all_done += v.first;
        all_total += v.second;
      }
    }
    bar_.Update(all_done, all_total);
  }
  void Done() { bar_.Done(); }

 private:
  Output& out_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<ProgressReporter>> per_disk_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> sums_;
  ProgressReporter bar_;
};

struct VmBackupArgs {
  orc::VmBackupRequest req;
  std::string catalog;
  std::vector<std::string> disks;
  CopyFlags copy;
  HookFlags hooks;
  std::string port_range = orc::kDefaultNbdPortRange;
  std::string group;  // --group
  bool dry_run = false;
};

// `vm backup --dry-run`: per disk what the run would do (orc::DryRunVmBackup,
// the run's own planner), or the refusal it would stop with, then exiting
// as the run would. Changes nothing.
int PrintVmBackupPlan(Output& out, const orc::VmBackupRequest& req) {
  auto run = orc::DryRunVmBackupRun(Env::Default(), req);
  if (!run.ok()) return out.Fail(run.error());
  const orc::VmBackupForecast* f = &run->forecast;
  json disks = json::array();
  for (const auto& p : f->disks) disks.push_back(DiskPlanJson(p));
  out.Result({{"dry_run", true}, {"domain", req.domain}, {"tracker", f->tracker}, {"mode", f->mode},
              {"refusal", f->refusal}, {"disks", disks}});
  out.text() << orc::VmBackupPlanText(req.domain, *f);
  // Refused: the run's error and exit code after the plan.
  return run->refused ? out.Fail(*run->refused) : int{kExitOk};
}

void RegisterVmBackup(CLI::App* vm, int& exit_code) {
  auto a = std::make_shared<VmBackupArgs>();
  auto* cmd = AddCommand(*vm, "backup", "Full or incremental backup of a domain's disks (libvirt pull mode)",
                         exit_code, [a](Output& out) {
    orc::VmBackupRequest req = a->req;
    auto catalog_path = orc::CatalogPathFromFlag(Env::Default(), a->catalog);
    if (!catalog_path.ok()) return out.Fail(catalog_path.error());
    req.catalog_path = *catalog_path;
    req.disks = a->disks;
    // A bucket's staged upload is not resumable yet (docs/s3.md): its
    // journal would open the staged object in place. As `backup` does.
    req.resume = req.resume && !IsS3Url(req.target);
    auto ports = orc::ParsePortRange(a->port_range);
    if (!ports.ok()) return out.Usage("--nbd-port-range: " + ports.error().message());
    req.nbd_ports = *ports;
    auto access = GroupFlagAccess(a->group);
    if (!access.ok()) return out.Usage(access.error().message());
    req.access = *access;
    auto ambiguous = orc::SettleTracker(Env::Default(), req);
    if (!ambiguous.ok()) return out.Fail(ambiguous.error());
    if (!ambiguous->empty()) return out.Usage(*ambiguous);
    if (a->dry_run) return PrintVmBackupPlan(out, req);
    formats::CompressionSpec compression;
    if (Status s = a->copy.Apply(req.copy, compression); !s.ok()) return out.Usage(s.error().message());
    req.compression = compression.type;
    req.compression_level = compression.level;
    auto hooks = a->hooks.ToSpec();
    if (!hooks.ok()) return out.Usage(hooks.error().message());
    orc::HookedResult hooked;
    VmBackupProgress progress(out);
    req.progress = [&progress](const std::string& disk, uint64_t done, uint64_t total) {
      progress.Update(disk, done, total);
    };
    auto r = orc::RunVmBackupWithHooks(Env::Default(), req, *hooks, hooked);
    progress.Done();
    for (const auto& w : hooked.warnings) out.Warning(w, req.domain);
    if (!r.ok()) return out.Fail(r.error());
    for (const auto& w : r->warnings) out.Warning(w, req.domain);
    json result = BackupResultJson(*r);
    if (!hooked.runs.empty()) result["hooks"] = HookRunsJson(hooked.runs);
    out.Result(result);
    out.text() << orc::VmBackupResultText(req.domain, *r) << HookRunsText(hooked.runs);
    return int{kExitOk};
  });
  cmd->add_option("--domain", a->req.domain, "libvirt domain")->required();
  cmd->add_option("--tracker", a->req.tracker, "Tracker (default: the domain's only tracker)");
  cmd->add_option("--target", a->req.target, "Backup folder; chains go to TARGET/<domain>/<disk>/")->required();
  AddGroupFlag(cmd, a->group, "the domain's chains (a chain made with a group stays the group's)");
  cmd->add_flag("--force-full", a->req.force_full, "Full backup even when an incremental is possible");
  cmd->add_flag("--skip-quiesce", a->req.skip_quiesce, "Do not freeze guest filesystems (no guest agent)");
  cmd->add_flag_callback(
      "--no-resume", [a] { a->req.resume = false; },
      "Do not resume what a killed run staged (its data and checkpoint are removed; the run starts over)");
  cmd->add_flag("--dry-run", a->dry_run,
                "Only say what the run would do per disk (full, incremental, resume, and why); changes nothing");
  cmd->add_option("--disks", a->disks, "Only these disks (vda,vdb)")->delimiter(',');
  cmd->add_option("--scratch-dir", a->req.scratch_dir,
                  "Existing folder QEMU can see for the job's scratch files (default: /var/tmp)");
  cmd->add_option("--catalog", a->catalog, "Catalog database");
  AddConnectOption(cmd, a->req.libvirt_uri);
  AddAllowOtherOwnerFlag(cmd);
  cmd->add_option("--tls-certificates", a->req.nbd.tls_certificates,
                  "A remote domain's NBD export over TCP with TLS (needed with qemu+tls://; with qemu+ssh:// instead "
                  "of the ssh forward): folder of the client's ca-cert.pem, client-cert.pem, client-key.pem");
  cmd->add_option("--nbd-port-range", a->port_range,
                  std::string("TCP ports for a remote TLS export, LO-HI, one per running job on a host "
                              "(default: ") + orc::kDefaultNbdPortRange + ")");
  cmd->add_option("--nbd-connections", a->req.nbd.connections,
                  "NBD connections per disk to the job's export (multi-conn; default 0 = automatic: 4, over TLS "
                  "one per core up to 4)")
      ->check(CLI::Range(0, 64));
  a->hooks.AddTo(cmd);
  a->copy.AddTo(cmd, DefaultCompression());
}

void RegisterInstantRestore(CLI::App& vm, int& exit_code) {
  {
    struct InstantArgs {
      orc::InstantRestoreRequest req;
      std::string catalog;
      std::string port_range = orc::kDefaultNbdPortRange;
    };
    auto ia = std::make_shared<InstantArgs>();
    auto* ir = AddCommand(vm, "instant-restore",
                          "Start a shut-off domain at once on a backup point (verified export + overlay), then move "
                          "its disk to DISK under the running domain (block copy), verify and pivot",
                          exit_code, [ia](Output& out) {
      orc::InstantRestoreRequest req = ia->req;
      if (auto at = pipeline::ParsePointSelector(req.at); !at.ok()) return out.Usage("--at: " + at.error().message());
      auto ports = orc::ParsePortRange(ia->port_range);
      if (!ports.ok()) return out.Usage("--nbd-port-range: " + ports.error().message());
      req.port_range = *ports;
      auto catalog_path = orc::CatalogPathFromFlag(Env::Default(), ia->catalog);
      if (!catalog_path.ok()) return out.Fail(catalog_path.error());
      req.catalog_path = *catalog_path;
      req.cancel = &CancelFlag();
      req.on_phase = [&out, &req](const std::string& phase, const std::string& text) {
        out.Event("phase", {{"phase", phase}, {"domain", req.domain}, {"message", text}});
        out.text() << text << "\n";
        out.text().flush();
      };
      ProgressReporter bar(out, "copy");
      req.on_progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
      auto r = orc::RunInstantRestore(Env::Default(), req);
      bar.Done();
      if (!r.ok()) return out.Fail(r.error());
      out.Result({{"domain", req.domain}, {"target", r->target}, {"disk", r->disk}, {"id", r->point_id},
                  {"resumed", r->resumed}, {"abandoned", r->abandoned}, {"started_seconds", r->started_seconds},
                  {"verified_bytes", r->verified_bytes}, {"guest_written_bytes", r->guest_written_bytes},
                  {"nbdkit_pid", r->nbdkit_pid}, {"duration_seconds", r->seconds}});
      out.text() << orc::InstantRestoreText(req.domain, *r);
      return int{kExitOk};
    });
    ir->add_option("chain", ia->req.chain, "The disk's chain folder (or a backup's manifest or image)")->required();
    ir->add_option("--at", ia->req.at, "The point: latest (default), a position, a backup id, or an RFC 3339 time");
    ir->add_option("--domain", ia->req.domain, "The shut-off libvirt domain to start on the point")->required();
    ir->add_option("--to", ia->req.disk,
                   "DISK: the raw file the domain's disk ends on (with a remote --connect: an absolute path on the "
                   "host, in a folder that exists there)")
        ->required();
    ir->add_option("--target", ia->req.target, "The domain's disk to replace (vda); needed with several disks");
    ir->add_flag("--force", ia->req.force, "Replace an existing DISK");
    ir->add_flag("--abandon", ia->req.abandon,
                 "Give up an unfinished restore of the shut-off domain: its original disk back, the overlay "
                 "(guest writes) and DISK removed");
    ir->add_option("--catalog", ia->catalog, "Catalog database (its locks folder keeps the run's record)");
    AddConnectOption(ir, ia->req.libvirt_uri);
    AddAllowOtherOwnerFlag(ir);
    ir->add_option("--tls-certificates", ia->req.tls_certificates,
                   "A remote domain reads the export over TCP with TLS (required with a remote --connect): folder "
                   "of nbdkit's ca-cert.pem, server-cert.pem, server-key.pem, the certificate naming this machine's "
                   "address as the host reaches it");
    ir->add_option("--nbd-port-range", ia->port_range,
                   std::string("This machine's TCP ports for a remote domain's export, LO-HI (default: ") +
                       orc::kDefaultNbdPortRange + ")");
  }
}

void RegisterRecords(CLI::App& app, CLI::App& vm, int& exit_code) {
  auto b = std::make_shared<std::tuple<std::string, std::string>>();
  auto* list = AddCommand(vm, "backups", "Backup records of the catalog", exit_code, [b](Output& out) {
    auto cat = OpenCatalog(std::get<1>(*b));
    if (!cat.ok()) return out.Fail(cat.error());
    auto recs = (*cat)->ListBackups(std::get<0>(*b));
    if (!recs.ok()) return out.Fail(recs.error());
    json arr = json::array();
    for (const auto& r : *recs) arr.push_back(RecordJson(r));
    out.Result({{"backups", arr}});
    for (const auto& r : *recs) {
      out.text() << r.id << "  " << r.domain << "  " << Lower(r.type) << "  " << r.started_at << "  " << r.result
                 << (r.error.empty() ? "" : ": " + r.error) << "\n";
    }
    return int{kExitOk};
  });
  list->add_option("--domain", std::get<0>(*b), "Only this domain's");
  list->add_option("--catalog", std::get<1>(*b), "Catalog database");
  auto c = std::make_shared<std::tuple<std::string, std::string>>();
  auto* cat_cmd = AddGroup(app, "catalog", "The backup catalog");
  auto* rebuild = AddCommand(*cat_cmd, "rebuild", "Re-create backup records from a backup folder's manifests",
                             exit_code, [c](Output& out) {
    auto cat = OpenCatalog(std::get<1>(*c));
    if (!cat.ok()) return out.Fail(cat.error());
    auto n = (*cat)->RebuildFromTarget(std::get<0>(*c));
    if (!n.ok()) return out.Fail(n.error());
    out.Result({{"target", std::get<0>(*c)}, {"records", *n}});
    out.text() << "rebuilt " << *n << " backup records from " << std::get<0>(*c) << "\n";
    return int{kExitOk};
  });
  rebuild->add_option("--target", std::get<0>(*c), "Backup folder (TARGET/<domain>/<disk>/)")->required();
  rebuild->add_option("--catalog", std::get<1>(*c), "Catalog database");
}

void RegisterCbt(CLI::App& app, int& exit_code) {
  auto* cbt = AddGroup(app, "cbt", "Changed-block tracking for raw disks (qcow2 overlay with a bitmap)");
  for (const char* verb : {"enable", "disable", "status"}) {
    auto a = std::make_shared<std::tuple<orc::CbtRequest, std::string>>();
    std::string v = verb;
    std::string what = v == "status" ? "CBT state of a domain"
                       : v + " CBT for a shut-off domain (a running one is refused)";
    auto* cmd = AddCommand(*cbt, verb, what, exit_code, [a, v](Output& out) {
      orc::CbtRequest req = std::get<0>(*a);
      auto catalog_path = orc::CatalogPathFromFlag(Env::Default(), std::get<1>(*a));
      if (!catalog_path.ok()) return out.Fail(catalog_path.error());
      req.catalog_path = *catalog_path;
      auto s = v == "enable" ? orc::EnableCbt(Env::Default(), req)
                             : v == "disable" ? orc::DisableCbt(Env::Default(), req)
                                              : orc::GetCbtStatus(Env::Default(), req);
      if (!s.ok()) return out.Fail(s.error());
      out.Result(CbtJson(*s));
      out.text() << orc::CbtStatusText(*s);
      return int{kExitOk};
    });
    cmd->add_option("--domain", std::get<0>(*a).domain, "libvirt domain")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    AddConnectOption(cmd, std::get<0>(*a).libvirt_uri);
    if (v == "enable") {
      cmd->add_option("--state-dir", std::get<0>(*a).state_dir,
                      "Where overlays go (default: beside the catalog; a remote domain's go beside its raw disks)");
    }
  }
}

}  // namespace

void RegisterVmCommands(CLI::App& app, int& exit_code) {
  RegisterTracker(app, exit_code);
  RegisterCheckpointAndDoctor(app, exit_code);
  auto* vm = AddGroup(app, "vm", "Backups of libvirt domains");
  RegisterVmBackup(vm, exit_code);
  RegisterInstantRestore(*vm, exit_code);
  RegisterRecords(app, *vm, exit_code);
  RegisterCbt(app, exit_code);
}

}  // namespace barge::cli
