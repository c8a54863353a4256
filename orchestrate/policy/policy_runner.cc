// One run of a policy, and forget (orchestrate/policy/policy_runner.h).
#include "orchestrate/policy/policy_runner.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "blockio/path.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/base/hooks.h"
#include "orchestrate/policy/policy_offsite.h"
#include "orchestrate/schedule/time_text.h"
#include "pipeline/backup.h"
#include "pipeline/chain.h"
#include "pipeline/chain_files.h"
#include "pipeline/disk_identity.h"
#include "pipeline/export_lock.h"
#include "pipeline/file_access.h"
#include "pipeline/merge.h"
#include "pipeline/object_lock.h"

namespace barge::orchestrate {

namespace {

// The owner file in a policy folder (PolicyOwnerPath).
constexpr const char* kPolicyOwnerFile = ".barge-policy";

// Why `policy` may not write to `target`'s folder of its name: it belongs
// to the policy file `owner`.
Error ForeignOwner(const Policy& policy, const std::string& target, const std::string& owner) {
  return Error::InvalidArgument("policy " + policy.name + " of " + policy.file + ": the folder " + target + "/" +
                                policy.name + " belongs to policy file " + owner +
                                ", which has the same name; give one of them another `name`")
      .set_path(PolicyOwnerPath(target, policy.name));
}

// Records `policy`'s file as the owner of `target`'s folder of its name,
// unless another run recorded one first. The file is published complete,
// with a link that never replaces (Env::Link): of two runs that claim at
// once (two policy files of one name) one wins, and the other reads the
// winner's file. Returns the owner now recorded.
Result<std::string> RecordOwner(Env& env, const std::string& target, const Policy& policy) {
  const std::string path = PolicyOwnerPath(target, policy.name);
  const std::string mine = path + "." + std::to_string(ProcessOwner::Self(env).pid);
  BARGE_RETURN_IF_ERROR(pipeline::WriteFileLikeFolder(env, mine, policy.file + "\n"));
  Status linked = env.Link(mine, path);
  IgnoreError(env.Unlink(mine), "a stray hidden file in the policy folder is harmless");
  if (linked.ok()) {
    BARGE_RETURN_IF_ERROR(env.SyncDir(DirName(path)));
    return policy.file;
  }
  if (linked.error().errno_value() != EEXIST) return std::move(linked).error();
  return PolicyFolderOwner(env, target, policy.name);
}

bool Selected(const std::vector<std::string>& only, const std::string& name) {
  return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
}

Result<std::unique_ptr<EnvLock>> LockPolicy(Env& env, const std::string& catalog_path, const std::string& policy,
                                            bool wait, std::optional<uint32_t> shard_index = std::nullopt) {
  const std::string what = shard_index ? "a run of shard " + std::to_string(*shard_index) + " of policy " + policy
                                       : "a run of policy " + policy;
  return TryLockFile(env, PolicyLockPath(catalog_path, policy, shard_index), what + " is in progress", wait);
}

class Runner {
 public:
  Runner(const Policy& policy, const RunOptions& options, Env& env, SourceBackend& backend, PolicyCatalog& catalog)
      : policy_(policy), opt_(options), env_(env), backend_(backend), catalog_(catalog) {
    now_ = options.now ? options.now : [] { return NowSeconds(); };
    if (options.pick) {
      pick_ = options.pick;
    } else {
      pick_ = [this](size_t n) {
        std::lock_guard lock(mu_);
        return std::uniform_int_distribution<size_t>(0, n - 1)(rng_);
      };
    }
    run_id_ = policy.name + (options.shard.sharded() ? "-shard" + std::to_string(options.shard.index) : "") + "-" +
              FormatRfc3339(now_()) + "-" + std::to_string(ProcessOwner::Self(env_).pid);
    host_ = ProcessOwner::Self(env_).host;
  }

  // Runs f with the catalog connection to itself.
  template <typename F>
  auto Locked(F f) {
    std::lock_guard lock(catalog_mu_);
    return f();
  }

