// barge tracker|checkpoint|doctor|vm|cbt|catalog: orchestration of libvirt
// domains (trackers, checkpoints, VM backups, CBT overlays, the catalog).
#include <iostream>

#include "cli/common.h"
#include "cli/copy_flags.h"
#include "orchestrate/backup_catalog.h"
#include "orchestrate/catalog_path.h"
#include "orchestrate/cbt.h"
#include "orchestrate/libvirt_conn.h"
#include "orchestrate/tracker.h"
#include "orchestrate/vm_backup.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

Result<std::unique_ptr<orc::BackupCatalog>> OpenCatalog(const std::string& flag) {
  return orc::BackupCatalog::Open(orc::ResolveCatalogPath(flag));
}

// The catalog, a libvirt connection and one domain, opened together (the
// connection must outlive the domain: members are destroyed bottom up).
struct DomainSession {
  std::unique_ptr<orc::BackupCatalog> catalog;
  orc::VirConnection conn;
  orc::VirDomain dom;
};

Result<DomainSession> OpenDomainSession(const std::string& catalog_flag, const std::string& domain) {
  DomainSession s;
  BARGE_ASSIGN_OR_RETURN(s.catalog, OpenCatalog(catalog_flag));
  BARGE_ASSIGN_OR_RETURN(s.conn, orc::ConnectLibvirt());
  BARGE_ASSIGN_OR_RETURN(s.dom, orc::LookupDomain(s.conn.get(), domain));
  return s;
}

json TrackerJson(const orc::TrackerRecord& t) {
  json disks = json::array();
  for (const auto& [d, size] : t.disks) disks.push_back({{"name", d}, {"size", size}});
  json latest = t.latest_checkpoint.empty()
                    ? json(nullptr)
                    : json{{"name", t.latest_checkpoint}, {"creationTime", t.checkpoint_created_at},
                           {"disks", disks}};
  return {{"name", t.name}, {"domain", t.domain}, {"createdAt", t.created_at}, {"latestCheckpoint", latest},
          {"needsFull", t.needs_full}, {"needsFullReason", t.needs_full_reason}};
}

json BackupResultJson(const orc::VmBackupResult& r) {
  json disks = json::array();
  for (const auto& d : r.disks) {
    disks.push_back({{"disk", d.disk}, {"backupType", d.incremental ? "Incremental" : "Full"},
                     {"reason", d.reason}, {"chainDir", d.chain_dir}, {"image", d.image_path},
                     {"manifest", d.manifest_path}, {"virtualSize", d.virtual_size},
                     {"bytesRead", d.bytes_read}, {"bytesWritten", d.bytes_written}});
  }
  return {{"backupType", r.backup_type}, {"reason", r.reason}, {"checkpointName", r.checkpoint},
          {"parentCheckpoint", r.parent_checkpoint}, {"tracker", r.tracker}, {"mode", r.mode},
          {"recordId", r.record_id}, {"disks", disks}, {"durationSeconds", r.seconds}};
}

json RecordJson(const orc::BackupRecord& r) {
  json disks = json::array();
  for (const auto& d : r.disks) {
    disks.push_back({{"disk", d.disk}, {"type", d.type}, {"reason", d.reason}, {"image", d.image_path},
                     {"virtualSize", d.virtual_size}, {"bytesRead", d.bytes_read},
                     {"bytesWritten", d.bytes_written}});
  }
  return {{"id", r.id}, {"domain", r.domain}, {"tracker", r.tracker}, {"type", r.type},
          {"reason", r.reason}, {"checkpoint", r.checkpoint}, {"parentCheckpoint", r.parent_checkpoint},
          {"target", r.target}, {"disks", disks}, {"startedAt", r.started_at},
          {"finishedAt", r.finished_at}, {"durationSeconds", r.duration_seconds}, {"result", r.result},
          {"error", r.error}};
}

