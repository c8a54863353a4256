// barge policy check | run | forget | runs list: backup policies from the
// command line (docs/policies.md). `barge serve` is in serve_command.cc.
#include <algorithm>
#include <iostream>
#include <map>

#include "blockio/nbd.h"
#include "cli/bucket_routing.h"
#include "cli/common.h"
#include "cli/http_flags.h"
#include "orchestrate/libvirt/libvirt_uri.h"
#include "cli/copy_flags.h"
#include "cli/interrupt.h"
#include "cli/owner_flag.h"
#include "cli/policy_output.h"
#include "cli/shard_flag.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/policy/forget_flags.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_hooks.h"
#include "orchestrate/policy/policy_metrics.h"
#include "orchestrate/policy/policy_problems.h"
#include "orchestrate/policy/policy_worker.h"
#include "orchestrate/policy/policy_runner.h"
#include "orchestrate/policy/policy_text.h"
#include "orchestrate/policy/runs_listing.h"
#include "orchestrate/schedule/time_text.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

// ---- policy check ----

json SourcesJson(const orc::Policy& p) {
  json out = json::array();
  for (const auto& s : p.sources) {
    json j = {{"name", s.name}, {"kind", std::string(orc::PolicySourceKindName(s.kind))}, {"location", RedactUri(s.location)}};
    if (s.kind == orc::PolicySourceKind::kImage) j["bitmap"] = s.bitmap.empty() ? json(nullptr) : json(s.bitmap);
    if (s.kind == orc::PolicySourceKind::kDomain) {
      j["tracker"] = s.tracker.empty() ? p.name : s.tracker;
      j["quiesce"] = s.quiesce;
    }
    // How its incrementals find changes (as given, or the default for its
    // kind); a domain's tracker decides: null.
    j["changed_by"] = s.changed_by.empty() ? json(nullptr) : json(s.changed_by);
    if (!s.disk_id.empty()) j["disk_id"] = s.disk_id;
    out.push_back(j);
  }
  return out;
}

std::string CompressionText(const orc::Policy& p) {
  return formats::CompressionSpec{p.compression, p.compression_level}.ToString();
}

json HookJson(const std::optional<orc::PolicyHook>& h) {
  if (!h) return nullptr;
  return {{"command", h->command}, {"timeout_seconds", h->timeout.count()}};
}

int RunCheck(const std::string& file, const std::string& from, Output& out) {
  orc::SysSeconds after = orc::NowSeconds();
  if (!from.empty()) {
    auto t = orc::ParseRfc3339(from);
    if (!t.ok()) return out.Usage("--from: " + t.error().message());
    after = *t;
  }
  auto policy = orc::LoadPolicy(Env::Default(), file);
  // A file that cannot be read ends the check; what is wrong in one that
  // was read is the problem list (ParsePolicy's errors are kInvalidArgument).
  if (!policy.ok() && policy.error().code() != ErrorCode::kInvalidArgument) return out.Fail(policy.error());
  if (!policy.ok()) {
    const auto problems = orc::PolicyProblems(file, policy.error().message());
    json list = json::array();
    for (const auto& p : problems) {
      list.push_back({{"line", p.line == 0 ? json(nullptr) : json(p.line)},
                      {"column", p.column == 0 ? json(nullptr) : json(p.column)},
                      {"message", p.message}});
    }
    out.Result({{"file", file}, {"valid", false}, {"problems", list}});
    // Compiler-style, one a line, on stderr in both modes (editors jump to them).
    std::cerr << orc::PolicyProblemsText(file, problems);
    // Then the run's error (stderr line and error event): the result above
    // lists the problems, the error ends the run (docs/json.md).
    return out.Fail(Error::InvalidArgument("the policy is invalid: " + std::to_string(problems.size()) +
                                           " problem" + (problems.size() == 1 ? "" : "s"))
                        .set_path(file));
  }
  const orc::Policy& p = *policy;
  // The file is valid; what a run would meet now is a warning each.
  const std::vector<std::string> warnings = orc::PolicyWarnings(Env::Default(), p);
  for (const auto& w : warnings) out.Warning(w, file);
  const auto next = orc::NextRunTimes(p, after, 5);
  json next_json = json::array();
  for (auto t : next) next_json.push_back(orc::FormatRfc3339(t));
  const std::string zone = p.schedule ? p.schedule->zone().name() : "";
  json targets = p.targets;
  json offsites = json::array();
  for (const auto& o : p.offsites) {
    offsites.push_back({{"target", o.target}, {"to", o.location}, {"retention_count", o.retention_count}});
  }
  out.Result({{"file", file},
              {"valid", true},
              {"problems", json::array()},
              {"warnings", warnings},
              {"policy", p.name},
              {"sources", SourcesJson(p)},
              {"targets", targets},
              {"offsites", offsites},
              {"reason", p.reason},
              {"schedule", p.schedule ? json(p.schedule->expression()) : json(nullptr)},
              {"time_zone", p.schedule ? json(zone.empty() ? "UTC" : zone) : json(nullptr)},
              {"next_runs", next_json},
              {"max_duration_without_backup_seconds", p.max_duration_without_backup.count()},
              {"retention_count", p.retention_count},
              {"free_space_multiple", p.free_space_multiple},
              {"max_run_time_seconds", p.max_run_time.count()},
              {"max_parallel", p.max_parallel},
              {"full_every", p.full_every},
              {"compression", CompressionText(p)},
              {"pre_hook", HookJson(p.pre_hook)},
              {"post_hook", HookJson(p.post_hook)}});
  out.text() << orc::PolicyCheckText(file, p, warnings.size(), next);
  return kExitOk;
}