  Result<RunReport> Run() {
    RunReport report;
    report.run_id = run_id_;
    if (!policy_.target_group.empty()) {
      auto access = pipeline::AccessForGroup(policy_.target_group);
      if (!access.ok()) return Error(access.error()).Wrap("policy " + policy_.name + ": target_group");
      target_access_ = *access;
    }
    std::vector<size_t> due;
    for (const auto& s : policy_.sources) {
      if (!Selected(opt_.only_sources, s.name) || !InShard(opt_.shard, s.name)) continue;
      SourceOutcome o;
      o.source = s.name;
      BARGE_ASSIGN_OR_RETURN(SourceState st, Locked([&] { return catalog_.StateOf(policy_.name, s.name); }));
      o.due = DecideDue(policy_, st, now_(), false, opt_.retry_failed_after);
      if (opt_.manual) {
        o.due.due = true;
        o.due.trigger = Trigger::kManual;
        o.due.why = "manual run";
      }
      if (o.due.due) due.push_back(report.sources.size());
      report.sources.push_back(std::move(o));
    }
    if (due.empty()) return report;

    std::atomic<size_t> next{0};
    std::atomic<size_t> active_workers{0};
    auto worker = [&] {
      for (size_t i; (i = next.fetch_add(1)) < due.size();) {
        SourceOutcome& o = report.sources[due[i]];
        RunSource(*policy_.FindSource(o.source), o);
      }
      std::lock_guard lock(mu_);
      if (--active_workers == 0) done_cv_.notify_all();
    };
    const size_t n = std::min<size_t>(policy_.max_parallel, due.size());
    active_workers = n;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) threads.emplace_back(worker);
    Watch(active_workers);
    for (auto& t : threads) t.join();

    for (const auto& o : report.sources) {
      if (!o.ran) continue;
      ++report.ran;
      if (o.record.result != "success") ++report.failed;
    }
    report.stopped = cancel_.load();
    report.stop_reason = StopReason();
    return report;
  }

 private:
  std::string StopReason() {
    std::lock_guard lock(mu_);
    return stop_reason_;
  }

  // Stops the run at max_run_time or when asked; returns when every worker
  // is done.
  void Watch(std::atomic<size_t>& active) {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mu_);
    while (active.load() > 0) {
      done_cv_.wait_for(lock, std::chrono::milliseconds(50));
      if (cancel_) continue;
      if (policy_.max_run_time.count() > 0 && std::chrono::steady_clock::now() - start >= policy_.max_run_time) {
        stop_reason_ = "stopped: max_run_time " + FormatDuration(policy_.max_run_time) + " exceeded";
        cancel_ = true;
      } else if (opt_.stop != nullptr && opt_.stop->load()) {
        stop_reason_ = opt_.stop_reason ? opt_.stop_reason() : "stopped: the run was asked to stop";
        cancel_ = true;
      }
    }
  }

  void RunSource(const PolicySource& s, SourceOutcome& o) {
    o.ran = true;
    RunRecord& r = o.record;
    r.run_id = run_id_;
    r.policy = policy_.name;
    r.source = s.name;
    r.source_kind = std::string(PolicySourceKindName(s.kind));
    r.trigger = std::string(TriggerName(o.due.trigger));
    r.trigger_detail = o.due.why;
    r.reason = policy_.reason;
    r.host = host_;
    r.started_at = FormatRfc3339(now_());
    r.barge_version = BargeVersion();
    r.shard = opt_.shard;
    r.result = "running";
    auto id = Locked([&] { return catalog_.BeginRun(r); });
    if (!id.ok()) {
      r.result = "failed";
      r.error = id.error().ToString();
      return;
    }
    r.id = *id;
    const auto t0 = std::chrono::steady_clock::now();
    Status result = Backup(s, o);
    r.duration_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.finished_at = FormatRfc3339(now_());
    if (result.ok()) {
      r.result = "success";
    } else {
      r.result = "failed";
      if (!o.offsite_failed) r.points.clear();  // an offsite failure keeps the point it copies
      std::string stop = cancel_ ? StopReason() : "";
      std::string why = result.error().ToString();
      if (o.offsite_failed) why = OffsiteFailureText(*policy_.OffsiteOf(r.target), result.error());
      r.error = stop.empty() ? why : stop + " (" + why + ")";
    }
    Status finished = Locked([&] { return catalog_.FinishRun(*id, r); });
    if (!finished.ok()) {
      r.result = "failed";
      r.error += std::string(r.error.empty() ? "" : "; ") + "record not written: " + finished.error().ToString();
    }
  }