json CbtJson(const orc::CbtStatus& s) {
  json disks = json::array();
  for (const auto& d : s.disks) disks.push_back({{"disk", d.disk}, {"dataFile", d.data_file}, {"overlay", d.overlay}});
  return {{"domain", s.domain}, {"state", s.state}, {"stateDir", s.state_dir}, {"disks", disks}};
}

void RegisterTracker(CLI::App& app, int& exit_code) {
  auto* tracker = app.add_subcommand("tracker", "Backup trackers (latest checkpoint of a domain)");
  tracker->require_subcommand(1);
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, std::string>>();
    auto* cmd = tracker->add_subcommand("create", "Create an empty tracker for a domain");
    cmd->add_option("name", std::get<0>(*a), "Tracker name")->required();
    cmd->add_option("--domain", std::get<1>(*a), "libvirt domain")->required();
    cmd->add_option("--catalog", std::get<2>(*a), "Catalog database");
    cmd->callback([a, &exit_code] {
      auto cat = OpenCatalog(std::get<2>(*a));
      if (!cat.ok()) { exit_code = ReportError(cat.error()); return; }
      auto conn = orc::ConnectLibvirt();
      if (!conn.ok()) { exit_code = ReportError(conn.error()); return; }
      if (auto d = orc::LookupDomain(conn->get(), std::get<1>(*a)); !d.ok()) {
        exit_code = ReportError(d.error());
        return;
      }
      if (Status s = (*cat)->CreateTracker(std::get<0>(*a), std::get<1>(*a)); !s.ok()) {
        exit_code = ReportError(s.error());
        return;
      }
      std::cout << "created tracker " << std::get<0>(*a) << " for domain " << std::get<1>(*a) << "\n";
    });
  }
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, bool>>();
    auto* cmd = tracker->add_subcommand("list", "List trackers");
    cmd->add_option("--domain", std::get<0>(*a), "Only this domain's");
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    cmd->add_flag("--json", std::get<2>(*a), "JSON output");
    cmd->callback([a, &exit_code] {
      auto cat = OpenCatalog(std::get<1>(*a));
      if (!cat.ok()) { exit_code = ReportError(cat.error()); return; }
      auto list = (*cat)->ListTrackers(std::get<0>(*a));
      if (!list.ok()) { exit_code = ReportError(list.error()); return; }
      if (std::get<2>(*a)) {
        json arr = json::array();
        for (const auto& t : *list) arr.push_back(TrackerJson(t));
        PrintJson(arr);
        return;
      }
      for (const auto& t : *list) {
        std::cout << t.name << "\t" << t.domain << "\t"
                  << (t.latest_checkpoint.empty() ? "-" : t.latest_checkpoint)
                  << (t.needs_full ? "\tneeds full: " + t.needs_full_reason : "") << "\n";
      }
    });
  }
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, bool>>();
    auto* cmd = tracker->add_subcommand("show", "Show a tracker");
    cmd->add_option("name", std::get<0>(*a), "Tracker name")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    cmd->add_flag("--json", std::get<2>(*a), "JSON output");
    cmd->callback([a, &exit_code] {
      auto cat = OpenCatalog(std::get<1>(*a));
      if (!cat.ok()) { exit_code = ReportError(cat.error()); return; }
      auto t = (*cat)->GetTracker(std::get<0>(*a));
      if (!t.ok()) { exit_code = ReportError(t.error()); return; }
      if (std::get<2>(*a)) { PrintJson(TrackerJson(*t)); return; }
      std::cout << "tracker:           " << t->name << "\ndomain:            " << t->domain
                << "\ncreated:           " << t->created_at << "\nlatest checkpoint: "
                << (t->latest_checkpoint.empty() ? "(none)" : t->latest_checkpoint + " at " + t->checkpoint_created_at)
                << "\n";
      for (const auto& [d, size] : t->disks) std::cout << "  disk " << d << ": " << HumanBytes(size) << "\n";
      if (t->needs_full) std::cout << "next backup:       full (" << t->needs_full_reason << ")\n";
    });
  }
  {
    auto a = std::make_shared<std::tuple<std::string, std::string>>();
    auto* cmd = tracker->add_subcommand("delete", "Delete a tracker (and its libvirt checkpoint)");
    cmd->add_option("name", std::get<0>(*a), "Tracker name")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    cmd->callback([a, &exit_code] {
      auto cat = OpenCatalog(std::get<1>(*a));
      if (!cat.ok()) { exit_code = ReportError(cat.error()); return; }
      auto t = (*cat)->GetTracker(std::get<0>(*a));
      if (!t.ok()) { exit_code = ReportError(t.error()); return; }
      if (!t->latest_checkpoint.empty()) {
        if (auto conn = orc::ConnectLibvirt(); conn.ok()) {
          if (auto d = orc::LookupDomain(conn->get(), t->domain); d.ok()) {
            (void)orc::DeleteCheckpoint(d->get(), t->latest_checkpoint);
          }
        }
      }
      if (Status s = (*cat)->DeleteTracker(t->name); !s.ok()) { exit_code = ReportError(s.error()); return; }
      std::cout << "deleted tracker " << t->name << "\n";
    });
  }
}