// ---- run ----

struct RunArgs {
  std::string policy, catalog, metrics_textfile, memory = "256M", shard;
  uint32_t shard_count = 0;
  std::vector<std::string> sources;
  bool force = false, full = false, wait = false;
  int threads = 0;
};

// The node-exporter textfile: the policy's metrics now. Returns "" or why not.
std::string WriteTextfile(const orc::Policy& p, const std::string& catalog_path, const std::string& path,
                          const orc::ShardSpec& shard) {
  auto catalog = orc::PolicyCatalog::Open(Env::Default(), catalog_path);
  if (!catalog.ok()) return catalog.error().ToString();
  auto snap = orc::CollectPolicyMetrics(p, **catalog, Env::Default(), orc::NowSeconds(), shard);
  if (!snap.ok()) return snap.error().ToString();
  Status s = orc::WritePolicyMetricsTextfile(Env::Default(), path, {*snap});
  return s.ok() ? "" : s.error().ToString();
}

int RunRun(RunArgs& a, Output& out) {
  // The shard first: a worker with a bad index or a missing scheduler
  // variable stops before it reads anything (exit 64).
  auto shard = ResolveShard(a.shard, a.shard_count, ProcessEnv());
  if (!shard.ok()) return out.Usage(shard.error().message());
  auto policy = orc::LoadPolicy(Env::Default(), a.policy);
  if (!policy.ok()) return out.Fail(policy.error());
  const auto routing = InstallBucketRoutingFor(orc::PolicyLocations(*policy));
  if (std::string bad = orc::UnknownSourceMessage(*policy, a.sources); !bad.empty()) return out.Usage(bad);
  if (Status s = orc::CheckSourcesInShard(a.sources, *shard, a.policy); !s.ok()) return out.Usage(s.error().message());
  orc::RunOptions o;
  o.shard = *shard;
  // An explicit --catalog in a missing folder is an error, not a new
  // catalog (and a first backup of every source) somewhere else. A
  // folder is a records folder: one catalog file per policy and shard.
  auto catalog_path = orc::RecordsCatalogPath(Env::Default(), a.catalog, policy->name, *shard);
  if (!catalog_path.ok()) return out.Fail(catalog_path.error());
  o.catalog_path = *catalog_path;
  if (!a.metrics_textfile.empty()) a.metrics_textfile = orc::ShardTextfilePath(a.metrics_textfile, *shard);
  if (Status s = ApplyResourceFlags(a.memory, a.threads, o.copy); !s.ok()) return out.Usage(s.error().message());
  if (a.full && !a.force) return out.Usage("--full starts new chains now: give it with --force");
  o.manual = a.force;
  o.full = a.full;
  o.only_sources = a.sources;
  o.wait_for_lock = a.wait;
  o.stop = &CancelFlag();
  o.stop_reason = SignalStopReason;
  auto hooks = orc::NewPolicyHookRunner();
  o.hooks = hooks.get();

  auto report = orc::RunPolicyOnce(Env::Default(), *policy, o);
  // The textfile is written whatever happened: it shows the failures too.
  std::string textfile_error;
  if (!a.metrics_textfile.empty()) textfile_error = WriteTextfile(*policy, o.catalog_path, a.metrics_textfile, *shard);
  if (!textfile_error.empty()) out.Warning("metrics textfile not written: " + textfile_error, a.metrics_textfile);
  if (!report.ok()) return out.Fail(report.error());

  json j = RunReportJson(*policy, *report);
  j["metrics_textfile"] = a.metrics_textfile.empty() || !textfile_error.empty() ? json(nullptr)
                                                                                : json(a.metrics_textfile);
  out.Result(j);
  out.text() << orc::RunReportText(*policy, *report);
  // A run that did not fully succeed ends with its error after the result
  // (docs/json.md, "How a run ends"): stopped by a signal (130/143), a
  // source failed, or the textfile not written (1).
  if (report->stopped && InterruptSignal() != 0) return out.Fail(Error::Cancelled(report->stop_reason));
  if (report->failed > 0) {
    return out.Fail(Error::IoError(std::to_string(report->failed) + " of " + std::to_string(report->ran) +
                                   " source(s) failed" + (report->stopped ? " (" + report->stop_reason + ")" : ""))
                        .set_path(a.policy));
  }
  if (!textfile_error.empty()) {
    return out.Fail(Error::IoError("metrics textfile not written: " + textfile_error).set_path(a.metrics_textfile));
  }
  return kExitOk;
}