  Status Backup(const PolicySource& s, SourceOutcome& o) {
    RunRecord& r = o.record;
    if (cancel_) return Error::Cancelled("not started");
    // One backup of a source at a time among every worker whose catalog
    // shares this folder (the workers of a sharded policy with one records
    // folder), whatever target each would choose; workers with separate
    // folders meet at the chain folder's lock.
    BARGE_ASSIGN_OR_RETURN(auto source_lock,
                           TryLockFile(env_, SourceLockPath(opt_.catalog_path, policy_.name, s.name),
                                       "source " + s.name + " of policy " + policy_.name +
                                           " is being backed up by another worker"));
    BARGE_ASSIGN_OR_RETURN(SourcePoints points, ScanSource(env_, policy_, s));
    // Records of points an interrupted retention already removed or folded.
    BARGE_RETURN_IF_ERROR(Locked([&] { return MarkMissingPointsRemoved(env_, catalog_, policy_, s, points); }));

    // Full or incremental.
    std::string blocker;
    if (points.newest_chain) {
      // An incremental extends only its own disk's chain: a source that
      // reads another disk now (its location changed, or another policy
      // of this name wrote the chain) starts a new chain, saying why. A
      // disk `barge state migrate` moved is still its chain's (moved_from).
      BARGE_ASSIGN_OR_RETURN(std::optional<formats::DiskIdentity> identity, backend_.IdentifyDisk(s));
      if (identity) {
        BARGE_ASSIGN_OR_RETURN(std::string other, pipeline::OtherDiskReason(points.newest_folder, *identity));
        if (!other.empty()) blocker = other + ": a new chain starts";
      }
    }
    if (points.newest_chain && blocker.empty()) {
      std::string last_cleared;
      BARGE_ASSIGN_OR_RETURN(auto runs, Locked([&] { return catalog_.ListRuns({policy_.name, s.name, 50}); }));
      for (const auto& run : runs) {
        if (run.result != "success") continue;
        for (const auto& p : run.points) {
          if (p.chain_dir == points.newest_chain_dir) last_cleared = p.id;
        }
        break;
      }
      BARGE_ASSIGN_OR_RETURN(blocker, backend_.IncrementalBlocker(s, points.newest_id, last_cleared));
    }
    if (opt_.full) blocker = "a full backup was asked for (--full)";
    TypeDecision type = DecideBackupType(policy_, s, points.newest_chain, blocker.empty(), blocker);

    // Placement.
    BARGE_ASSIGN_OR_RETURN(uint64_t allocated, backend_.AllocatedBytes(s));
    BARGE_ASSIGN_OR_RETURN(auto counts, Locked([&] { return catalog_.SuccessCounts(policy_.name, s.name); }));
    std::vector<TargetState> targets;
    for (const auto& t : policy_.targets) {
      TargetState ts{t, std::nullopt, "", counts.count(t) ? counts[t] : 0};
      auto space = env_.Space(t);
      if (!space.ok()) {
        ts.error = space.error().ToString();
        ts.error_code = space.error().code();
      } else if (space->read_only) {
        const Error read_only = Error::IoError("the filesystem is mounted read-only").set_path(t);
        ts.error = read_only.ToString();
        ts.error_code = read_only.code();
      } else {
        ts.free_bytes = space->free_bytes;
      }
      targets.push_back(std::move(ts));
    }
    BARGE_ASSIGN_OR_RETURN(Placement place,
                           PlaceBackup(targets, allocated, policy_.free_space_multiple, type, points.newest_chain,
                                       pick_));
    r.target = place.target;
    r.type = place.incremental ? "incremental" : "full";
    r.type_reason = place.incremental ? type.reason : place.reason;

    HookContext ctx{policy_.name, s.name, "pre", place.target, "", ""};
    // The post hook runs after every pre hook, whatever happened between
    // (it may undo what the pre hook did, e.g. thaw a frozen filesystem).
    auto post_hook = [&](const std::string& result, const std::string& error) -> Status {
      if (!policy_.post_hook) return OkStatus();
      ctx.phase = "post";
      ctx.result = result;
      ctx.error = error;
      Status post = opt_.hooks->Run(*policy_.post_hook, ctx, nullptr);
      if (!post.ok()) return std::move(post).error().Wrap("post_hook");
      return OkStatus();
    };
    if (policy_.pre_hook) {
      Status pre = opt_.hooks->Run(*policy_.pre_hook, ctx, &cancel_);
      if (!pre.ok()) {
        Error e = std::move(pre).error().Wrap("pre_hook (backup skipped)");
        Status post = post_hook("aborted", e.ToString());
        std::vector<std::string> unused;  // after an aborted backup the rule never warns
        return ApplyPostHookRule(std::move(e), std::move(post), unused);
      }
    }
    SourceBackupRequest req;
    req.source = &s;
    req.policy = policy_.name;
    req.target_dir = place.target + "/" + policy_.name;
    req.incremental = place.incremental;
    req.reason = r.type_reason;
    req.compression = policy_.compression;
    req.compression_level = policy_.compression_level;
    req.catalog_path = opt_.catalog_path;
    if (!policy_.target_group.empty()) req.access = target_access_;
    req.copy = opt_.copy;
    req.copy.cancel = &cancel_;
    Result<SourceBackupResult> done = Error::Internal("not run");
    // The folder is claimed (and released below) whatever happens.
    Status made = ClaimFolder(place.target, req.access);
    if (made.ok()) {
      done = backend_.Backup(req);
    } else {
      done = made.error();
    }
    ReleaseFolder(place.target, done.ok());
    Status post = post_hook(done.ok() ? "success" : "failed", done.ok() ? "" : done.error().ToString());
    // The one rule (orchestrate/base/hooks.h): a failed post hook after a good
    // backup is a warning on the record, the point kept; after a failed one
    // it joins the error.
    std::vector<std::string> warnings;
    Status ruled = ApplyPostHookRule(done.ok() ? OkStatus() : Status(done.error()), std::move(post), warnings);
    if (!ruled.ok()) return std::move(ruled).error();
    r.type = done->type;
    r.type_reason = done->type_reason;
    r.bytes_read = done->bytes_read;
    r.bytes_written = done->bytes_written;
    r.points = done->points;
    if (!done->warning.empty()) warnings.insert(warnings.begin(), done->warning);
    r.error.clear();
    for (const std::string& w : warnings) r.error += (r.error.empty() ? "" : "; ") + w;
    BARGE_RETURN_IF_ERROR(RetainAfter(s, o, done->points));
    return CopyOffsite(s, o, place.target);
  }