void RegisterCheckpointAndDoctor(CLI::App& app, int& exit_code) {
  auto* cp = app.add_subcommand("checkpoint", "libvirt checkpoints of trackers");
  cp->require_subcommand(1);
  {
    auto a = std::make_shared<std::tuple<std::string, std::string, bool>>();
    auto* cmd = cp->add_subcommand("redefine",
                                   "Redefine trackers' checkpoints libvirt lost (after a libvirtd restart)");
    cmd->add_option("--domain", std::get<0>(*a), "libvirt domain")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    cmd->add_flag("--json", std::get<2>(*a), "JSON output");
    cmd->callback([a, &exit_code] {
      auto session = OpenDomainSession(std::get<1>(*a), std::get<0>(*a));
      if (!session.ok()) { exit_code = ReportError(session.error()); return; }
      auto out = orc::RedefineCheckpoints(*session->catalog, session->dom.get(), std::get<0>(*a));
      if (!out.ok()) { exit_code = ReportError(out.error()); return; }
      if (std::get<2>(*a)) {
        json arr = json::array();
        for (const auto& o : *out) {
          arr.push_back({{"tracker", o.tracker}, {"checkpoint", o.checkpoint}, {"action", o.action},
                         {"reason", o.reason}});
        }
        PrintJson(arr);
        return;
      }
      for (const auto& o : *out) {
        std::cout << o.tracker << ": " << (o.checkpoint.empty() ? "(no checkpoint)" : o.checkpoint) << " "
                  << o.action << (o.reason.empty() ? "" : " (" + o.reason + "; next backup is full)") << "\n";
      }
    });
  }
  auto a = std::make_shared<std::tuple<std::string, std::string, bool>>();
  auto* doc = app.add_subcommand("doctor", "What barge and libvirt know about a domain's backups");
  doc->add_option("--domain", std::get<0>(*a), "libvirt domain")->required();
  doc->add_option("--catalog", std::get<1>(*a), "Catalog database");
  doc->add_flag("--json", std::get<2>(*a), "JSON output");
  doc->callback([a, &exit_code] {
    auto session = OpenDomainSession(std::get<1>(*a), std::get<0>(*a));
    if (!session.ok()) { exit_code = ReportError(session.error()); return; }
    auto r = orc::Diagnose(*session->catalog, session->dom.get(), std::get<0>(*a));
    if (!r.ok()) { exit_code = ReportError(r.error()); return; }
    json trackers = json::array();
    for (const auto& t : r->trackers) trackers.push_back(TrackerJson(t));
    json cps = json::array();
    for (const auto& c : r->tracker_checkpoints) {
      json disks = json::object();
      for (const auto& [d, f] : c.disks) disks[d] = f;
      cps.push_back({{"name", c.name}, {"inLibvirt", c.in_libvirt}, {"disks", disks}});
    }
    json next = json::array();
    for (const auto& p : r->next_backup) {
      next.push_back({{"disk", p.disk}, {"backupType", p.incremental ? "Incremental" : "Full"}, {"reason", p.reason}});
    }
    if (std::get<2>(*a)) {
      PrintJson({{"domain", r->domain}, {"running", r->running}, {"trackers", trackers},
                 {"libvirtCheckpoints", r->libvirt_checkpoints}, {"trackerCheckpoints", cps},
                 {"nextTracker", r->next_tracker}, {"nextBackup", next}});
      return;
    }
    std::cout << "domain " << r->domain << (r->running ? " (running)" : " (not running)") << "\n";
    for (const auto& t : r->trackers) {
      std::cout << "tracker " << t.name << ": checkpoint "
                << (t.latest_checkpoint.empty() ? "(none)" : t.latest_checkpoint)
                << (t.needs_full ? ", needs full: " + t.needs_full_reason : "") << "\n";
    }
    std::cout << "libvirt checkpoints:";
    for (const auto& n : r->libvirt_checkpoints) std::cout << " " << n;
    std::cout << (r->libvirt_checkpoints.empty() ? " (none)\n" : "\n");
    for (const auto& c : r->tracker_checkpoints) {
      std::cout << "checkpoint " << c.name << ": " << (c.in_libvirt ? "in libvirt" : "MISSING in libvirt") << "\n";
      for (const auto& [d, f] : c.disks) std::cout << "  " << d << ": " << f << "\n";
    }
    std::cout << "next backup" << (r->next_tracker.empty() ? "" : " (tracker " + r->next_tracker + ")") << ":\n";
    for (const auto& p : r->next_backup) {
      std::cout << "  " << p.disk << ": " << (p.incremental ? "incremental" : "full") << " (" << p.reason << ")\n";
    }
  });
}