// ---- forget ----

struct ForgetArgs {
  std::string policy, chain_dir, catalog, within, memory = "256M";
  std::vector<std::string> sources;
  orc::ForgetPolicy keep;
  bool dry_run = false;
  int threads = 0;
};

// What one source's (or the chain folder's) forget did or would do: its
// JSON object (orc::ForgetSourceText is its text).
json ForgetReportJson(const orc::ForgetSourceReport& r) {
  std::map<std::string, orc::SysSeconds> when;
  for (const auto& p : r.points) when[p.key] = p.time;
  auto point = [&](const std::string& key) {
    size_t bar = key.rfind('|');
    auto it = when.find(key);
    return json{{"folder", key.substr(0, bar == std::string::npos ? 0 : bar)},
                {"id", bar == std::string::npos ? key : key.substr(bar + 1)},
                {"time", it == when.end() ? json(nullptr) : json(orc::FormatRfc3339(it->second))}};
  };
  json kept = json::array(), gone = json::array(), anyway = json::array(), actions = json::array();
  for (const auto& k : r.plan.keep) {
    json p = point(k);
    auto rules = r.why_kept.find(k);
    p["reasons"] = rules == r.why_kept.end() ? json::array() : json(rules->second);
    kept.push_back(p);
  }
  for (const auto& k : r.plan.forget) gone.push_back(point(k));
  for (const auto& [k, why] : r.plan.kept_anyway) {
    json p = point(k);
    p["why"] = why;
    anyway.push_back(p);
  }
  for (const auto& act : r.plan.actions) {
    actions.push_back({{"action", std::string(orc::RetentionActionKindName(act.kind))},
                       {"chain_dir", act.chain_dir},
                       {"ids", act.ids},
                       {"through", act.through.empty() ? json(nullptr) : json(act.through)}});
  }
  return {{"source", r.source}, {"kept", kept}, {"forgotten", gone}, {"kept_anyway", anyway},
          {"actions", actions}, {"error", r.error}};
}

