// The decisions of a policy run as pure functions over plain values (no
// files, no clock, no randomness of their own): what is due, where a backup
// goes, full or incremental, and which points retention keeps and how it
// removes the others without breaking any point it keeps. The runner
// (orchestrate/policy/policy_runner.h) gathers the inputs and carries out the
// answers; docs/policies.md describes the rules.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/policy/policy.h"

namespace barge::orchestrate {

using SysSeconds = std::chrono::sys_seconds;

// ---- what is due ----

enum class Trigger : uint8_t { kReason, kSchedule, kManual };
std::string_view TriggerName(Trigger trigger);  // "reason", "schedule", "manual"

// What the catalog remembers of one source of a policy between runs.
struct SourceState {
  std::optional<SysSeconds> last_attempt;  // start of its last run, any result
  std::optional<std::string> last_reason;  // the policy's reason at that run; nullopt = never ran
  bool last_failed = false;                // that run failed (stopped, interrupted included)
};

struct DueDecision {
  bool due = false;
  Trigger trigger = Trigger::kSchedule;
  std::string why;                  // for logs and records, also when not due
  std::optional<SysSeconds> slot;   // schedule: the newest slot passed
  size_t coalesced_slots = 0;       // schedule: slots passed since the last attempt (>= 1 when due)
  std::optional<SysSeconds> next;   // schedule: the next slot after now
  std::optional<SysSeconds> retry;  // the last attempt failed: when it is retried (last attempt + retry_after)
};

// Whether a source is due at `now`:
//   - never while a run of the policy is in progress (due=false, "run in
//     progress": the caller defers);
//   - a reason different from the one of the last run (never run counts as
//     "") is due once, trigger kReason;
//   - with a schedule, a source never attempted is due at once; else it is
//     due when a slot passed after its last attempt: every slot passed since
//     is coalesced into this one run (trigger kSchedule);
//   - a source whose last attempt failed is due again (a retry) once
//     `retry_after` passed since that attempt, without waiting for the next
//     slot (trigger kSchedule; kReason without a schedule).
DueDecision DecideDue(const Policy& policy, const SourceState& state, SysSeconds now, bool run_in_progress,
                      std::chrono::seconds retry_after = std::chrono::seconds(0));

// ---- full or incremental ----

// The newest chain of a source: where it is and how long.
struct ChainSummary {
  std::string target;      // the policy target holding it
  size_t points = 0;       // points in the chain, its full included
};

struct TypeDecision {
  bool incremental = false;
  std::string reason;      // "first backup of the source", "full_every 7 reached", ...
};

// Full or incremental for `source`: incremental only when the source can
// (an image with a bitmap, or a domain), a chain exists, `incremental_ok`
// holds (the caller's check that the change tracking is intact; else
// `not_ok_reason` says why), and full_every (when non-zero) is not reached.
TypeDecision DecideBackupType(const Policy& policy, const PolicySource& source,
                              const std::optional<ChainSummary>& chain, bool incremental_ok,
                              std::string_view not_ok_reason = "");

// ---- placement ----

struct TargetState {
  std::string path;
  std::optional<uint64_t> free_bytes;  // nullopt: the space query failed (`error` says why)
  std::string error;
  uint64_t successful_backups = 0;     // of this source on this target
  ErrorCode error_code = ErrorCode::kIoError;  // of `error`
};

struct Placement {
  std::string target;
  bool incremental = false;  // false: a new chain starts there
  std::string reason;        // why this target (and why a full, if the chain could not go on)
};

// Picks `pick(n)` in [0, n): the tie-breaker (tests pass a fixed one).
using PickFn = std::function<size_t(size_t n)>;

// Where the next backup goes. A target qualifies when its free bytes are
// at least free_space_multiple x `allocated_bytes`. An incremental
// (`type.incremental`) follows its chain when the chain's target
// qualifies; otherwise (or for a full) a new chain goes to the qualifying
// target with the fewest successful backups of the source, `pick` choosing
// among ties.
// Returns: the placement; kNoSpace when no target qualifies, the message
// listing each target's free bytes (or error) against the bytes needed;
// when no target could be used at all (each one's space query failed:
// a missing target; mounted read-only), the first target's error code instead (kNotFound
// for a missing target).
Result<Placement> PlaceBackup(const std::vector<TargetState>& targets, uint64_t allocated_bytes,
                              double free_space_multiple, const TypeDecision& type,
                              const std::optional<ChainSummary>& chain, const PickFn& pick);

// ---- retention ----

// One restorable point of a source: what one run made on one target. For
// an image or NBD source one backup point; for a domain one per disk.
struct PointPart {
  std::string chain_dir;
  std::string id;  // the backup id in that chain folder
};
struct RestorePoint {
  std::string key;  // unique per source ("<target>|<id or checkpoint>")
  SysSeconds time;  // when its run started
  std::vector<PointPart> parts;
};
// A chain in one chain folder: its point ids oldest first; ids[0] is a full
// and every later point's parent is the one before it.
struct ChainView {
  std::string chain_dir;
  std::vector<std::string> ids;
  // Points other chains stand on (`barge backup --base`): never removed or
  // folded away. id -> why ("base of 2 chains").
  std::map<std::string, std::string> pinned;
};

enum class RetentionActionKind : uint8_t {
  kRemoveChain,   // no point of the chain is kept: remove every file of `ids`
  kRemoveNewest,  // `ids` at the end of a chain, newer than every kept point of it: remove
  kMergeThrough,  // fold the chain's points up to `through` into a full of `through`;
                  // `ids` are the older points that go (pipeline/merge.h)
};
std::string_view RetentionActionKindName(RetentionActionKind kind);

struct RetentionAction {
  RetentionActionKind kind = RetentionActionKind::kRemoveChain;
  std::string chain_dir;
  std::vector<std::string> ids;
  std::string through;  // kMergeThrough
};

struct RetentionPlan {
  std::vector<std::string> keep;    // restore point keys, newest first
  std::vector<std::string> forget;  // restore point keys that go, newest first
  // Points asked to go that stay because a kept point needs them (an
  // incremental between two kept points of a chain): key and why.
  std::vector<std::pair<std::string, std::string>> kept_anyway;
  std::vector<RetentionAction> actions;  // in the order to apply
  bool empty() const { return actions.empty(); }
};

// How to remove every point not in `keep` (restore point keys) such that
// every kept point stays restorable: a chain with no kept point is removed;
// points after a chain's newest kept point are removed; points before its
// oldest kept point are merged into it; points between kept points stay
// (kept_anyway), since no operation removes the middle of a chain. A domain
// point stays whole: if any disk needs it, every disk keeps it.
RetentionPlan PlanRetention(const std::vector<RestorePoint>& points, const std::vector<ChainView>& chains,
                            const std::set<std::string>& keep);

// The files of point ID in a chain folder: ID plus each of these, the
// manifest first (what a removal deletes first).
inline constexpr const char* kPointFileExtensions[] = {".json", ".qcow2", ".digests", ".sha256"};

// The files `plan` removes or replaces (every point of a removal, every
// layer of a merge, the point merged into included): CHAIN_DIR/ID.json,
// .qcow2, .digests and .sha256, whether or not each exists. What a forget
// checks for S3 Object Lock before it starts (pipeline/object_lock.h).
std::vector<std::string> PlanTouchedFiles(const RetentionPlan& plan);

// The `count` newest points (the retention_count rule: after a backup,
// the new point and the retention_count - 1 newest others).
std::set<std::string> KeepNewest(const std::vector<RestorePoint>& points, size_t count);

// restic-style selection (restic's `forget` policy): the newest `last`
// points; the newest point of each of the `hourly` newest hours (UTC) that
// have points; likewise days, ISO weeks, months and years; every point
// whose time is within `within` of the newest point (later than newest -
// within). The union is kept.
struct ForgetPolicy {
  // (Field order: the older four first, so brace-initialised values keep
  // their meaning.)
  uint32_t keep_last = 0;
  uint32_t keep_daily = 0;
  uint32_t keep_weekly = 0;
  uint32_t keep_monthly = 0;
  uint32_t keep_hourly = 0;
  uint32_t keep_yearly = 0;
  std::chrono::seconds keep_within{0};
  // No rule keeps anything: forget would remove every point.
  bool empty() const {
    return keep_last == 0 && keep_hourly == 0 && keep_daily == 0 && keep_weekly == 0 && keep_monthly == 0 &&
           keep_yearly == 0 && keep_within.count() <= 0;
  }
};

// Restore point key -> why it is kept, one entry per rule that keeps it, in
// rule order: "last 3" (--keep-last 3), "hourly 2026-11-25T14", "daily
// 2026-11-25", "weekly 2026-W48", "monthly 2026-11", "yearly 2026",
// "within 2d12h". Points not kept are absent.
using ForgetSelection = std::map<std::string, std::vector<std::string>>;

// kInvalidArgument, naming the keep rules, when `policy` is empty() (that
// would forget everything); ok otherwise.
Status CheckForgetPolicy(const ForgetPolicy& policy);

// kInvalidArgument as CheckForgetPolicy.
Result<ForgetSelection> SelectForgetWhy(const std::vector<RestorePoint>& points, const ForgetPolicy& policy);
// The keys (the points kept) of a selection.
std::set<std::string> KeysOf(const ForgetSelection& selection);

}  // namespace barge::orchestrate