struct VmBackupArgs {
  orc::VmBackupRequest req;
  std::string catalog;
  std::vector<std::string> disks;
  CopyFlags copy;
  bool as_json = false;
};

void RegisterVm(CLI::App& app, int& exit_code) {
  auto* vm = app.add_subcommand("vm", "Backups of libvirt domains");
  vm->require_subcommand(1);
  auto a = std::make_shared<VmBackupArgs>();
  auto* cmd = vm->add_subcommand("backup", "Full or incremental backup of a domain's disks (libvirt pull mode)");
  cmd->add_option("--domain", a->req.domain, "libvirt domain")->required();
  cmd->add_option("--tracker", a->req.tracker, "Tracker (default: the domain's only tracker)");
  cmd->add_option("--target", a->req.target, "Backup folder; chains go to TARGET/<domain>/<disk>/")->required();
  cmd->add_flag("--force-full", a->req.force_full, "Full backup even when an incremental is possible");
  cmd->add_flag("--skip-quiesce", a->req.skip_quiesce, "Do not freeze guest filesystems (no guest agent)");
  cmd->add_option("--disks", a->disks, "Only these disks (vda,vdb)")->delimiter(',');
  cmd->add_option("--catalog", a->catalog, "Catalog database");
  a->copy.AddTo(cmd, DefaultCompression());
  cmd->add_flag("--json", a->as_json, "JSON result");
  cmd->callback([a, &exit_code] {
    orc::VmBackupRequest req = a->req;
    req.catalog_path = orc::ResolveCatalogPath(a->catalog);
    req.disks = a->disks;
    CompressionChoice compression;
    if (Status s = a->copy.Apply(req.copy, compression); !s.ok()) { exit_code = ReportError(s.error()); return; }
    req.compression = compression.type;
    req.compression_level = compression.level;
    auto r = orc::RunVmBackup(req);
    if (!r.ok()) { exit_code = ReportError(r.error()); return; }
    if (a->as_json) { PrintJson(BackupResultJson(*r)); return; }
    std::cout << r->backup_type << " backup of " << req.domain << " (" << r->reason << ")\n"
              << "  checkpoint: " << (r->checkpoint.empty() ? "(none, no tracker)" : r->checkpoint) << "\n";
    for (const auto& d : r->disks) {
      std::cout << "  " << d.disk << ": " << (d.incremental ? "incremental" : "full") << ", read "
                << HumanBytes(d.bytes_read) << ", wrote " << HumanBytes(d.bytes_written) << " -> " << d.image_path
                << "\n";
    }
    std::cout << "  duration: " << r->seconds << " s\n";
  });
  auto b = std::make_shared<std::tuple<std::string, std::string>>();
  auto* list = vm->add_subcommand("backups", "Backup records of the catalog (JSON)");
  list->add_option("--domain", std::get<0>(*b), "Only this domain's");
  list->add_option("--catalog", std::get<1>(*b), "Catalog database");
  list->callback([b, &exit_code] {
    auto cat = OpenCatalog(std::get<1>(*b));
    if (!cat.ok()) { exit_code = ReportError(cat.error()); return; }
    auto recs = (*cat)->ListBackups(std::get<0>(*b));
    if (!recs.ok()) { exit_code = ReportError(recs.error()); return; }
    json arr = json::array();
    for (const auto& r : *recs) arr.push_back(RecordJson(r));
    PrintJson(arr);
  });
  auto c = std::make_shared<std::tuple<std::string, std::string>>();
  auto* cat_cmd = app.add_subcommand("catalog", "The backup catalog");
  cat_cmd->require_subcommand(1);
  auto* rebuild = cat_cmd->add_subcommand("rebuild", "Re-create backup records from a backup folder's manifests");
  rebuild->add_option("--target", std::get<0>(*c), "Backup folder (TARGET/<domain>/<disk>/)")->required();
  rebuild->add_option("--catalog", std::get<1>(*c), "Catalog database");
  rebuild->callback([c, &exit_code] {
    auto cat = OpenCatalog(std::get<1>(*c));
    if (!cat.ok()) { exit_code = ReportError(cat.error()); return; }
    auto n = (*cat)->RebuildFromTarget(std::get<0>(*c));
    if (!n.ok()) { exit_code = ReportError(n.error()); return; }
    std::cout << "rebuilt " << *n << " backup records from " << std::get<0>(*c) << "\n";
  });
}

