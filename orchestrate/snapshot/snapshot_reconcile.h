// The `snapshot apply` controller interface (EVE): the desired set of
// snapshots of one disk, the state barge keeps per snapshot, and the pure
// decision that turns desired set + stored states + the image's snapshot
// list into actions. The file format and the states are in
// docs/snapshots.md ("apply").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "formats/image.h"

namespace barge::orchestrate {

enum class SnapshotState : uint8_t {
  kCreating,           // being created (an interrupted apply finds it here)
  kCreated,            // exists in the image
  kDeleting,           // being deleted
  kImplicitlyDeleted,  // gone without being unlisted (a rollback discarded it, or someone deleted it)
  kError,              // the last operation on it failed (message says why)
};
std::string_view SnapshotStateName(SnapshotState state);  // "creating", "implicitly_deleted", ...
Result<SnapshotState> ParseSnapshotState(std::string_view name);

struct DesiredRollback {
  uint64_t counter = 0;        // roll back when higher than the last applied
  bool discard_newer = false;  // delete the snapshots after it (as ZFS does)
};

struct DesiredSnapshot {
  std::string uuid;          // identity; the qcow2 snapshot's name
  std::string display_name;  // what users see; renaming changes only this
  std::optional<DesiredRollback> rollback;
};

// The whole desired set, every time.
struct ApplyConfig {
  std::vector<DesiredSnapshot> snapshots;
};

// Parses the JSON config:
//   {"snapshots": [{"uuid": "...", "display_name": "...",
//                   "rollback": {"counter": 2, "discard_newer": false}}]}
// "display_name" defaults to the uuid, "rollback" is optional. Unknown keys
// are ignored. kInvalidArgument naming the entry for: not JSON, no
// "snapshots" list, an empty or repeated uuid, a uuid that cannot be a
// qcow2 snapshot name (over 255 bytes, NUL), a counter that is not a
// non-negative integer.
Result<ApplyConfig> ParseApplyConfig(std::string_view json_text);

// What barge remembers about one snapshot of one disk.
struct StoredSnapshot {
  std::string uuid;
  std::string display_name;
  SnapshotState state = SnapshotState::kCreating;
  std::string message;           // why it is in error or implicitly deleted
  std::string snapshot_id;       // the qcow2 id once created
  uint64_t rollback_counter = 0; // the last counter applied (or seen first)
  int64_t last_rollback_at = 0;  // Unix seconds; 0 = never rolled back
  int64_t created_at = 0;        // Unix seconds
  int64_t updated_at = 0;        // Unix seconds of the last state change
};

enum class ActionKind : uint8_t {
  kForget,                 // drop the state of a snapshot no longer listed and gone
  kMarkImplicitlyDeleted,  // a created snapshot vanished from the image
  kDelete,                 // delete an unlisted snapshot
  kAdopt,                  // it exists (an interrupted create finished): record it as created
  kRename,                 // the display name changed
  kRollback,               // the rollback counter rose
  kCreate,                 // listed and missing
};
std::string_view ActionKindName(ActionKind kind);

struct SnapshotAction {
  ActionKind kind = ActionKind::kCreate;
  std::string uuid;
  std::string display_name;      // kCreate, kAdopt, kRename
  uint64_t rollback_counter = 0; // kCreate (the baseline), kAdopt, kRollback
  bool discard_newer = false;    // kRollback
  std::string reason;            // why, in words
  friend bool operator==(const SnapshotAction&, const SnapshotAction&) = default;
};

// The decision, a pure function. For each listed snapshot (config order):
// - stored implicitly_deleted: nothing (reported again as such);
// - stored created but not in the image: kMarkImplicitlyDeleted;
// - in the image but not stored as created (new, creating, deleting,
//   error): kAdopt, then as created;
// - missing from the image (new, creating, deleting, error): kCreate with
//   its rollback counter as the baseline;
// - created: kRename when the display name differs, kRollback when the
//   counter is above the stored one.
// For each stored snapshot not listed: kDelete when the image has it, else
// kForget. Snapshots of the image barge does not know are never touched.
// Order: kForget, kMarkImplicitlyDeleted, kDelete, kAdopt, kRename,
// kRollback, kCreate: the listed snapshots missing after a rollback are
// taken of the disk as it is after the rollback (the config describes the
// end state).
std::vector<SnapshotAction> ReconcileSnapshots(const ApplyConfig& desired, const std::vector<StoredSnapshot>& stored,
                                               const std::vector<formats::SnapshotInfo>& image);

}  // namespace barge::orchestrate