int RunForget(ForgetArgs& a, Output& out) {
  auto keep = orc::CheckForgetFlags(a.policy, a.chain_dir, !a.sources.empty(), a.within, a.keep);
  if (!keep.ok()) return out.Usage(keep.error().message());
  a.keep = *keep;
  std::optional<orc::Policy> policy;
  if (!a.policy.empty()) {
    auto loaded = orc::LoadPolicy(Env::Default(), a.policy);
    if (!loaded.ok()) return out.Fail(loaded.error());
    if (std::string bad = orc::UnknownSourceMessage(*loaded, a.sources); !bad.empty()) return out.Usage(bad);
    policy = std::move(*loaded);
  }
  // A policy's bucket targets reach their BucketEnv (the routing lives to
  // the end of the command).
  std::unique_ptr<ScopedDefaultEnv> routing;
  if (policy) {
    routing = InstallBucketRoutingFor(orc::PolicyLocations(*policy));
  }
  orc::ForgetOptions o;
  if (policy || !a.catalog.empty()) {
    auto catalog_path = orc::CatalogPathFromFlag(Env::Default(), a.catalog);
    if (!catalog_path.ok()) return out.Fail(catalog_path.error());
    o.catalog_path = *catalog_path;
  } else {
    o.catalog_path = orc::ResolveCatalogPath("");  // used only when it exists
  }
  o.only_sources = a.sources;
  o.dry_run = a.dry_run;
  if (Status s = ApplyResourceFlags(a.memory, a.threads, o.copy); !s.ok()) return out.Usage(s.error().message());

  std::vector<orc::ForgetSourceReport> reports;
  if (policy) {
    auto r = orc::ForgetPoints(Env::Default(), *policy, a.keep, o);
    if (!r.ok()) return out.Fail(r.error());
    reports = std::move(*r);
  } else {
    auto r = orc::ForgetChainFolder(Env::Default(), a.chain_dir, a.keep, o);
    if (!r.ok()) return out.Fail(r.error());
    reports.push_back(std::move(*r));
  }

  json sources = json::array();
  size_t forgotten = 0, failed = 0;
  for (const auto& r : reports) {
    sources.push_back(ForgetReportJson(r));
    out.text() << orc::ForgetSourceText(r, a.dry_run);
    forgotten += r.plan.forget.size();
    failed += r.error.empty() ? 0 : 1;
  }
  json result = {{"dry_run", a.dry_run},
                 {"keep", {{"last", a.keep.keep_last}, {"hourly", a.keep.keep_hourly}, {"daily", a.keep.keep_daily},
                           {"weekly", a.keep.keep_weekly}, {"monthly", a.keep.keep_monthly},
                           {"yearly", a.keep.keep_yearly}, {"within_seconds", a.keep.keep_within.count()}}},
                 {"forgotten", forgotten},
                 {"failed", failed},
                 {"sources", sources}};
  if (policy) result["policy"] = policy->name;
  else result["chain_dir"] = a.chain_dir;
  out.Result(result);
  if (a.dry_run) out.text() << "dry run: nothing was changed\n";
  if (failed > 0) {
    return out.Fail(Error::IoError(std::to_string(failed) + " source(s) could not be forgotten as planned")
                        .set_path(policy ? a.policy : a.chain_dir));
  }
  return kExitOk;
}

// ---- runs list ----

json RecordJson(const orc::RunRecord& r, const std::string& catalog) {
  json points = json::array();
  for (size_t i = 0; i < r.points.size(); ++i) {
    points.push_back({{"chain_dir", r.points[i].chain_dir}, {"id", r.points[i].id}, {"state", orc::PartState(r, i)}});
  }
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return {{"id", r.id}, {"run_id", r.run_id}, {"policy", r.policy}, {"source", r.source},
          {"source_kind", r.source_kind}, {"trigger", r.trigger}, {"trigger_detail", r.trigger_detail},
          {"reason", r.reason}, {"host", r.host}, {"shard", ShardJson(r.shard)}, {"catalog", catalog},
          {"target", or_null(r.target)}, {"type", or_null(r.type)},
          {"type_reason", r.type_reason}, {"started_at", r.started_at}, {"finished_at", or_null(r.finished_at)},
          {"duration_seconds", r.duration_seconds}, {"bytes_read", r.bytes_read},
          {"bytes_written", r.bytes_written}, {"result", r.result}, {"error", r.error},
          {"barge_version", r.barge_version}, {"points", points}, {"point_state", or_null(r.point_state)}};
}