void RegisterCbt(CLI::App& app, int& exit_code) {
  auto* cbt = app.add_subcommand("cbt", "Changed-block tracking for raw disks (qcow2 overlay with a bitmap)");
  cbt->require_subcommand(1);
  for (const char* verb : {"enable", "disable", "status"}) {
    auto a = std::make_shared<std::tuple<orc::CbtRequest, std::string, bool>>();
    auto* cmd = cbt->add_subcommand(verb, std::string(verb) + " CBT for a domain");
    cmd->add_option("--domain", std::get<0>(*a).domain, "libvirt domain")->required();
    cmd->add_option("--catalog", std::get<1>(*a), "Catalog database");
    if (std::string(verb) == "enable") {
      cmd->add_option("--state-dir", std::get<0>(*a).state_dir, "Where overlays go (default: beside the catalog)");
    }
    cmd->add_flag("--json", std::get<2>(*a), "JSON output");
    std::string v = verb;
    cmd->callback([a, v, &exit_code] {
      orc::CbtRequest req = std::get<0>(*a);
      req.catalog_path = orc::ResolveCatalogPath(std::get<1>(*a));
      auto s = v == "enable" ? orc::EnableCbt(req) : v == "disable" ? orc::DisableCbt(req) : orc::GetCbtStatus(req);
      if (!s.ok()) { exit_code = ReportError(s.error()); return; }
      if (std::get<2>(*a)) { PrintJson(CbtJson(*s)); return; }
      std::cout << "CBT for " << s->domain << ": " << s->state << "\n";
      for (const auto& d : s->disks) std::cout << "  " << d.disk << ": " << d.overlay << " over " << d.data_file << "\n";
    });
  }
}

}  // namespace

void RegisterVmCommands(CLI::App& app, int& exit_code) {
  RegisterTracker(app, exit_code);
  RegisterCheckpointAndDoctor(app, exit_code);
  RegisterVm(app, exit_code);
  RegisterCbt(app, exit_code);
}

}  // namespace barge::cli
