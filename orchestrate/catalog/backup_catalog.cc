// Backup catalog on SQLite.
#include "orchestrate/catalog/backup_catalog.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "blockio/nbd.h"
#include "blockio/path.h"
#include "formats/json_fields.h"
#include "formats/manifest.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "pipeline/chain.h"

namespace barge::orchestrate {
namespace {

using nlohmann::json;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS vm_trackers (
  name TEXT PRIMARY KEY,
  domain TEXT NOT NULL,
  created_at TEXT NOT NULL,
  latest_checkpoint TEXT NOT NULL DEFAULT '',
  checkpoint_created_at TEXT NOT NULL DEFAULT '',
  disks TEXT NOT NULL DEFAULT '{}',
  needs_full INTEGER NOT NULL DEFAULT 0,
  needs_full_reason TEXT NOT NULL DEFAULT '',
  host TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS vm_checkpoints (
  name TEXT PRIMARY KEY,
  tracker TEXT NOT NULL REFERENCES vm_trackers(name) ON DELETE CASCADE,
  domain TEXT NOT NULL,
  created_at TEXT NOT NULL,
  disks TEXT NOT NULL,
  xml TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS vm_backups (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  domain TEXT NOT NULL,
  tracker TEXT NOT NULL DEFAULT '',
  type TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  checkpoint TEXT NOT NULL DEFAULT '',
  parent_checkpoint TEXT NOT NULL DEFAULT '',
  target TEXT NOT NULL,
  disks TEXT NOT NULL DEFAULT '[]',
  started_at TEXT NOT NULL,
  finished_at TEXT NOT NULL DEFAULT '',
  duration_seconds REAL NOT NULL DEFAULT 0,
  result TEXT NOT NULL,
  error TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS vm_backups_domain ON vm_backups(domain);
CREATE TABLE IF NOT EXISTS vm_cbt (
  domain TEXT PRIMARY KEY,
  state_dir TEXT NOT NULL,
  original_xml TEXT NOT NULL,
  disks TEXT NOT NULL,
  enabled_at TEXT NOT NULL,
  host TEXT NOT NULL DEFAULT ''
);
)sql";

// Adds `column` (its SQL declaration `decl`) to `table` of a catalog made
// before the column was. Another process may add it at the same time: a
// failed ALTER is retried once after looking again.
Status AddColumnIfMissing(SqliteDb& db, const std::string& table, const std::string& column,
                          const std::string& decl) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      BARGE_ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT COUNT(*) FROM pragma_table_info(?) WHERE name=?"));
      st.Bind(1, table).Bind(2, column);
      BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
      if (row && st.Int(0) != 0) return OkStatus();
    }
    if (Status added = db.Exec("ALTER TABLE " + table + " ADD COLUMN " + column + " " + decl);
        added.ok() || attempt == 1) {
      return added;
    }
  }
  return OkStatus();
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  });
}

json DisksJson(const std::vector<BackupDiskRecord>& disks) {
  json a = json::array();
  for (const auto& d : disks) {
    a.push_back({{"disk", d.disk}, {"type", d.type}, {"reason", d.reason}, {"chain_dir", d.chain_dir},
                 {"image", d.image_path}, {"manifest", d.manifest_path},
                 {"virtual_size", d.virtual_size}, {"bytes_read", d.bytes_read},
                 {"bytes_written", d.bytes_written}});
  }
  return a;
}

std::vector<BackupDiskRecord> DisksFromJson(const std::string& text) {
  std::vector<BackupDiskRecord> out;
  json a = json::parse(text, nullptr, false);
  if (!a.is_array()) return out;
  for (const auto& j : a) {
    // A damaged entry reads as empty fields: the listing shows it, and a
    // restore of it fails on the missing chain folder.
    BackupDiskRecord d;
    d.disk = formats::JsonString(j, "disk");
    d.type = formats::JsonString(j, "type");
    d.reason = formats::JsonString(j, "reason");
    d.chain_dir = formats::JsonString(j, "chain_dir");
    d.image_path = formats::JsonString(j, "image");
    d.manifest_path = formats::JsonString(j, "manifest");
    d.virtual_size = formats::JsonUint(j, "virtual_size");
    d.bytes_read = formats::JsonUint(j, "bytes_read");
    d.bytes_written = formats::JsonUint(j, "bytes_written");
    out.push_back(std::move(d));
  }
  return out;
}