  // The target's offsite copy, once its new point is committed, verified
  // and its retention done (policy_offsite.h). A failure fails the source
  // (o.offsite_failed) without touching the point on the target; the next
  // run backs up again and syncs every point the offsite lacks.
  Status CopyOffsite(const PolicySource& s, SourceOutcome& o, const std::string& target) {
    const PolicyOffsite* offsite = policy_.OffsiteOf(target);
    if (offsite == nullptr) return OkStatus();
    pipeline::CopyOptions copy = opt_.copy;
    copy.cancel = &cancel_;
    Result<std::string> done = cancel_ ? Result<std::string>(Error::Cancelled("the run was stopped before the copy"))
                                       : SyncOffsite(env_, policy_, s, *offsite, copy);
    if (!done.ok()) {
      o.offsite_failed = true;
      o.offsite = OffsiteFailureText(*offsite, done.error());
      return done.error();
    }
    o.offsite = *done;
    return OkStatus();
  }

  // Retention, once the new point of `s` (`made`, one part per disk) is
  // committed: it must open as a restore opens it (manifests, digest
  // tables against the image digest, the qcow2 backing chain the manifests
  // name), else the source fails and nothing is removed. Keeps
  // retention_count points, the new one included. A retention failure is
  // reported on the outcome and does not fail the backup.
  Status RetainAfter(const PolicySource& s, SourceOutcome& o, const std::vector<PointPart>& made) {
    for (const auto& part : made) {
      Status ok = VerifyNewPoint(part);
      if (!ok.ok()) {
        o.retention = "retention skipped: the new point does not verify";
        return std::move(ok).error().Wrap("the new point " + part.id + " does not verify; retention skipped");
      }
    }
    if (cancel_) {
      o.retention = "retention skipped: the run was stopped";
      return OkStatus();
    }
    auto points = ScanSource(env_, policy_, s);
    if (!points.ok()) {
      o.retention = "retention skipped: " + points.error().ToString();
      return OkStatus();
    }
    // The restore point(s) the new parts belong to: always kept.
    std::set<std::string> fresh;
    size_t found = 0;
    for (const auto& p : points->points) {
      for (const auto& part : p.parts) {
        for (const auto& m : made) {
          if (part.chain_dir == m.chain_dir && part.id == m.id) {
            fresh.insert(p.key);
            ++found;
          }
        }
      }
    }
    if (found != made.size()) {
      o.retention = "retention skipped: the new point is not among the source's points";
      return OkStatus();
    }
    if (points->points.size() <= policy_.retention_count) return OkStatus();
    std::vector<RestorePoint> older;
    for (const auto& p : points->points) {
      if (!fresh.count(p.key)) older.push_back(p);
    }
    const size_t room = policy_.retention_count > fresh.size() ? policy_.retention_count - fresh.size() : 0;
    std::set<std::string> keep = KeepNewest(older, room);
    keep.insert(fresh.begin(), fresh.end());
    RetentionPlan plan = PlanRetention(points->points, points->chains, keep);
    pipeline::CopyOptions copy = opt_.copy;
    copy.cancel = &cancel_;  // a merge stops with the run (its new file removed)
    Status applied = Locked([&] { return ApplyRetention(env_, plan, &catalog_, copy); });
    o.retention = std::to_string(plan.forget.size()) + " point(s) removed";
    if (!applied.ok()) {
      o.retention = "retention failed: " + applied.error().ToString();
      // A retention that failed after a merge or removal committed.
      auto after = ScanSource(env_, policy_, s);
      if (after.ok()) {
        IgnoreError(Locked([&] { return MarkMissingPointsRemoved(env_, catalog_, policy_, s, *after); }),
                    "the next run marks them; the retention's own error is reported");
      }
    }
    return OkStatus();
  }