struct RunsArgs {
  std::string policy, source, shard;
  std::vector<std::string> catalogs;
  size_t limit = 0;
};

int RunRunsList(RunsArgs& a, Output& out) {
  std::optional<orc::ShardSpec> shard;
  if (!a.shard.empty()) {
    auto s = orc::ParseShard(a.shard);
    if (!s.ok()) return out.Usage("--shard: " + s.error().message());
    shard = *s;
  }
  auto named = orc::PolicyNameFromFlag(Env::Default(), a.policy);
  if (!named.ok()) return out.Fail(named.error());
  const std::string& name = *named;
  auto files = orc::ListedCatalogs(Env::Default(), a.catalogs);
  if (!files.ok()) return out.Fail(files.error());
  auto listed = orc::ListRunsOf(Env::Default(), *files, {name, a.source, a.limit}, shard,
                                [&out](const std::string& what, const std::string& file) { out.Warning(what, file); });
  if (!listed.ok()) return out.Fail(listed.error());
  const auto& runs = *listed;
  json list = json::array();
  for (const auto& [r, file] : runs) list.push_back(RecordJson(r, file));
  out.Result({{"runs", list}, {"catalogs", *files}});
  out.text() << orc::RunsListText(runs, name, files->size() > 1);
  return kExitOk;
}

// ---- policy shards ----

// Which shard of `count` backs up each source of the policy.
int RunShards(const std::string& file, uint32_t count, Output& out) {
  if (count == 0 || count > orc::kMaxShards) {
    return out.Usage("--shards: the shard count must be 1.." + std::to_string(orc::kMaxShards));
  }
  auto policy = orc::LoadPolicy(Env::Default(), file);
  if (!policy.ok()) return out.Fail(policy.error());
  const orc::PolicyShards assigned = orc::ShardPolicySources(*policy, count);
  json shards = json::array(), sources = json::array();
  for (uint32_t i = 0; i < count; ++i) shards.push_back({{"index", i}, {"sources", assigned.per[i]}});
  for (const auto& [name, i] : assigned.sources) sources.push_back({{"name", name}, {"shard", i}});
  out.text() << orc::ShardsText(*policy, assigned);
  out.Result({{"file", file}, {"policy", policy->name}, {"count", count}, {"shards", shards}, {"sources", sources}});
  return kExitOk;
}

}  // namespace