std::map<std::string, uint64_t> SizesFromJson(const std::string& text) {
  std::map<std::string, uint64_t> out;
  json o = json::parse(text, nullptr, false);
  if (!o.is_object()) return out;
  for (auto it = o.begin(); it != o.end(); ++it) {
    if (it.value().is_number_unsigned()) out[it.key()] = it.value().get<uint64_t>();
  }
  return out;
}

constexpr const char* kTrackerColumns =
    "name, domain, created_at, latest_checkpoint, checkpoint_created_at, disks, needs_full, "
    "needs_full_reason, host";

TrackerRecord TrackerFromRow(const SqliteStatement& s) {
  TrackerRecord t;
  t.name = s.Text(0);
  t.domain = s.Text(1);
  t.created_at = s.Text(2);
  t.latest_checkpoint = s.Text(3);
  t.checkpoint_created_at = s.Text(4);
  t.disks = SizesFromJson(s.Text(5));
  t.needs_full = s.Int(6) != 0;
  t.needs_full_reason = s.Text(7);
  t.host = s.Text(8);
  return t;
}

constexpr const char* kBackupColumns =
    "id, domain, tracker, type, reason, checkpoint, parent_checkpoint, target, disks, started_at, "
    "finished_at, duration_seconds, result, error";

BackupRecord BackupFromRow(SqliteStatement& s) {
  BackupRecord r;
  r.id = s.Int(0);
  r.domain = s.Text(1);
  r.tracker = s.Text(2);
  r.type = s.Text(3);
  r.reason = s.Text(4);
  r.checkpoint = s.Text(5);
  r.parent_checkpoint = s.Text(6);
  r.target = s.Text(7);
  r.disks = DisksFromJson(s.Text(8));
  r.started_at = s.Text(9);
  r.finished_at = s.Text(10);
  r.duration_seconds = std::stod(s.Text(11).empty() ? "0" : s.Text(11));
  r.result = s.Text(12);
  r.error = s.Text(13);
  return r;
}

}  // namespace

std::string DomainLockPath(const std::string& catalog_path, const std::string& domain) {
  return CatalogLockPath(catalog_path, LockKind::kDomain, domain);
}

std::string DomainBusyMessage(const std::string& domain) {
  return "a backup, CBT change or state migration of domain '" + domain + "' is already running";
}

std::string CatalogDir(const std::string& catalog_path) { return DirName(catalog_path); }

Result<std::unique_ptr<BackupCatalog>> BackupCatalog::Open(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(env, path));
  std::unique_ptr<BackupCatalog> c(new BackupCatalog(env, std::move(db)));
  BARGE_RETURN_IF_ERROR(c->Migrate());
  return c;
}

Status BackupCatalog::Migrate() {
  BARGE_RETURN_IF_ERROR(db_->Exec(kSchema));
  // Catalogs made before trackers and CBT records said their host gain the
  // column (empty: this machine).
  BARGE_RETURN_IF_ERROR(AddColumnIfMissing(*db_, "vm_trackers", "host", "TEXT NOT NULL DEFAULT ''"));
  return AddColumnIfMissing(*db_, "vm_cbt", "host", "TEXT NOT NULL DEFAULT ''");
}

Status BackupCatalog::CreateTracker(const std::string& name, const std::string& domain) {
  if (!ValidName(name)) {
    return Error::InvalidArgument("tracker name must be 1-128 of [A-Za-z0-9_.-]: '" + name + "'");
  }
  if (domain.empty()) return Error::InvalidArgument("tracker needs a domain");
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare("INSERT INTO vm_trackers(name, domain, created_at) "
                                               "VALUES(?,?,?) ON CONFLICT(name) DO NOTHING"));
  st.Bind(1, name).Bind(2, domain).Bind(3, formats::NowRfc3339());
  BARGE_RETURN_IF_ERROR(st.Run());
  if (db_->Changes() == 0) {
    // Tracker names are global in the catalog: say whose it is.
    auto owner = GetTracker(name);
    if (owner.ok() && owner->domain != domain) {
      return Error::InvalidArgument("tracker '" + name + "' exists for domain '" + owner->domain +
                                    "' (tracker names are unique across domains)");
    }
    return Error::InvalidArgument("tracker '" + name + "' exists for domain '" + domain + "'");
  }
  return OkStatus();
}

