// Runs a backup policy once (`barge run --policy FILE`, and each tick of
// `barge serve`): under the policy's lock, every due source is backed up
// (max_parallel at once, each failure recorded without stopping the
// others), within max_run_time, with a record per source; retention of a
// source runs only after its new point is committed and verified, so a
// failed backup never costs a restore point. Also `forget` and the scan of a source's points. The
// decisions themselves are pure (orchestrate/policy/policy_decisions.h); this file
// gathers their inputs and carries them out. docs/policies.md.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/manifest.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_catalog.h"
#include "orchestrate/policy/policy_decisions.h"
#include "orchestrate/policy/policy_shard.h"
#include "pipeline/chain.h"
#include "pipeline/copy.h"
#include "pipeline/file_access.h"

namespace barge::orchestrate {

// ---- hooks ----

struct HookContext {
  std::string policy;
  std::string source;
  std::string phase;   // "pre" or "post"
  std::string target;  // the chosen target folder
  // post: "success", "failed" (the backup failed) or "aborted" (the pre
  // hook failed, nothing was backed up); `error` says why when not success.
  std::string result;
  std::string error;
};

// Runs pre/post hook commands. The policy runner needs only this;
// NewPolicyHookRunner (orchestrate/policy/policy_hooks.h) is the command runner.
// The runner calls the post hook after every pre hook it called, whatever
// happened in between. Thread-safe: hooks of different sources run at once.
class HookRunner {
 public:
  virtual ~HookRunner() = default;
  // Runs `hook` to its end or its timeout, or until *cancel turns true.
  // Returns ok when the command exited 0; an Error saying why otherwise.
  virtual Status Run(const PolicyHook& hook, const HookContext& context, const std::atomic<bool>* cancel) = 0;
};

// ---- where backups come from ----

struct SourceBackupRequest {
  const PolicySource* source = nullptr;  // must outlive the call
  std::string policy;
  std::string target_dir;  // <target>/<policy>: image/NBD chains in target_dir/<source name>,
                           // domain chains in target_dir/<domain>/<disk>
  bool incremental = false;
  std::string reason;      // why this type
  formats::Compression compression = formats::Compression::kZstd;
  int compression_level = formats::kDefaultZstdLevel;
  std::string catalog_path;   // domains: trackers and VM backup records
  // The policy's target_group's access (pipeline::BackupRequest::access);
  // unset: private.
  std::optional<pipeline::FileAccess> access;
  pipeline::CopyOptions copy;  // its `cancel` stops the backup (kCancelled)
};

struct SourceBackupResult {
  std::vector<PointPart> points;  // one per disk
  std::string type;               // "full" or "incremental", as done
  std::string type_reason;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  std::string warning;            // done, but something to report (e.g. a bitmap not cleared)
};

// What the runner asks of a source; the default one backs up through the
// pipeline and libvirt, tests substitute their own. Thread-safe.
class SourceBackend {
 public:
  virtual ~SourceBackend() = default;
  // Bytes the source occupies (the free-space rule's base).
  virtual Result<uint64_t> AllocatedBytes(const PolicySource& source) = 0;
  // The disk the source reads now (pipeline/disk_identity.h), for the
  // runner's check that an incremental extends that disk's own chain, with
  // moved_from set when `barge state migrate` moved it
  // (FollowStateMigrations), as the backup itself will judge it; nullopt =
  // not known here (domains: their chains are per domain disk, and
  // RunVmBackup checks the checkpoint). The default knows none.
  virtual Result<std::optional<formats::DiskIdentity>> IdentifyDisk(const PolicySource& /*source*/) {
    return std::optional<formats::DiskIdentity>();
  }
  // Whether the source's change tracking allows an incremental onto the
  // chain whose newest point is `chain_latest` (an id; "" = no chain);
  // `last_cleared` is the point the policy's last successful run made
  // (the bitmap was cleared after it). Returns "" when it does, else why not.
  virtual Result<std::string> IncrementalBlocker(const PolicySource& source, const std::string& chain_latest,
                                                 const std::string& last_cleared) = 0;
  // One backup. On failure nothing new is left in the chain folders.
  virtual Result<SourceBackupResult> Backup(const SourceBackupRequest& request) = 0;
};

// BackupRequest::previous_location (pipeline/backup.h) for `barge backup`
// and the policy sources alike: where the disk at a canonical path was
// before `barge state migrate` moved its state folder (MovedFromLocation,
// orchestrate/state/state_migrate.h), so an incremental keeps the moved disk's
// chain. `env` must outlive the function.
std::function<std::string(const std::string& canonical_path)> FollowStateMigrations(Env& env);

// Images: pipeline::RunBackup under QEMU's image lock (kExclusiveWrite with
// a bitmap, so no QEMU writes between the read and the bitmap's clear),
// incremental from the persistent bitmap, then the bitmap cleared (or
// added when missing) with formats::RotateBitmap. NBD: RunBackup, full.
// Domains: RunVmBackup (force_full for a full), the tracker created when
// missing. Files are opened through `env`, which must outlive it.
std::unique_ptr<SourceBackend> NewDefaultSourceBackend(Env& env);

// ---- a source's points ----

struct SourcePoints {
  std::vector<RestorePoint> points;
  std::vector<ChainView> chains;
  std::optional<ChainSummary> newest_chain;  // the chain with the newest point
  std::string newest_chain_dir;              // of its first disk
  std::string newest_id;                     // the newest point of that chain folder
  // ScanSource: the folder newest_chain_dir as the scan loaded it (the
  // disk its chain records, for the runner's identity check); empty from
  // ScanChainFolder, whose caller has the folder.
  pipeline::ChainFolder newest_folder;
};

// Every point of `source` on the policy's targets (missing folders are
// empty). kCorruption when a chain folder's points do not form linear
// chains (retention then refuses to touch the source).
Result<SourcePoints> ScanSource(Env& env, const Policy& policy, const PolicySource& source);

// The points of one loaded chain folder, each its own restore point (key
// "<dir>|<id>", time its manifest's started_at), and its linear chains.
// kCorruption as ScanSource. newest_chain's target is the folder.
Result<SourcePoints> ScanChainFolder(const pipeline::ChainFolder& folder);

// Marks the points of `chains` that other chains stand on (their folders'
// live base references, pipeline/base_refs.h) as pinned: retention keeps
// them. With `sweep`, stale references are removed.
Status PinBases(Env& env, std::vector<ChainView>& chains, bool sweep);

// Carries out `plan`: each action under its chain folder's lock (kBusy, the
// action skipped, when a backup or merge of that chain runs), removals
// newest point first (manifest before image and digests; folder synced),
// merges with pipeline::RunMerge; records of removed points are marked in
// `catalog` (may be null). Stops at the first failure and returns it.
// `held`: the caller already holds the lock of every chain folder the plan
// touches (a forget of one chain folder), or null.
Status ApplyRetention(Env& env, const RetentionPlan& plan, PolicyCatalog* catalog, const pipeline::CopyOptions& copy,
                      const pipeline::ChainLock* held = nullptr);

// Records of `source` that say a point part is present whose chain folder
// was scanned into `points` (the folder exists) but no longer holds it are
// marked "removed": a retention merge or removal that committed on disk
// before a crash, an error or a kill could not mark them (issue 13; found
// by the reliability campaign). A folder that is missing (a target not
// mounted) proves nothing and is left alone. Returns the parts marked.
Result<size_t> MarkMissingPointsRemoved(Env& env, PolicyCatalog& catalog, const Policy& policy,
                                        const PolicySource& source, const SourcePoints& points);

// ---- running ----

struct RunOptions {
  std::string catalog_path;  // the policy lock goes to <its folder>/locks/
  std::function<SysSeconds()> now;  // the clock; null: the system clock
  PickFn pick;                      // placement tie-break; null: random
  SourceBackend* backend = nullptr; // null: NewDefaultSourceBackend(env)
  HookRunner* hooks = nullptr;      // required when the policy has hooks
  // Every source is due now (trigger manual), whatever the schedule says.
  bool manual = false;
  // Every backup of this run is a full one (a new chain): for change
  // tracking that was lost in a way barge cannot see (a bitmap removed and
  // added again).
  bool full = false;
  // A source whose last attempt failed is due again once this passed since
  // that attempt (DecideDue): `run` retries at once, `serve` waits
  // (SchedulerOptions::retry_failed_after).
  std::chrono::seconds retry_failed_after{0};
  // Only these sources (names); empty = all.
  std::vector<std::string> only_sources;
  // A sharded run (`--shard I/N`): only the sources that fall to this shard
  // (InShard), under this shard's lock instead of the policy's
  // (PolicyLockPath), and each record says which shard made it. Two
  // workers that overlap (a misconfigured count, a retry while the old
  // worker still runs) never back up one source at once: each backup holds
  // its chain folder's lock, and the second fails that source with kBusy.
  ShardSpec shard;
  // Wait for a run of the same policy to end instead of failing with kBusy.
  bool wait_for_lock = false;
  // Set to stop the run cleanly (SIGTERM): backups in progress are
  // cancelled (partial files removed) and recorded as failed.
  const std::atomic<bool>* stop = nullptr;
  // What the records of a run stopped through `stop` say ("stopped by
  // SIGTERM"); null: "stopped: the run was asked to stop". Called once,
  // when the stop is seen.
  std::function<std::string()> stop_reason;
  pipeline::CopyOptions copy;  // pipeline knobs; `cancel` is the runner's
};

struct SourceOutcome {
  std::string source;
  DueDecision due;
  bool ran = false;
  RunRecord record;             // when ran
  std::string retention;        // what retention did after the backup ("" = nothing), or why it was skipped
  // What the target's offsite copy did ("" = the target has none, or the
  // backup failed), or why it failed: then the record is failed (its error
  // OffsiteFailureText) and keeps its point.
  std::string offsite;
  bool offsite_failed = false;
};

struct RunReport {
  std::string run_id;
  ShardSpec shard;               // RunOptions::shard
  SysSeconds started_at{};       // when the run began (RunOptions::now)
  double duration_seconds = 0;   // how long it took, lock and retention included
  std::vector<SourceOutcome> sources;
  size_t ran = 0;
  size_t failed = 0;
  bool stopped = false;         // by max_run_time or `stop`
  std::string stop_reason;
};

// Runs what is due now.
// Returns: the report (source failures are in it, not errors); kBusy when
// another run of the policy holds its lock (unless wait_for_lock);
// kInvalidArgument when a target's folder of the policy's name belongs to
// another policy file (CheckPolicyFolders);
// kInvalidArgument when the policy has hooks and no HookRunner was given;
// catalog errors.
Result<RunReport> RunPolicyOnce(Env& env, const Policy& policy, const RunOptions& options);

// Records left "running" in `catalog` (at `catalog_path`) by a run whose
// process is gone (killed, crashed, its machine lost): for each policy and
// shard that has such records, the lock its run held (PolicyLockPath) is
// tried without waiting; when it is free, that run's process ended (the
// kernel releases an flock with its holder) and its records become failed
// with "interrupted: the run's process ended" (FailInterrupted), as the
// next run of that shard would mark them. A lock held means the run is
// alive: its records stay "running". Returns how many records changed.
Result<size_t> SettleCutRuns(Env& env, const std::string& catalog_path, PolicyCatalog& catalog);

// ---- forget ----

struct ForgetOptions {
  std::string catalog_path;
  std::vector<std::string> only_sources;  // empty = every source of the policy
  bool dry_run = false;
  bool wait_for_lock = false;
  pipeline::CopyOptions copy;
};

struct ForgetSourceReport {
  std::string source;  // a policy's source name, or the chain folder
  std::vector<RestorePoint> points;  // as scanned before anything changed
  ForgetSelection why_kept;          // the rules that keep each selected point
  RetentionPlan plan;
  std::string error;  // the plan could not be made or applied
};

// restic-style retention over each source's points with the guarantee of
// PlanRetention; with dry_run only the plans. Takes the policy's lock
// (kBusy when a run holds it, unless wait_for_lock).
Result<std::vector<ForgetSourceReport>> ForgetPoints(Env& env, const Policy& policy, const ForgetPolicy& keep,
                                                     const ForgetOptions& options);

// The same over one chain folder (`barge forget DIR`), every point of it a
// restore point: under the folder's chain lock from the scan to the last
// action (kBusy when a backup or merge holds it, unless wait_for_lock), so
// nothing changes between plan and removal. Records of removed points are
// marked in the catalog at options.catalog_path when that file exists (it
// is never created here; "" = none). The report's error says why an action
// failed; kNotFound for a missing folder, kInvalidArgument for an empty
// `keep`, kCorruption when the points do not form linear chains.
Result<ForgetSourceReport> ForgetChainFolder(Env& env, const std::string& chain_dir, const ForgetPolicy& keep,
                                             const ForgetOptions& options);

// ---- which policy file owns a target's policy folder ----

// Chains of a policy live in <target>/<policy name>/; two policy files
// with one name writing to one target would mix their points (and one's
// retention would remove the other's). The first run that writes there
// records its policy file (Policy::file) in <target>/<name>/.barge-policy
// (published complete, and never replaced: of two runs that claim at once,
// one wins); a run or forget of a policy with the same name from another
// file is refused.
std::string PolicyOwnerPath(const std::string& target, const std::string& policy_name);

// The policy file recorded in `target`'s folder of `policy_name`; "" when
// none is (no folder, or a folder from before owner files).
Result<std::string> PolicyFolderOwner(Env& env, const std::string& target, const std::string& policy_name);

// kInvalidArgument naming both files when a target's folder of the
// policy's name belongs to another policy file; ok otherwise (and always
// for a policy with no `file`).
Status CheckPolicyFolders(Env& env, const Policy& policy);

// What `policy check` can see now that would fail or surprise a run, one
// message each: a target folder that does not exist (or is no folder) or
// whose policy folder belongs to another policy file (same name); an image
// source that does not exist or cannot be opened; a bitmap the image does
// not have (every backup full until the first adds it). Domains and NBD
// exports are not contacted.
std::vector<std::string> PolicyWarnings(Env& env, const Policy& policy);

// The lock file of a policy (CatalogLockPath's kPolicy):
// <catalog folder>/locks/policies/<name>.lock; of shard index I of a
// sharded run, <name>.shard-I.lock (by index only: workers of I/N and I/M
// exclude each other, as do two workers of one shard).
std::string PolicyLockPath(const std::string& catalog_path, const std::string& policy,
                           std::optional<uint32_t> shard_index = std::nullopt);

// The lock a run holds while it backs up `source` (its backup, hooks and
// retention): <catalog folder>/locks/policies/<policy>@<source>.lock. Two
// workers whose catalogs share a folder (a records folder of a sharded
// policy) never back up one source at once, whatever target each would
// pick; the second fails the source with kBusy.
std::string SourceLockPath(const std::string& catalog_path, const std::string& policy, const std::string& source);

// barge's version as records and manifests state it.
std::string BargeVersion();

}  // namespace barge::orchestrate
