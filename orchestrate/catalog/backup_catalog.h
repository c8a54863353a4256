// The backup catalog (SQLite): backup trackers, the checkpoint XML libvirt
// gave (to redefine it after libvirt lost its metadata), and one record per
// VM backup run. Schema: docs/formats/catalog.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/base/sqlite_db.h"

namespace barge::orchestrate {

struct TrackerRecord {
  std::string name;
  std::string domain;
  std::string created_at;             // RFC 3339 UTC
  std::string latest_checkpoint;      // "" = empty tracker (next backup full)
  std::string checkpoint_created_at;  // of latest_checkpoint
  std::map<std::string, uint64_t> disks;  // disk -> virtual size at the checkpoint
  bool needs_full = false;            // the next backup must be full because...
  std::string needs_full_reason;      // ...of this ("bitmap inconsistent", ...)
  // The libvirt URI (without secrets) of the hypervisor latest_checkpoint
  // lives on; "" = this machine (and every tracker from before hosts were
  // recorded). Compared by LibvirtHostKey.
  std::string host;
};

struct CheckpointRecord {
  std::string name;
  std::string tracker;
  std::string domain;
  std::string created_at;
  std::vector<std::string> disks;
  std::string xml;  // virDomainCheckpointGetXMLDesc, for redefinition
  std::string host;  // where it lives (TrackerRecord::host), recorded in the tracker
};

struct BackupDiskRecord {
  std::string disk;
  std::string type;    // "full" / "incremental"
  std::string reason;
  std::string chain_dir;
  std::string image_path;
  std::string manifest_path;
  uint64_t virtual_size = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

struct BackupRecord {
  int64_t id = 0;
  std::string domain;
  std::string tracker;
  std::string type;       // "full" / "incremental" (incremental only if every disk was)
  std::string reason;
  std::string checkpoint;         // created by this run
  std::string parent_checkpoint;  // incremental from
  std::string target;             // the --target folder
  std::vector<BackupDiskRecord> disks;
  std::string started_at;
  std::string finished_at;
  double duration_seconds = 0;
  std::string result;     // "running", "success", "failed"
  std::string error;
};

// One catalog connection; one thread at a time. Every write is one SQLite
// transaction, so a tracker only advances together with the record of the
// successful backup that advanced it.
class BackupCatalog {
 public:
  // The catalog's folder is made, and backup folders are scanned, through
  // `env`, which must outlive the catalog.
  static Result<std::unique_ptr<BackupCatalog>> Open(Env& env, const std::string& path);
  const std::string& path() const { return db_->path(); }
  SqliteDb& db() { return *db_; }
  // The Env it was opened with.
  Env& env() { return env_; }

  // kInvalidArgument if the name exists or is not [A-Za-z0-9_.-]+.
  Status CreateTracker(const std::string& name, const std::string& domain);
  Result<TrackerRecord> GetTracker(const std::string& name);  // kNotFound
  Result<std::vector<TrackerRecord>> ListTrackers(const std::string& domain = "");
  Status DeleteTracker(const std::string& name);  // with its checkpoints; kNotFound
  // Drops the tracker's checkpoint and sets needs_full with `reason`.
  Status MarkNeedsFull(const std::string& tracker, const std::string& reason);

  Result<CheckpointRecord> GetCheckpoint(const std::string& name);  // kNotFound
  // Every checkpoint (of `domain`, if not empty), oldest first.
  Result<std::vector<CheckpointRecord>> ListCheckpoints(const std::string& domain = "");

  // A run starts: inserts a "running" record, returns its id.
  Result<int64_t> BeginBackup(const BackupRecord& record);
  // A run failed: the record says why; trackers are untouched.
  Status FailBackup(int64_t id, const BackupRecord& record);
  // A run succeeded: in one transaction the record becomes "success" and,
  // with a tracker, the tracker moves to `checkpoint` (disks, sizes, XML)
  // and forgets needs_full.
  Status CommitBackup(int64_t id, const BackupRecord& record,
                      const std::optional<CheckpointRecord>& checkpoint,
                      const std::map<std::string, uint64_t>& disk_sizes);
  Result<std::vector<BackupRecord>> ListBackups(const std::string& domain = "");
  Result<BackupRecord> GetBackup(int64_t id);

  // After `barge state migrate` moved a folder: the stored checkpoint XML
  // naming paths in one of `old_dirs` (the folder's absolute and real
  // paths) names them under `new_dir` instead (ReplacePathPrefix). Runs
  // inside the caller's transaction, if any; idempotent.
  Status RepointPaths(const std::vector<std::string>& old_dirs, const std::string& new_dir);

  // Replaces every record of `target` by what its manifests say
  // (TARGET/<domain>/<disk>/*.json, grouped by domain and checkpoint or
  // start time). Returns the number of records written.
  Result<size_t> RebuildFromTarget(const std::string& target);

 private:
  BackupCatalog(Env& env, std::unique_ptr<SqliteDb> db) : env_(env), db_(std::move(db)) {}
  Status Migrate();
  Status WriteBackupRow(int64_t id, const BackupRecord& r);
  Env& env_;
  std::unique_ptr<SqliteDb> db_;
};

// The folder holding the catalog (locks go under it).
std::string CatalogDir(const std::string& catalog_path);

// The lock file of `domain` (CatalogLockPath's kDomain,
// <catalog folder>/locks/domains/<domain>.lock): vm
// backup, cbt enable/disable and state migrate hold it (TryLockFile) while
// they change what the domain's files or records are.
std::string DomainLockPath(const std::string& catalog_path, const std::string& domain);
// The busy message all of them give when another holds it.
std::string DomainBusyMessage(const std::string& domain);

}  // namespace barge::orchestrate