Result<TrackerRecord> BackupCatalog::GetTracker(const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(std::string("SELECT ") + kTrackerColumns +
                                               " FROM vm_trackers WHERE name=?"));
  st.Bind(1, name);
  BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Error::NotFound("no tracker '" + name + "'");
  return TrackerFromRow(st);
}

Result<std::vector<TrackerRecord>> BackupCatalog::ListTrackers(const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(std::string("SELECT ") + kTrackerColumns +
                                               " FROM vm_trackers WHERE ?='' OR domain=? ORDER BY name"));
  st.Bind(1, domain).Bind(2, domain);
  std::vector<TrackerRecord> out;
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(TrackerFromRow(st));
  }
  return out;
}

Status BackupCatalog::DeleteTracker(const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare("DELETE FROM vm_trackers WHERE name=?"));
  st.Bind(1, name);
  BARGE_RETURN_IF_ERROR(st.Run());
  if (db_->Changes() == 0) return Error::NotFound("no tracker '" + name + "'");
  return OkStatus();
}

Status BackupCatalog::MarkNeedsFull(const std::string& tracker, const std::string& reason) {
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
  BARGE_ASSIGN_OR_RETURN(auto del, db_->Prepare("DELETE FROM vm_checkpoints WHERE tracker=?"));
  del.Bind(1, tracker);
  BARGE_RETURN_IF_ERROR(del.Run());
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "UPDATE vm_trackers SET latest_checkpoint='', checkpoint_created_at='', needs_full=1, "
      "needs_full_reason=? WHERE name=?"));
  st.Bind(1, reason).Bind(2, tracker);
  BARGE_RETURN_IF_ERROR(st.Run());
  if (db_->Changes() == 0) return Error::NotFound("no tracker '" + tracker + "'");
  return tx->Commit();
}

namespace {

CheckpointRecord CheckpointFromRow(const SqliteStatement& st) {
  CheckpointRecord c;
  c.name = st.Text(0);
  c.tracker = st.Text(1);
  c.domain = st.Text(2);
  c.created_at = st.Text(3);
  json a = json::parse(st.Text(4), nullptr, false);
  if (a.is_array()) {
    for (const auto& d : a) if (d.is_string()) c.disks.push_back(d.get<std::string>());
  }
  c.xml = st.Text(5);
  return c;
}

}  // namespace

Result<CheckpointRecord> BackupCatalog::GetCheckpoint(const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "SELECT name, tracker, domain, created_at, disks, xml FROM vm_checkpoints WHERE name=?"));
  st.Bind(1, name);
  BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Error::NotFound("no checkpoint '" + name + "' in the catalog");
  return CheckpointFromRow(st);
}

Result<std::vector<CheckpointRecord>> BackupCatalog::ListCheckpoints(const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "SELECT name, tracker, domain, created_at, disks, xml FROM vm_checkpoints "
      "WHERE ?='' OR domain=? ORDER BY created_at, name"));
  st.Bind(1, domain).Bind(2, domain);
  std::vector<CheckpointRecord> out;
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(CheckpointFromRow(st));
  }
  return out;
}

Status BackupCatalog::WriteBackupRow(int64_t id, const BackupRecord& r) {
  BARGE_ASSIGN_OR_RETURN(std::string disks, formats::DumpJson(DisksJson(r.disks), -1, "backup record of " + r.domain));
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "UPDATE vm_backups SET domain=?, tracker=?, type=?, reason=?, checkpoint=?, "
      "parent_checkpoint=?, target=?, disks=?, started_at=?, finished_at=?, duration_seconds=?, "
      "result=?, error=? WHERE id=?"));
  st.Bind(1, r.domain).Bind(2, r.tracker).Bind(3, r.type).Bind(4, r.reason).Bind(5, r.checkpoint)
      .Bind(6, r.parent_checkpoint).Bind(7, r.target).Bind(8, disks)
      .Bind(9, r.started_at).Bind(10, r.finished_at).Bind(11, std::to_string(r.duration_seconds))
      .Bind(12, r.result).Bind(13, RedactUrisIn(r.error)).Bind(14, id);  // never a credential
  BARGE_RETURN_IF_ERROR(st.Run());
  if (db_->Changes() == 0) return Error::NotFound("no backup record " + std::to_string(id));
  return OkStatus();
}

