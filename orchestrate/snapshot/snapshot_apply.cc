// The apply executor and the snapshot state table.
#include "orchestrate/snapshot/snapshot_apply.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/base/sqlite_db.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/libvirt/libvirt_uri.h"

namespace barge::orchestrate {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS snapshot_states (
  image TEXT NOT NULL,
  uuid TEXT NOT NULL,
  display_name TEXT NOT NULL,
  state TEXT NOT NULL,
  message TEXT NOT NULL DEFAULT '',
  snapshot_id TEXT NOT NULL DEFAULT '',
  rollback_counter INTEGER NOT NULL DEFAULT 0,
  last_rollback_at INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (image, uuid)
);
)sql";

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The name of a disk's apply lock: the image path's FNV-1a hash (16 hex
// digits), as a whole path would be too long for one file name.
std::string LockName(const std::string& image) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : image) h = (h ^ c) * 1099511628211ull;
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

SnapshotStateStore::SnapshotStateStore(std::unique_ptr<SqliteDb> db) : db_(std::move(db)) {}
SnapshotStateStore::~SnapshotStateStore() = default;

Result<std::unique_ptr<SnapshotStateStore>> SnapshotStateStore::Open(Env& env, const std::string& db_path) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::Open(env, db_path));
  BARGE_RETURN_IF_ERROR(db->Exec(kSchema));
  return std::unique_ptr<SnapshotStateStore>(new SnapshotStateStore(std::move(db)));
}

Result<std::vector<StoredSnapshot>> SnapshotStateStore::Load(const std::string& image) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(SqliteStatement st,
                         db_->Prepare("SELECT uuid, display_name, state, message, snapshot_id, rollback_counter, "
                                      "last_rollback_at, created_at, updated_at FROM snapshot_states "
                                      "WHERE image = ?1 ORDER BY created_at, rowid"));
  st.Bind(1, image);
  std::vector<StoredSnapshot> out;
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(bool row, st.Step());
    if (!row) break;
    StoredSnapshot s;
    s.uuid = st.Text(0);
    s.display_name = st.Text(1);
    auto state = ParseSnapshotState(st.Text(2));
    if (!state.ok()) return std::move(state).error().set_path(db_->path());
    s.state = *state;
    s.message = st.Text(3);
    s.snapshot_id = st.Text(4);
    s.rollback_counter = static_cast<uint64_t>(st.Int(5));
    s.last_rollback_at = st.Int(6);
    s.created_at = st.Int(7);
    s.updated_at = st.Int(8);
    out.push_back(std::move(s));
  }
  return out;
}

Status SnapshotStateStore::Put(const std::string& image, const StoredSnapshot& s) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(
      SqliteStatement st,
      db_->Prepare("INSERT INTO snapshot_states (image, uuid, display_name, state, message, snapshot_id, "
                   "rollback_counter, last_rollback_at, created_at, updated_at) "
                   "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) "
                   "ON CONFLICT (image, uuid) DO UPDATE SET display_name = ?3, state = ?4, message = ?5, "
                   "snapshot_id = ?6, rollback_counter = ?7, last_rollback_at = ?8, "
                   "created_at = CASE WHEN ?9 = 0 THEN created_at ELSE ?9 END, updated_at = ?10"));
  st.Bind(1, image)
      .Bind(2, s.uuid)
      .Bind(3, s.display_name)
      .Bind(4, SnapshotStateName(s.state))
      .Bind(5, s.message)
      .Bind(6, s.snapshot_id)
      .Bind(7, static_cast<int64_t>(s.rollback_counter))
      .Bind(8, s.last_rollback_at)
      .Bind(9, s.created_at)
      .Bind(10, Now());
  return st.Run();
}

Status SnapshotStateStore::Remove(const std::string& image, const std::string& uuid) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(SqliteStatement st, db_->Prepare("DELETE FROM snapshot_states WHERE image = ?1 AND uuid = ?2"));
  st.Bind(1, image).Bind(2, uuid);
  return st.Run();
}

namespace {

// One apply run: the stored rows of the disk in memory, written through.
class Applier {
 public:
  Applier(const ApplyRequest& req, Env& env, SnapshotStateStore& store, std::string key)
      : req_(req), env_(env), store_(store), key_(std::move(key)) {}

  Status Load(const std::vector<StoredSnapshot>& stored, const SnapshotListing& listing) {
    for (const StoredSnapshot& s : stored) rows_[s.uuid] = s;
    for (const SnapshotListEntry& e : listing.snapshots) ids_[e.info.name] = e.info.id;
    return OkStatus();
  }