  // Creates <target>/<policy> and records the policy file as its owner
  // (once); refuses a folder another policy file owns. The caller is a
  // claimant of the folder until its ReleaseFolder, also when this fails.
  Status ClaimFolder(const std::string& target, const std::optional<pipeline::FileAccess>& access) {
    const std::string dir = target + "/" + policy_.name;
    std::lock_guard lock(claim_mu_);  // sources of one run claim one folder
    FolderClaims& c = claims_[target];
    if (c.active++ == 0) c.created = !env_.Exists(dir);
    // Private unless the policy names a target_group (then the folder is
    // the group's, as its chains are).
    BARGE_RETURN_IF_ERROR(pipeline::CreateFolders(env_, dir, access.value_or(pipeline::FileAccess::Private())));
    if (access) BARGE_RETURN_IF_ERROR(pipeline::ShareFolder(env_, dir, *access));
    if (policy_.file.empty()) return OkStatus();
    BARGE_ASSIGN_OR_RETURN(std::string owner, PolicyFolderOwner(env_, target, policy_.name));
    if (owner.empty()) {
      BARGE_ASSIGN_OR_RETURN(owner, RecordOwner(env_, target, policy_));
    }
    if (owner != policy_.file) return ForeignOwner(policy_, target, owner);
    return OkStatus();
  }