Result<int64_t> BackupCatalog::BeginBackup(const BackupRecord& record) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
      "INSERT INTO vm_backups(domain, target, started_at, result) VALUES(?,?,?,'running')"));
  st.Bind(1, record.domain).Bind(2, record.target).Bind(3, record.started_at);
  BARGE_RETURN_IF_ERROR(st.Run());
  int64_t id = db_->LastInsertRowId();
  BackupRecord r = record;
  r.result = "running";
  BARGE_RETURN_IF_ERROR(WriteBackupRow(id, r));
  return id;
}

Status BackupCatalog::FailBackup(int64_t id, const BackupRecord& record) {
  BackupRecord r = record;
  r.result = "failed";
  return WriteBackupRow(id, r);
}

Status BackupCatalog::CommitBackup(int64_t id, const BackupRecord& record,
                                   const std::optional<CheckpointRecord>& checkpoint,
                                   const std::map<std::string, uint64_t>& disk_sizes) {
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
  BackupRecord r = record;
  r.result = "success";
  BARGE_RETURN_IF_ERROR(WriteBackupRow(id, r));
  if (!record.tracker.empty() && checkpoint) {
    BARGE_ASSIGN_OR_RETURN(auto del, db_->Prepare("DELETE FROM vm_checkpoints WHERE tracker=?"));
    del.Bind(1, record.tracker);
    BARGE_RETURN_IF_ERROR(del.Run());
    BARGE_ASSIGN_OR_RETURN(std::string checkpoint_disks,
                           formats::DumpJson(json(checkpoint->disks), -1, "checkpoint " + checkpoint->name));
    BARGE_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO vm_checkpoints(name, tracker, domain, created_at, disks, xml) "
        "VALUES(?,?,?,?,?,?)"));
    ins.Bind(1, checkpoint->name).Bind(2, record.tracker).Bind(3, checkpoint->domain)
        .Bind(4, checkpoint->created_at).Bind(5, checkpoint_disks).Bind(6, checkpoint->xml);
    BARGE_RETURN_IF_ERROR(ins.Run());
    json sizes = json::object();
    for (const auto& [d, s] : disk_sizes) sizes[d] = s;
    BARGE_ASSIGN_OR_RETURN(std::string sizes_text, formats::DumpJson(sizes, -1, "tracker " + record.tracker));
    BARGE_ASSIGN_OR_RETURN(auto up, db_->Prepare(
        "UPDATE vm_trackers SET latest_checkpoint=?, checkpoint_created_at=?, disks=?, "
        "needs_full=0, needs_full_reason='', host=? WHERE name=?"));
    up.Bind(1, checkpoint->name).Bind(2, checkpoint->created_at).Bind(3, sizes_text)
        .Bind(4, checkpoint->host).Bind(5, record.tracker);
    BARGE_RETURN_IF_ERROR(up.Run());
    if (db_->Changes() == 0) return Error::NotFound("tracker '" + record.tracker + "' vanished");
  }
  return tx->Commit();
}

Result<std::vector<BackupRecord>> BackupCatalog::ListBackups(const std::string& domain) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(std::string("SELECT ") + kBackupColumns +
                                               " FROM vm_backups WHERE ?='' OR domain=? ORDER BY id"));
  st.Bind(1, domain).Bind(2, domain);
  std::vector<BackupRecord> out;
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    out.push_back(BackupFromRow(st));
  }
  return out;
}

Result<BackupRecord> BackupCatalog::GetBackup(int64_t id) {
  BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(std::string("SELECT ") + kBackupColumns +
                                               " FROM vm_backups WHERE id=?"));
  st.Bind(1, id);
  BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
  if (!row) return Error::NotFound("no backup record " + std::to_string(id));
  return BackupFromRow(st);
}