  // Runs one action. Returns an error only for what stops the apply (the
  // catalog, the fault hook); the action's own failure goes in `out`.
  Status Run(const SnapshotAction& a, ApplyActionResult& out) {
    out.action = a;
    StoredSnapshot& s = rows_[a.uuid];
    s.uuid = a.uuid;
    auto failed = [&](const Error& e) -> Status {
      out.ok = false;
      out.error = e.ToString();
      s.state = SnapshotState::kError;
      s.message = std::string(ActionKindName(a.kind)) + " failed: " + e.ToString();
      return store_.Put(key_, s);
    };
    switch (a.kind) {
      case ActionKind::kForget:
        rows_.erase(a.uuid);
        return store_.Remove(key_, a.uuid);
      case ActionKind::kMarkImplicitlyDeleted:
        s.state = SnapshotState::kImplicitlyDeleted;
        s.message = a.reason;
        return store_.Put(key_, s);
      case ActionKind::kAdopt:
        s.display_name = a.display_name;
        s.state = SnapshotState::kCreated;
        s.message.clear();
        s.rollback_counter = a.rollback_counter;
        s.snapshot_id = ids_[a.uuid];
        if (s.created_at == 0) s.created_at = Now();
        return store_.Put(key_, s);
      case ActionKind::kRename:
        s.display_name = a.display_name;
        return store_.Put(key_, s);
      case ActionKind::kDelete: {
        s.state = SnapshotState::kDeleting;
        s.message.clear();
        BARGE_RETURN_IF_ERROR(store_.Put(key_, s));
        BARGE_RETURN_IF_ERROR(Fault(a, "before"));
        auto deleted = DeleteDiskSnapshot(env_, req_.target, a.uuid);
        BARGE_RETURN_IF_ERROR(Fault(a, "after"));
        if (!deleted.ok() && deleted.error().code() != ErrorCode::kNotFound) return failed(deleted.error());
        rows_.erase(a.uuid);
        return store_.Remove(key_, a.uuid);
      }
      case ActionKind::kRollback: {
        // An earlier rollback of this apply discarded it.
        if (s.state == SnapshotState::kImplicitlyDeleted) {
          out.ok = false;
          out.error = "not rolled back: " + s.message;
          return OkStatus();
        }
        BARGE_RETURN_IF_ERROR(Fault(a, "before"));
        auto rolled = RollbackDiskSnapshot(env_, req_.target, a.uuid, a.discard_newer);
        BARGE_RETURN_IF_ERROR(Fault(a, "after"));
        if (!rolled.ok()) return failed(rolled.error());
        s.state = SnapshotState::kCreated;
        s.message.clear();
        s.rollback_counter = a.rollback_counter;
        s.last_rollback_at = Now();
        BARGE_RETURN_IF_ERROR(store_.Put(key_, s));
        const std::string label = s.display_name.empty() ? a.uuid : s.display_name;
        for (const formats::SnapshotInfo& d : rolled->discarded) {
          auto it = rows_.find(d.name);
          if (it == rows_.end()) continue;
          it->second.state = SnapshotState::kImplicitlyDeleted;
          it->second.message = "discarded by the rollback to '" + label + "'";
          BARGE_RETURN_IF_ERROR(store_.Put(key_, it->second));
        }
        return OkStatus();
      }
      case ActionKind::kCreate: {
        s.display_name = a.display_name;
        s.state = SnapshotState::kCreating;
        s.message.clear();
        s.snapshot_id.clear();
        s.rollback_counter = a.rollback_counter;
        s.created_at = Now();
        BARGE_RETURN_IF_ERROR(store_.Put(key_, s));
        BARGE_RETURN_IF_ERROR(Fault(a, "before"));
        SnapshotCreateRequest create;
        create.target = req_.target;
        create.name = a.uuid;
        create.consistency = req_.consistency;
        create.space = req_.space;
        auto made = CreateDiskSnapshot(env_, create);
        BARGE_RETURN_IF_ERROR(Fault(a, "after"));
        if (!made.ok()) return failed(made.error());
        s.state = SnapshotState::kCreated;
        s.snapshot_id = made->snapshot.id;
        return store_.Put(key_, s);
      }
    }
    return Error::Internal("snapshot apply: unknown action");
  }

 private:
  Status Fault(const SnapshotAction& a, std::string_view point) {
    return req_.fault ? req_.fault(a, point) : OkStatus();
  }

  const ApplyRequest& req_;
  Env& env_;
  SnapshotStateStore& store_;
  const std::string key_;
  std::map<std::string, StoredSnapshot> rows_;
  std::map<std::string, std::string> ids_;  // image snapshot name -> id at the start
};

Result<std::string> StateKey(Env& env, const SnapshotTarget& target) {
  BARGE_ASSIGN_OR_RETURN(std::string path, SnapshotImagePath(target));
  // A remote domain's image is that host's file, which this machine cannot
  // resolve: keyed by the host and the path as its libvirt names it.
  if (!target.domain.empty()) {
    if (const std::string host = LibvirtHostKey(ResolveLibvirtUri(target.libvirt_uri)); !host.empty()) {
      return host + ":" + path;
    }
  }
  return env.RealPath(path);
}

}  // namespace