  // Ends a ClaimFolder. A failed first backup leaves no folder behind, as a
  // plain backup does: when the last claimant of a folder this run created
  // fails, the folder goes again if it holds nothing but its owner file
  // (another source of this run may have filled it: then it stays).
  void ReleaseFolder(const std::string& target, bool succeeded) {
    std::lock_guard lock(claim_mu_);
    FolderClaims& c = claims_[target];
    if (--c.active > 0 || succeeded || !c.created) return;
    const std::string dir = target + "/" + policy_.name;
    auto names = env_.ListDir(dir);
    if (!names.ok()) return;
    for (const auto& n : *names) {
      if (n != kPolicyOwnerFile) return;
    }
    if (!names->empty() && !env_.Unlink(PolicyOwnerPath(target, policy_.name)).ok()) return;
    IgnoreError(env_.RemoveDir(dir), "a folder another process filled meanwhile stays");
  }

  // The new point opens as a restore would open it.
  Status VerifyNewPoint(const PointPart& part) {
    BARGE_ASSIGN_OR_RETURN(pipeline::ChainFolder chain, pipeline::LoadChainFolder(env_, part.chain_dir));
    for (size_t i = 0; i < chain.points.size(); ++i) {
      if (chain.points[i].manifest.id != part.id) continue;
      auto opened = pipeline::OpenPoint(env_, chain, i);
      if (!opened.ok()) return opened.error();
      return OkStatus();
    }
    return Error::NotFound("no point " + part.id + " in its chain folder").set_path(part.chain_dir);
  }

  const Policy& policy_;
  const RunOptions& opt_;
  Env& env_;
  SourceBackend& backend_;
  PolicyCatalog& catalog_;  // guarded by catalog_mu_
  std::mutex catalog_mu_;
  // Per target: the sources of this run between ClaimFolder and
  // ReleaseFolder, and whether the first of them created the policy folder.
  struct FolderClaims {
    int active = 0;
    bool created = false;
  };
  std::mutex claim_mu_;
  std::map<std::string, FolderClaims> claims_;  // guarded by claim_mu_
  pipeline::FileAccess target_access_;  // of policy_.target_group, set by Run before any backup
  std::function<SysSeconds()> now_;
  PickFn pick_;
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::mt19937_64 rng_{std::random_device{}()};  // guarded by mu_
  std::string stop_reason_;                      // guarded by mu_
  std::atomic<bool> cancel_{false};
  std::string run_id_;
  std::string host_;
};

// The selection and plan of one source's (or folder's) points into `rep`.
Status PlanForget(const SourcePoints& points, const ForgetPolicy& keep, ForgetSourceReport& rep) {
  BARGE_ASSIGN_OR_RETURN(rep.why_kept, SelectForgetWhy(points.points, keep));
  rep.points = points.points;
  rep.plan = PlanRetention(points.points, points.chains, KeysOf(rep.why_kept));
  return OkStatus();
}

}  // namespace

std::string PolicyOwnerPath(const std::string& target, const std::string& policy_name) {
  return target + "/" + policy_name + "/" + kPolicyOwnerFile;
}

Result<std::string> PolicyFolderOwner(Env& env, const std::string& target, const std::string& policy_name) {
  const std::string path = PolicyOwnerPath(target, policy_name);
  // Never through a link or a FIFO planted under its name.
  auto text = pipeline::ReadChainFile(env, path, 64 << 10);
  if (!text.ok()) {
    if (text.error().code() == ErrorCode::kNotFound) return std::string();
    return text.error();
  }
  std::string owner = *text;
  while (!owner.empty() && (owner.back() == '\n' || owner.back() == '\r')) owner.pop_back();
  if (owner.empty() || owner.find('\n') != std::string::npos) {
    return Error::Corruption("not a policy owner file (one line, the policy file's path)").set_path(path);
  }
  return owner;
}