Status BackupCatalog::RepointPaths(const std::vector<std::string>& old_dirs, const std::string& new_dir) {
  std::vector<std::pair<std::string, std::string>> changed;  // name, xml
  {
    BARGE_ASSIGN_OR_RETURN(auto sel, db_->Prepare("SELECT name, xml FROM vm_checkpoints"));
    for (;;) {
      BARGE_ASSIGN_OR_RETURN(bool more, sel.Step());
      if (!more) break;
      const std::string was = sel.Text(1);
      std::string now = was;
      for (const std::string& old_dir : old_dirs) now = ReplacePathPrefix(now, old_dir, new_dir, /*xml=*/true);
      if (now != was) changed.emplace_back(sel.Text(0), std::move(now));
    }
  }
  for (const auto& [name, xml] : changed) {
    BARGE_ASSIGN_OR_RETURN(auto upd, db_->Prepare("UPDATE vm_checkpoints SET xml=? WHERE name=?"));
    upd.Bind(1, xml).Bind(2, name);
    BARGE_RETURN_IF_ERROR(upd.Run());
  }
  return OkStatus();
}

Result<size_t> BackupCatalog::RebuildFromTarget(const std::string& target) {
  std::string abs = AbsolutePath(target);
  auto st = env_.Stat(abs);
  if (!st.ok() || !st->is_directory()) return Error::NotFound("no backup folder").set_path(abs);
  // Folders only; anything else (and what cannot be listed) is skipped.
  auto folders = [this](const std::string& dir) {
    std::vector<std::string> out;
    auto names = env_.ListDir(dir);
    if (!names.ok()) return out;
    for (const std::string& n : *names) {
      auto s = env_.Stat(JoinPath(dir, n));
      if (s.ok() && s->is_directory()) out.push_back(n);
    }
    return out;
  };
  // (domain, group key) -> record; the key is the checkpoint, else the id.
  std::map<std::pair<std::string, std::string>, BackupRecord> groups;
  for (const std::string& domain : folders(abs)) {
    const std::string dom_dir = JoinPath(abs, domain);
    for (const std::string& disk : folders(dom_dir)) {
      auto chain = pipeline::LoadChainFolder(env_, JoinPath(dom_dir, disk));
      if (!chain.ok()) continue;
      for (const auto& p : chain->points) {
        const auto& m = p.manifest;
        std::string key = m.checkpoint.empty() ? m.started_at : m.checkpoint;
        auto& r = groups[{domain, key}];
        r.domain = domain;
        r.target = abs;
        r.checkpoint = m.checkpoint;
        r.result = "success";
        std::string type(formats::BackupTypeName(m.type));
        r.type = (r.type.empty() || r.type == type) ? type : "full";
        if (r.reason.empty()) r.reason = m.reason;
        if (r.started_at.empty() || m.started_at < r.started_at) r.started_at = m.started_at;
        if (m.finished_at > r.finished_at) r.finished_at = m.finished_at;
        BackupDiskRecord d;
        d.disk = m.disk;
        d.type = type;
        d.reason = m.reason;
        d.chain_dir = chain->dir;
        d.image_path = chain->PathOf(m.image);
        d.manifest_path = p.manifest_path;
        d.virtual_size = m.virtual_size;
        d.bytes_read = m.bytes_read;
        d.bytes_written = m.bytes_written;
        r.disks.push_back(std::move(d));
      }
    }
  }
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
  BARGE_ASSIGN_OR_RETURN(auto del, db_->Prepare("DELETE FROM vm_backups WHERE target=?"));
  del.Bind(1, abs);
  BARGE_RETURN_IF_ERROR(del.Run());
  std::vector<BackupRecord> ordered;
  for (auto& [k, r] : groups) ordered.push_back(std::move(r));
  std::sort(ordered.begin(), ordered.end(),
            [](const BackupRecord& a, const BackupRecord& b) { return a.started_at < b.started_at; });
  for (const auto& r : ordered) {
    BARGE_ASSIGN_OR_RETURN(auto st, db_->Prepare(
        "INSERT INTO vm_backups(domain, target, started_at, result) VALUES(?,?,?,'success')"));
    st.Bind(1, r.domain).Bind(2, r.target).Bind(3, r.started_at);
    BARGE_RETURN_IF_ERROR(st.Run());
    BARGE_RETURN_IF_ERROR(WriteBackupRow(db_->LastInsertRowId(), r));
  }
  BARGE_RETURN_IF_ERROR(tx->Commit());
  return ordered.size();
}

}  // namespace barge::orchestrate