Result<ApplyResult> ApplySnapshotConfig(Env& env, const ApplyRequest& req) {
  ApplyResult result;
  BARGE_ASSIGN_OR_RETURN(result.image, StateKey(env, req.target));
  const std::string catalog = ResolveCatalogPath(req.catalog_path);
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EnvLock> lock,
                         TryLockFile(env, CatalogLockPath(catalog, LockKind::kSnapshotApply, LockName(result.image)),
                                     "another snapshot apply of '" + result.image + "' is running"));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotStateStore> store, SnapshotStateStore::Open(env, catalog));
  BARGE_ASSIGN_OR_RETURN(std::vector<StoredSnapshot> stored, store->Load(result.image));
  BARGE_ASSIGN_OR_RETURN(SnapshotListing before, ListDiskSnapshots(env, req.target));
  result.mode = before.mode;
  std::vector<formats::SnapshotInfo> image;
  for (const SnapshotListEntry& e : before.snapshots) image.push_back(e.info);

  Applier applier(req, env, *store, result.image);
  BARGE_RETURN_IF_ERROR(applier.Load(stored, before));
  for (const SnapshotAction& a : ReconcileSnapshots(req.config, stored, image)) {
    ApplyActionResult r;
    BARGE_RETURN_IF_ERROR(applier.Run(a, r));
    result.actions.push_back(std::move(r));
  }

  // What every listed snapshot is now, with its metrics.
  BARGE_ASSIGN_OR_RETURN(std::vector<StoredSnapshot> now, store->Load(result.image));
  std::map<std::string, const StoredSnapshot*> rows;
  for (const StoredSnapshot& s : now) rows[s.uuid] = &s;
  auto after = ListDiskSnapshots(env, req.target);
  std::map<std::string, const SnapshotListEntry*> entries;
  if (after.ok()) {
    for (const SnapshotListEntry& e : after->snapshots) entries[e.info.name] = &e;
  }
  for (const DesiredSnapshot& d : req.config.snapshots) {
    ApplySnapshotStatus status;
    if (auto it = rows.find(d.uuid); it != rows.end()) {
      status.stored = *it->second;
    } else {
      status.stored.uuid = d.uuid;
      status.stored.display_name = d.display_name;
      status.stored.state = SnapshotState::kError;
      status.stored.message = "no state recorded";
    }
    if (auto it = entries.find(d.uuid); it != entries.end() && status.stored.state == SnapshotState::kCreated) {
      status.usage = it->second->usage;
      status.has_usage = it->second->has_usage;
    }
    result.snapshots.push_back(std::move(status));
  }
  return result;
}

Result<std::vector<StoredSnapshot>> LoadSnapshotStates(Env& env, const SnapshotTarget& target,
                                                       const std::string& catalog_path) {
  BARGE_ASSIGN_OR_RETURN(std::string key, StateKey(env, target));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotStateStore> store,
                         SnapshotStateStore::Open(env, ResolveCatalogPath(catalog_path)));
  return store->Load(key);
}

Result<std::map<std::string, StoredSnapshot>> SnapshotStatesByUuid(Env& env, const SnapshotTarget& target,
                                                                   const std::string& catalog_path) {
  std::map<std::string, StoredSnapshot> by_uuid;
  if (!env.Exists(ResolveCatalogPath(catalog_path))) return by_uuid;
  BARGE_ASSIGN_OR_RETURN(std::vector<StoredSnapshot> states, LoadSnapshotStates(env, target, catalog_path));
  for (auto& s : states) by_uuid[s.uuid] = std::move(s);
  return by_uuid;
}

Status RecordSnapshotState(Env& env, const SnapshotTarget& target, const std::string& catalog_path,
                           const StoredSnapshot& snapshot) {
  BARGE_ASSIGN_OR_RETURN(std::string key, StateKey(env, target));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<SnapshotStateStore> store,
                         SnapshotStateStore::Open(env, ResolveCatalogPath(catalog_path)));
  return store->Put(key, snapshot);
}

Status RecordCreatedSnapshot(Env& env, const SnapshotTarget& target, const std::string& catalog_flag,
                             const formats::SnapshotInfo& created, const std::string& uuid,
                             const std::string& display_name) {
  BARGE_ASSIGN_OR_RETURN(std::string catalog_path, CatalogPathFromFlag(env, catalog_flag));
  StoredSnapshot s;
  s.uuid = uuid;
  s.display_name = display_name;
  s.state = SnapshotState::kCreated;
  s.snapshot_id = created.id;
  s.created_at = created.date_sec;
  if (Status st = RecordSnapshotState(env, target, catalog_path, s); !st.ok()) {
    return Error(st.error()).Wrap("snapshot '" + created.name + "' (id " + created.id +
                                  ") was created, but its display name was not recorded");
  }
  return OkStatus();
}

}  // namespace barge::orchestrate