void RegisterPolicyCommands(CLI::App& app, int& exit_code) {
  {
    auto* group = AddGroup(app, "policy", "Backup policy files");
    auto a = std::make_shared<std::pair<std::string, std::string>>();
    auto* cmd = AddCommand(*group, "check", "Validate a policy file (FILE:LINE:COLUMN errors) and show its next runs",
                           exit_code, [a](Output& out) { return RunCheck(a->first, a->second, out); });
    cmd->add_option("file", a->first, "Policy file (YAML)")->required();
    cmd->add_option("--from", a->second, "Next runs after this time (RFC 3339; default now)");
    auto b = std::make_shared<std::pair<std::string, uint32_t>>("", 0);
    auto* shards = AddCommand(*group, "shards", "Show which shard of N backs up each source (barge run --shard I/N)",
                              exit_code, [b](Output& out) { return RunShards(b->first, b->second, out); });
    shards->add_option("file", b->first, "Policy file (YAML)")->required();
    shards->add_option("--shards", b->second, "N, the number of shards")->required();
  }
  {
    auto a = std::make_shared<RunArgs>();
    auto* cmd = AddCommand(app, "run", "Run a policy once: what is due now (for cron and systemd timers)", exit_code,
                           [a](Output& out) { return RunRun(*a, out); });
    AddAllowOtherOwnerFlag(cmd);
    cmd->add_option("--policy", a->policy, "Policy file (YAML)")->required();
    cmd->add_option("--source", a->sources, "Only this source (repeatable)");
    cmd->add_option("--shard", a->shard,
                    "I/N: only the sources of shard I (0-based) of N, by rendezvous hashing of their names; auto: "
                    "I and N from a Kubernetes Indexed Job ($JOB_COMPLETION_INDEX) or a Slurm array "
                    "($SLURM_ARRAY_TASK_ID/_MIN/_COUNT)");
    cmd->add_option("--shard-count", a->shard_count,
                    "With --shard auto: N (Kubernetes exports none; else $BARGE_SHARD_COUNT)");
    cmd->add_flag("--force", a->force, "Back up every (selected) source now, due or not (trigger manual)");
    cmd->add_flag("--full", a->full,
                  "With --force: full backups (new chains), e.g. after a bitmap was removed and added again");
    cmd->add_flag("--wait", a->wait, "Wait for a run of the same policy to end instead of failing (exit 4)");
    cmd->add_option("--metrics-textfile", a->metrics_textfile,
                    "Write the policy's metrics there afterwards, atomically (node-exporter textfile collector)");
    cmd->add_option("--catalog", a->catalog,
                    "Catalog database (run records); a folder: one file per policy and shard in it "
                    "(<policy>.shard-I.db)");
    cmd->add_option("--threads", a->threads, "Worker threads per backup (0 = all cores)")->capture_default_str();
    cmd->add_option("--memory", a->memory, "Data in flight per backup")->capture_default_str();
  }
  {
    auto a = std::make_shared<ForgetArgs>();
    auto* cmd = AddCommand(app, "forget",
                           "Remove old points restic-style, of a chain folder or a policy's sources; every kept "
                           "point stays restorable",
                           exit_code, [a](Output& out) { return RunForget(*a, out); });
    AddAllowOtherOwnerFlag(cmd);
    cmd->add_option("chain", a->chain_dir, "The disk's chain folder (TARGET/<name>/); or --policy");
    cmd->add_option("--policy", a->policy, "Policy file (YAML): each of its sources' points");
    cmd->add_option("--keep-last", a->keep.keep_last, "Keep the N newest points");
    cmd->add_option("--keep-hourly", a->keep.keep_hourly,
                    "Keep the newest point of each of the N newest hours (UTC) that have points");
    cmd->add_option("--keep-daily", a->keep.keep_daily, "... of each of the N newest days (UTC)");
    cmd->add_option("--keep-weekly", a->keep.keep_weekly, "... of each of the N newest ISO weeks");
    cmd->add_option("--keep-monthly", a->keep.keep_monthly, "... of each of the N newest months");
    cmd->add_option("--keep-yearly", a->keep.keep_yearly, "... of each of the N newest years");
    cmd->add_option("--keep-within", a->within,
                    "Keep every point within DURATION (e.g. 2d12h) of the newest point");
    cmd->add_flag("--dry-run", a->dry_run, "Show what would go; change nothing");
    cmd->add_option("--source", a->sources, "With --policy: only this source (repeatable)");
    cmd->add_option("--catalog", a->catalog, "Catalog database (run records are marked)");
    cmd->add_option("--threads", a->threads, "Worker threads of merges (0 = all cores)")->capture_default_str();
    cmd->add_option("--memory", a->memory, "Data in flight of merges")->capture_default_str();
    AddBucketFlags(cmd);
  }
  {
    auto* group = AddGroup(app, "runs", "Policy run records");
    auto a = std::make_shared<RunsArgs>();
    auto* cmd = AddCommand(*group, "list", "Policy runs, newest first", exit_code,
                           [a](Output& out) { return RunRunsList(*a, out); });
    cmd->add_option("--policy", a->policy, "Only this policy (a name or a policy file)");
    cmd->add_option("--source", a->source, "Only this source");
    cmd->add_option("--shard", a->shard, "Only the records of shard I/N of sharded runs");
    cmd->add_option("--limit", a->limit, "At most N records (0 = all)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--catalog", a->catalogs,
                    "Catalog database, or a records folder (every *.db in it); repeatable: one table of all");
  }
}

}  // namespace barge::cli
