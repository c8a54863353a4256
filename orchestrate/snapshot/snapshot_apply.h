// `snapshot apply`: reconciles one disk's snapshots with a desired set
// (orchestrate/snapshot/snapshot_reconcile.h decides, this executes) and keeps each
// snapshot's state in the SQLite catalog so that states survive restarts
// and an interrupted apply resumes. docs/snapshots.md describes the file,
// the states and the order of actions.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/snapshot/snapshot.h"
#include "orchestrate/snapshot/snapshot_reconcile.h"

namespace barge::orchestrate {

class SqliteDb;

// The `snapshot_states` table of the catalog: one row per (image, uuid).
// `image` is the disk's image file as a canonical path, so a disk named by
// file or by domain shares its states. Thread-safe (one connection behind a
// mutex); several processes may share the catalog (SQLite WAL).
class SnapshotStateStore {
 public:
  // Opens (creating file, folder and table) the catalog at `db_path`.
  static Result<std::unique_ptr<SnapshotStateStore>> Open(Env& env, const std::string& db_path);
  ~SnapshotStateStore();
  SnapshotStateStore(const SnapshotStateStore&) = delete;
  SnapshotStateStore& operator=(const SnapshotStateStore&) = delete;

  // Every stored snapshot of `image`, by creation order.
  Result<std::vector<StoredSnapshot>> Load(const std::string& image);
  // Inserts or replaces the row (updated_at is set to now; created_at kept
  // when the row exists and `s.created_at` is 0). Durable when it returns.
  Status Put(const std::string& image, const StoredSnapshot& s);
  // Removes the row; a missing row is not an error.
  Status Remove(const std::string& image, const std::string& uuid);

 private:
  explicit SnapshotStateStore(std::unique_ptr<SqliteDb> db);
  std::mutex mu_;
  std::unique_ptr<SqliteDb> db_;  // guarded by mu_
};

struct ApplyRequest {
  SnapshotTarget target;
  ApplyConfig config;
  std::string catalog_path;         // "" = ResolveCatalogPath("")
  SnapshotConsistency consistency;  // around each create
  SpacePolicy space;
  // Test hook, to stop an apply the way a crash would: called with
  // "before" ahead of each action's change to the image and with "after"
  // once the image changed but before the state records it; an error
  // makes the apply return it at once, with nothing else recorded.
  std::function<Status(const SnapshotAction&, std::string_view point)> fault;
};

struct ApplyActionResult {
  SnapshotAction action;
  bool ok = true;
  std::string error;  // ToString() of the failure
};

struct ApplySnapshotStatus {
  StoredSnapshot stored;           // uuid, display name, state, message, counter, times, qcow2 id
  formats::SnapshotUsage usage;    // metrics, when has_usage
  bool has_usage = false;
};

struct ApplyResult {
  std::string image;  // canonical image path (the state key)
  std::string mode;   // "offline" or "online"
  std::vector<ApplyActionResult> actions;     // in the order run
  std::vector<ApplySnapshotStatus> snapshots; // every listed snapshot, config order
  bool ok() const {
    for (const auto& a : actions) {
      if (!a.ok) return false;
    }
    return true;
  }
};

// Runs one apply: takes the disk's apply lock (CatalogLockPath's kSnapshotApply,
// kBusy while another apply of the disk runs), loads the stored states and
// the image's list, decides, and runs each action, recording its state
// before (creating, deleting) and after (created, removed, error with the
// message, implicitly_deleted for snapshots a rollback discarded). A
// failing action makes its snapshot "error" and the apply goes on with
// the next; the result says which failed (ok() false). Errors returned:
// the target, the lock, the catalog, the image list, or `fault`.
Result<ApplyResult> ApplySnapshotConfig(Env& env, const ApplyRequest& request);

// The stored states of a disk (for `snapshot list` to show display names
// and states), keyed like apply's.
Result<std::vector<StoredSnapshot>> LoadSnapshotStates(Env& env, const SnapshotTarget& target,
                                                       const std::string& catalog_path);
// The same by uuid (the qcow2 name of a snapshot apply or create --uuid
// made), for `snapshot list` and `snapshot metrics`; none when the catalog
// does not exist (listing creates no catalog).
Result<std::map<std::string, StoredSnapshot>> SnapshotStatesByUuid(Env& env, const SnapshotTarget& target,
                                                                   const std::string& catalog_path);

// Records (inserts or replaces) one snapshot's state for a disk, keyed like
// apply's: `snapshot create --uuid` records the display name of the
// snapshot it made so that `list` shows it and a later apply knows it.
Status RecordSnapshotState(Env& env, const SnapshotTarget& target, const std::string& catalog_path,
                           const StoredSnapshot& snapshot);

// `snapshot create --uuid`: records `created` (the snapshot it made, named
// `uuid`) as kCreated with `display_name`, in the catalog that
// `catalog_flag` (--catalog, "" for the default) names.
// Returns: CatalogPathFromFlag's errors as they are; a failed record
// wrapped as "snapshot '<name>' (id <id>) was created, but its display name
// was not recorded" (the snapshot stays).
Status RecordCreatedSnapshot(Env& env, const SnapshotTarget& target, const std::string& catalog_flag,
                             const formats::SnapshotInfo& created, const std::string& uuid,
                             const std::string& display_name);

}  // namespace barge::orchestrate