Status CheckPolicyFolders(Env& env, const Policy& policy) {
  if (policy.file.empty()) return OkStatus();
  for (const auto& t : policy.targets) {
    BARGE_ASSIGN_OR_RETURN(std::string owner, PolicyFolderOwner(env, t, policy.name));
    if (owner.empty() || owner == policy.file) continue;
    return ForeignOwner(policy, t, owner);
  }
  return OkStatus();
}

std::string PolicyLockPath(const std::string& catalog_path, const std::string& policy,
                           std::optional<uint32_t> shard_index) {
  return CatalogLockPath(catalog_path, LockKind::kPolicy,
                         shard_index ? policy + ".shard-" + std::to_string(*shard_index) : policy);
}

std::string BargeVersion() { return pipeline::BackupRequest().tool_version; }

Result<RunReport> RunPolicyOnce(Env& env, const Policy& policy, const RunOptions& options) {
  if ((policy.pre_hook || policy.post_hook) && options.hooks == nullptr) {
    return Error::InvalidArgument("policy " + policy.name + " has hooks but no hook runner was given");
  }
  std::unique_ptr<SourceBackend> own_backend;
  SourceBackend* backend = options.backend;
  if (backend == nullptr) {
    own_backend = NewDefaultSourceBackend(env);
    backend = own_backend.get();
  }
  BARGE_RETURN_IF_ERROR(CheckPolicyFolders(env, policy));
  const std::optional<uint32_t> shard_index =
      options.shard.sharded() ? std::optional<uint32_t>(options.shard.index) : std::nullopt;
  BARGE_ASSIGN_OR_RETURN(auto lock,
                         LockPolicy(env, options.catalog_path, policy.name, options.wait_for_lock, shard_index));
  BARGE_ASSIGN_OR_RETURN(auto catalog, PolicyCatalog::Open(env, options.catalog_path));
  // We hold the lock: a "running" record of this shard (or of an unsharded
  // run) is a dead process's.
  BARGE_RETURN_IF_ERROR(catalog->FailInterrupted(policy.name, shard_index));
  Runner runner(policy, options, env, *backend, *catalog);
  const auto t0 = std::chrono::steady_clock::now();
  const SysSeconds started = options.now ? options.now() : NowSeconds();
  BARGE_ASSIGN_OR_RETURN(RunReport report, runner.Run());
  report.shard = options.shard;
  report.started_at = started;
  report.duration_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string SourceLockPath(const std::string& catalog_path, const std::string& policy, const std::string& source) {
  // '@' is in no policy name: the pair is unambiguous.
  return CatalogLockPath(catalog_path, LockKind::kPolicy, policy + "@" + source);
}

Result<size_t> SettleCutRuns(Env& env, const std::string& catalog_path, PolicyCatalog& catalog) {
  BARGE_ASSIGN_OR_RETURN(auto runs, catalog.ListRuns());
  // (policy, shard index or none) of the records still running.
  std::set<std::pair<std::string, std::optional<uint32_t>>> open;
  for (const auto& r : runs) {
    if (r.result != "running") continue;
    open.insert({r.policy, r.shard.sharded() ? std::optional<uint32_t>(r.shard.index) : std::nullopt});
  }
  size_t settled = 0;
  for (const auto& [policy, shard_index] : open) {
    auto lock = LockPolicy(env, catalog_path, policy, false, shard_index);
    if (!lock.ok()) {
      if (lock.error().code() == ErrorCode::kBusy) continue;  // the run is alive
      return lock.error();
    }
    BARGE_ASSIGN_OR_RETURN(size_t n, catalog.FailInterrupted(policy, shard_index));
    settled += n;
  }
  return settled;
}

Result<std::vector<ForgetSourceReport>> ForgetPoints(Env& env, const Policy& policy, const ForgetPolicy& keep,
                                                     const ForgetOptions& options) {
  for (const auto& want : options.only_sources) {
    if (policy.FindSource(want) == nullptr) {
      return Error::NotFound("policy " + policy.name + " has no source '" + want + "'");
    }
  }
  BARGE_RETURN_IF_ERROR(CheckPolicyFolders(env, policy));
  BARGE_ASSIGN_OR_RETURN(auto lock, LockPolicy(env, options.catalog_path, policy.name, options.wait_for_lock));
  std::unique_ptr<PolicyCatalog> catalog;
  if (!options.dry_run) {
    BARGE_ASSIGN_OR_RETURN(catalog, PolicyCatalog::Open(env, options.catalog_path));
  }
  std::vector<ForgetSourceReport> out;
  for (const auto& s : policy.sources) {
    if (!Selected(options.only_sources, s.name)) continue;
    ForgetSourceReport rep;
    rep.source = s.name;
    auto points = ScanSource(env, policy, s);
    if (!points.ok()) {
      rep.error = points.error().ToString();
      out.push_back(std::move(rep));
      continue;
    }
    BARGE_RETURN_IF_ERROR(PlanForget(*points, keep, rep));
    if (!options.dry_run) {
      Status s2 = ApplyRetention(env, rep.plan, catalog.get(), options.copy);
      if (!s2.ok()) rep.error = s2.error().ToString();
    }
    out.push_back(std::move(rep));
  }
  return out;
}

Result<ForgetSourceReport> ForgetChainFolder(Env& env, const std::string& chain_dir, const ForgetPolicy& keep,
                                             const ForgetOptions& options) {
  // Refused before the lock file is made.
  BARGE_RETURN_IF_ERROR(CheckForgetPolicy(keep));
  BARGE_ASSIGN_OR_RETURN(bool holds, pipeline::HoldsBackups(env, chain_dir));
  if (!holds) return Error::NotFound("the chain folder holds no backups: nothing to forget").set_path(chain_dir);
  BARGE_ASSIGN_OR_RETURN(pipeline::ChainLock lock, pipeline::ChainLock::Acquire(env, chain_dir, options.wait_for_lock));
  // Under the lock: an interrupted merge is completed first, then nothing
  // changes the folder until the last action is done.
  BARGE_ASSIGN_OR_RETURN(pipeline::ChainFolder folder, pipeline::LoadChainFolder(env, chain_dir, &lock));
  BARGE_ASSIGN_OR_RETURN(SourcePoints points, ScanChainFolder(folder));
  // Points other chains stand on stay (stale references swept unless dry).
  BARGE_RETURN_IF_ERROR(PinBases(env, points.chains, !options.dry_run));
  ForgetSourceReport rep;
  rep.source = chain_dir;
  BARGE_RETURN_IF_ERROR(PlanForget(points, keep, rep));
  if (options.dry_run || rep.plan.empty()) return rep;
  // Never from under an export: refused as a whole (kBusy, exit 4).
  BARGE_RETURN_IF_ERROR(pipeline::CheckNotExported(env, chain_dir));
  // Nor while a point it removes is under S3 Object Lock (kInvalidArgument
  // "... is locked until ...", exit 1): refused as a whole.
  BARGE_RETURN_IF_ERROR(pipeline::CheckNotLocked(env, PlanTouchedFiles(rep.plan)));
  // A policy's chain folder: its run records learn what went. Never a new
  // catalog for a folder no policy made.
  std::unique_ptr<PolicyCatalog> catalog;
  if (!options.catalog_path.empty() && env.Exists(options.catalog_path)) {
    BARGE_ASSIGN_OR_RETURN(catalog, PolicyCatalog::Open(env, options.catalog_path));
  }
  Status applied = ApplyRetention(env, rep.plan, catalog.get(), options.copy, &lock);
  if (!applied.ok()) rep.error = applied.error().ToString();
  return rep;
}

}  // namespace barge::orchestrate
