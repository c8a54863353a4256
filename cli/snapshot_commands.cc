// barge snapshot create|list|rename|delete|rollback|apply|metrics: internal
// snapshots of a qcow2 disk, named as an image file or as a libvirt
// domain's disk (orchestrate/snapshot/snapshot.h). Behaviour in docs/snapshots.md,
// results in docs/json.md.
#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "blockio/env.h"
#include "cli/common.h"
#include "cli/connect_flag.h"
#include "cli/hook_flags.h"
#include "formats/json_fields.h"
#include "formats/qcow2_snapshot.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/snapshot/snapshot.h"
#include "orchestrate/snapshot/snapshot_apply.h"
#include "orchestrate/snapshot/snapshot_text.h"

namespace barge::cli {
namespace {

using nlohmann::json;
namespace orc = barge::orchestrate;

// IMAGE and the words after it, or --domain D --disk vda and the same words
// without IMAGE. CLI11 fills positionals in order, so with a domain the
// words land one slot early and are shifted back here.
struct TargetArgs {
  std::string slots[3];  // slot 0 is IMAGE
  std::string domain, disk, connect;
  std::vector<std::string> names;  // what each slot means, for messages ("NAME")

  // Adds the positionals (`names`, "IMAGE" first) and --domain/--disk.
  void AddTo(CLI::App* cmd, std::vector<std::string> slot_names, const std::vector<std::string>& help) {
    names = std::move(slot_names);
    for (size_t i = 0; i < names.size(); ++i) {
      std::string name = names[i];
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      cmd->add_option(name, slots[i], help[i]);
    }
    cmd->add_option("--domain", domain, "A libvirt domain (instead of IMAGE; needs --disk)");
    cmd->add_option("--disk", disk, "The domain's disk target (vda)");
    AddConnectOption(cmd, connect);
  }

  // The target, and in `words` the values of the slots after IMAGE
  // (orc::ResolveSnapshotTarget); a usage message as kInvalidArgument.
  Result<orc::SnapshotTarget> Resolve(std::vector<std::string>& words) const {
    return orc::ResolveSnapshotTarget({{slots, slots + 3}, names, domain, disk, connect}, words);
  }

  // The disk in messages: the image path, or "domain D disk vda".
  std::string Describe(const orc::SnapshotTarget& t) const {
    return t.image.empty() ? "domain " + t.domain + " disk " + t.disk : t.image;
  }
};

// A usage error, pointing at the command's help as the parser's do.
int BadUsage(const Error& error, Output& out) {
  return out.Usage(error.message() + " (see: barge " + out.command() + " --help)");
}

// Why `name` cannot name a snapshot ("" if it can): the qcow2 format's rule
// (at most 255 bytes, no NUL), and UTF-8 (list --json and metrics labels
// must carry it). A usage error for create and rename alike.
std::string SnapshotNameProblem(const std::string& name) {
  auto valid = formats::qcow2::ValidateSnapshotName(name);
  if (!valid.ok()) return valid.error().message();
  return formats::IsUtf8(name) ? "" : "the snapshot name is not valid UTF-8";
}

std::string TimeText(uint32_t sec, uint32_t nsec) {
  return formats::FormatRfc3339({static_cast<int64_t>(sec), static_cast<int32_t>(nsec)});
}

json UnixTimeJson(int64_t seconds) {
  return seconds == 0 ? json(nullptr) : json(formats::FormatRfc3339({seconds, 0}));
}

json SnapshotJson(const formats::SnapshotInfo& s) {
  return {{"id", s.id},
          {"name", s.name},
          {"vol_size", s.virtual_size},
          {"vm_state_size", s.vm_state_size},
          {"creation_time", TimeText(s.date_sec, s.date_nsec)},
          {"vm_clock_seconds", static_cast<double>(s.vm_clock_nsec) / 1e9}};
}

void AddUsage(json& j, const formats::SnapshotUsage& u) {
  j["vol_size"] = u.vol_size;
  j["referenced"] = u.referenced;
  j["logical_referenced"] = u.logical_referenced;
  j["used"] = u.used;
  j["written"] = u.written;
  j["compress_ratio"] = u.compress_ratio;
}

std::string Describe(const formats::SnapshotInfo& s) { return "'" + s.name + "' (id " + s.id + ")"; }

void ReportWarnings(const std::vector<std::string>& warnings, const std::string& image, Output& out) {
  for (const auto& w : warnings) out.Warning(w, image);
}

// Common to the commands that change one snapshot.
json OpJson(const orc::SnapshotOpResult& r) {
  return {{"image", r.image}, {"mode", r.mode}, {"snapshot", SnapshotJson(r.snapshot)}};
}

int RunCreate(Env& env, const TargetArgs& t, const std::string& name, const std::string& uuid, bool quiesce,
              const HookFlags& hooks, const std::string& catalog, Output& out) {
  std::vector<std::string> words;
  auto target = t.Resolve(words);
  if (!target.ok()) return BadUsage(target.error(), out);
  if (name.empty()) return BadUsage(Error::InvalidArgument("--name must not be empty"), out);
  auto spec = hooks.ToSpec();
  if (!spec.ok()) return BadUsage(spec.error(), out);
  orc::SnapshotCreateRequest req;
  req.target = *target;
  // With --uuid the qcow2 snapshot is named by the uuid and NAME is its
  // display name (as `snapshot apply` keeps them), recorded in the catalog.
  req.name = uuid.empty() ? name : uuid;
  req.consistency.quiesce = quiesce;
  req.consistency.hooks = *spec;
  auto r = orc::CreateDiskSnapshot(env, req);
  if (!r.ok()) return out.Fail(r.error());
  ReportWarnings(r->warnings, r->image, out);
  if (!uuid.empty()) {
    Status st = orc::RecordCreatedSnapshot(env, *target, catalog, r->snapshot, uuid, name);
    if (!st.ok()) return out.Fail(st.error());
  }
  json j = OpJson(*r);
  if (!uuid.empty()) {
    j["uuid"] = uuid;
    j["display_name"] = name;
  }
  j["hooks"] = HookRunsJson(r->hooks);
  out.Result(j);
  out.text() << "created snapshot " << Describe(r->snapshot) << " of " << r->image << " (" << r->mode << ")";
  if (!uuid.empty()) out.text() << ", display name '" << name << "'";
  out.text() << "\n" << HookRunsText(r->hooks);
  return kExitOk;
}

// A disk's snapshots with their stored states (list and metrics).
struct Listed {
  orc::SnapshotListing listing;
  std::map<std::string, orc::StoredSnapshot> states;
};

// Resolves the target, lists its snapshots (warnings reported) and loads
// their states; on failure reports it and sets `exit_code`.
std::optional<Listed> ListWithStates(Env& env, const TargetArgs& t, const std::string& catalog, Output& out,
                                     int& exit_code) {
  std::vector<std::string> words;
  auto target = t.Resolve(words);
  if (!target.ok()) {
    exit_code = BadUsage(target.error(), out);
    return std::nullopt;
  }
  auto listing = orc::ListDiskSnapshots(env, *target);
  if (!listing.ok()) {
    exit_code = out.Fail(listing.error());
    return std::nullopt;
  }
  ReportWarnings(listing->warnings, listing->image, out);
  auto states = orc::SnapshotStatesByUuid(env, *target, catalog);
  if (!states.ok()) {
    exit_code = out.Fail(states.error());
    return std::nullopt;
  }
  return Listed{std::move(listing).value(), std::move(states).value()};
}

int RunList(Env& env, const TargetArgs& t, const std::string& catalog, Output& out) {
  int exit_code = kExitOk;
  std::optional<Listed> listed = ListWithStates(env, t, catalog, out, exit_code);
  if (!listed) return exit_code;
  const orc::SnapshotListing* listing = &listed->listing;
  const auto* states = &listed->states;
  json arr = json::array();
  for (const auto& e : listing->snapshots) {
    json j = SnapshotJson(e.info);
    if (auto it = states->find(e.info.name); it != states->end()) {
      j["uuid"] = it->second.uuid;
      j["display_name"] = it->second.display_name;
      if (!it->second.message.empty()) j["state_message"] = it->second.message;
    }
    j["state"] = orc::ListedStateName(*states, e.info.name);
    if (e.has_usage) AddUsage(j, e.usage);
    arr.push_back(j);
  }
  out.text() << orc::SnapshotListText(*listing, *states);
  json result = {{"image", listing->image}, {"mode", listing->mode}, {"cluster_size", listing->cluster_size},
                 {"snapshots", arr}};
  if (listing->has_usage) {
    json active;
    AddUsage(active, listing->active);
    result["active"] = active;
  }
  out.Result(result);
  return kExitOk;
}

int RunRename(Env& env, const TargetArgs& t, Output& out) {
  std::vector<std::string> words;
  auto target = t.Resolve(words);
  if (!target.ok()) return BadUsage(target.error(), out);
  if (std::string problem = SnapshotNameProblem(words[1]); !problem.empty()) {
    return BadUsage(Error::InvalidArgument("NEW_NAME: " + problem), out);
  }
  auto r = orc::RenameDiskSnapshot(env, *target, words[0], words[1]);
  if (!r.ok()) return out.Fail(r.error());
  ReportWarnings(r->warnings, r->image, out);
  json j = OpJson(*r);
  j["old_name"] = words[0];
  out.Result(j);
  out.text() << "renamed snapshot '" << words[0] << "' of " << r->image << " to " << Describe(r->snapshot) << "\n";
  return kExitOk;
}

int RunDelete(Env& env, const TargetArgs& t, Output& out) {
  std::vector<std::string> words;
  auto target = t.Resolve(words);
  if (!target.ok()) return BadUsage(target.error(), out);
  auto r = orc::DeleteDiskSnapshot(env, *target, words[0]);
  if (!r.ok()) return out.Fail(r.error());
  ReportWarnings(r->warnings, r->image, out);
  out.Result(OpJson(*r));
  out.text() << "deleted snapshot " << Describe(r->snapshot) << " of " << r->image << " (" << r->mode << ")\n";
  return kExitOk;
}

int RunRollback(Env& env, const TargetArgs& t, bool discard_newer, Output& out) {
  std::vector<std::string> words;
  auto target = t.Resolve(words);
  if (!target.ok()) return BadUsage(target.error(), out);
  auto r = orc::RollbackDiskSnapshot(env, *target, words[0], discard_newer);
  if (!r.ok()) return out.Fail(r.error());
  ReportWarnings(r->warnings, r->image, out);
  json j = OpJson(*r);
  json gone = json::array();
  for (const auto& s : r->discarded) gone.push_back(SnapshotJson(s));
  j["implicitly_deleted"] = gone;
  out.Result(j);
  out.text() << "rolled " << r->image << " back to snapshot " << Describe(r->snapshot) << "\n";
  for (const auto& s : r->discarded) out.text() << "  implicitly deleted: " << Describe(s) << "\n";
  return kExitOk;
}

json StoredJson(const orc::ApplySnapshotStatus& s) {
  const orc::StoredSnapshot& st = s.stored;
  json j = {{"uuid", st.uuid},
            {"display_name", st.display_name},
            {"state", std::string(orc::SnapshotStateName(st.state))},
            {"message", st.message},
            {"id", st.snapshot_id},
            {"rollback_counter", st.rollback_counter},
            {"last_rollback_at", UnixTimeJson(st.last_rollback_at)},
            {"created_at", UnixTimeJson(st.created_at)},
            {"updated_at", UnixTimeJson(st.updated_at)}};
  if (s.has_usage) AddUsage(j, s.usage);
  return j;
}

int RunApply(Env& env, const TargetArgs& t, const std::string& config_path, const std::string& catalog, bool quiesce,
             const HookFlags& hooks, Output& out) {
  std::vector<std::string> words;
  auto target = t.Resolve(words);
  if (!target.ok()) return BadUsage(target.error(), out);
  auto spec = hooks.ToSpec();
  if (!spec.ok()) return BadUsage(spec.error(), out);
  auto text = env.ReadFile(config_path);
  if (!text.ok()) return out.Fail(text.error());
  auto config = orc::ParseApplyConfig(*text);
  if (!config.ok()) return out.Fail(Error(config.error()).set_path(config_path));
  auto catalog_path = orc::CatalogPathFromFlag(env, catalog);
  if (!catalog_path.ok()) return out.Fail(catalog_path.error());
  orc::ApplyRequest req;
  req.target = *target;
  req.config = std::move(config).value();
  req.catalog_path = *catalog_path;
  req.consistency.quiesce = quiesce;
  req.consistency.hooks = *spec;
  auto r = orc::ApplySnapshotConfig(env, req);
  if (!r.ok()) return out.Fail(r.error());
  json actions = json::array();
  for (const auto& a : r->actions) {
    json j = {{"action", std::string(orc::ActionKindName(a.action.kind))},
              {"uuid", a.action.uuid},
              {"reason", a.action.reason},
              {"ok", a.ok}};
    if (!a.action.display_name.empty()) j["display_name"] = a.action.display_name;
    if (!a.ok) j["error"] = a.error;
    actions.push_back(j);
  }
  json snapshots = json::array();
  for (const auto& s : r->snapshots) snapshots.push_back(StoredJson(s));
  out.text() << orc::ApplyText(*r);
  out.Result({{"image", r->image}, {"mode", r->mode}, {"ok", r->ok()}, {"actions", actions},
              {"snapshots", snapshots}});
  if (auto failure = orc::ApplyFailure(*r)) return out.Fail(*failure);
  return kExitOk;
}

int RunMetrics(Env& env, const TargetArgs& t, const std::string& textfile, const std::string& catalog, Output& out) {
  int exit_code = kExitOk;
  std::optional<Listed> listed = ListWithStates(env, t, catalog, out, exit_code);
  if (!listed) return exit_code;
  // One disk is one series however its path was typed (relative, through
  // a symbolic link): the `image` label is the canonical path.
  listed->listing.image = CanonicalPath(env, listed->listing.image);
  const orc::SnapshotListing* listing = &listed->listing;
  const auto* states = &listed->states;
  std::string text = orc::SnapshotMetricsText(*listing, [&](const orc::SnapshotListEntry& e) {
    orc::Labels labels;
    if (auto it = states->find(e.info.name); it != states->end()) {
      labels.push_back({"display_name", it->second.display_name});
    }
    labels.push_back({"state", orc::ListedStateName(*states, e.info.name)});
    return labels;
  });
  json j = {{"image", listing->image}, {"snapshots", listing->snapshots.size()}};
  if (!textfile.empty()) {
    // node-exporter's textfile collector reads *.prom files whenever it is
    // scraped: replace the file atomically so it never sees half of one.
    if (Status s = env.WriteFileAtomic(textfile, text); !s.ok()) return out.Fail(s.error());
    j["textfile"] = textfile;
    out.text() << "wrote the metrics of " << listing->snapshots.size() << " snapshots of " << listing->image
               << " to " << textfile << "\n";
  } else {
    j["text"] = text;
    out.text() << text;
  }
  out.Result(j);
  return kExitOk;
}

const std::vector<std::string> kImageHelp = {"qcow2 image (or --domain/--disk)"};

}  // namespace

void RegisterSnapshotCommands(CLI::App& app, int& exit_code) {
  auto* group = AddGroup(app, "snapshot",
                         "Internal snapshots of a qcow2 disk: an image file, or --domain D --disk vda");
  {
    struct Args {
      TargetArgs target;
      std::string name, uuid, catalog;
      bool quiesce = false;
      HookFlags hooks;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = AddCommand(
        *group, "create", "Take a snapshot (QEMU does it while the domain runs)", exit_code, [a](Output& out) {
          return RunCreate(Env::Default(), a->target, a->name, a->uuid, a->quiesce, a->hooks, a->catalog, out);
        });
    a->target.AddTo(cmd, {"IMAGE"}, kImageHelp);
    cmd->add_option("--name", a->name, "Snapshot name (with --uuid: its display name)")
        ->required()
        ->check(CLI::Validator(
            [](std::string& v) -> std::string { return SnapshotNameProblem(v); },
            "NAME"));
    cmd->add_option("--uuid", a->uuid,
                    "Name the qcow2 snapshot by this uuid and record NAME as its display name (as apply does)");
    cmd->add_flag("--quiesce", a->quiesce, "Freeze the guest's file systems around it (running domain, guest agent)");
    a->hooks.AddTo(cmd);
    cmd->add_option("--catalog", a->catalog, "Catalog database (display names and states)");
  }
  {
    struct Args {
      TargetArgs target;
      std::string catalog;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = AddCommand(*group, "list", "List snapshots with their space metrics (used, referenced, written...)",
                           exit_code, [a](Output& out) { return RunList(Env::Default(), a->target, a->catalog, out); });
    a->target.AddTo(cmd, {"IMAGE"}, kImageHelp);
    cmd->add_option("--catalog", a->catalog, "Catalog database (display names and states)");
  }
  {
    auto a = std::make_shared<TargetArgs>();
    auto* cmd = AddCommand(*group, "rename", "Rename a snapshot (offline only: QEMU cannot)", exit_code,
                           [a](Output& out) { return RunRename(Env::Default(), *a, out); });
    a->AddTo(cmd, {"IMAGE", "NAME", "NEW_NAME"}, {kImageHelp[0], "Snapshot id or name", "Its new name"});
  }
  {
    auto a = std::make_shared<TargetArgs>();
    auto* cmd = AddCommand(*group, "delete", "Delete a snapshot, freeing its used bytes", exit_code,
                           [a](Output& out) { return RunDelete(Env::Default(), *a, out); });
    a->AddTo(cmd, {"IMAGE", "NAME"}, {kImageHelp[0], "Snapshot id or name"});
  }
  {
    struct Args {
      TargetArgs target;
      bool discard_newer = false;
    };
    auto a = std::make_shared<Args>();
    auto* cmd = AddCommand(*group, "rollback", "Roll the disk back to a snapshot (domain shut off)", exit_code,
                           [a](Output& out) { return RunRollback(Env::Default(), a->target, a->discard_newer, out); });
    a->target.AddTo(cmd, {"IMAGE", "NAME"}, {kImageHelp[0], "Snapshot id or name"});
    cmd->add_flag("--discard-newer", a->discard_newer,
                  "Also delete the snapshots taken after it (reported as implicitly deleted)");
  }
  {
    struct Args {
      TargetArgs target;
      std::string config, catalog;
      bool quiesce = false;
      HookFlags hooks;
    };
    auto a = std::make_shared<Args>();
    auto* cmd =
        AddCommand(*group, "apply", "Reconcile the disk's snapshots with a desired set (controller interface)",
                   exit_code, [a](Output& out) {
                     return RunApply(Env::Default(), a->target, a->config, a->catalog, a->quiesce, a->hooks, out);
                   });
    a->target.AddTo(cmd, {"IMAGE"}, kImageHelp);
    cmd->add_option("--config", a->config, "JSON file listing every snapshot that must exist (docs/snapshots.md)")
        ->required();
    cmd->add_option("--catalog", a->catalog, "Catalog database (snapshot states)");
    cmd->add_flag("--quiesce", a->quiesce, "Freeze the guest's file systems around each create");
    a->hooks.AddTo(cmd);
  }
  {
    struct Args {
      TargetArgs target;
      std::string textfile, catalog;
    };
    auto a = std::make_shared<Args>();
    auto* cmd =
        AddCommand(*group, "metrics", "The snapshots' space metrics in Prometheus text format", exit_code,
                   [a](Output& out) { return RunMetrics(Env::Default(), a->target, a->textfile, a->catalog, out); });
    a->target.AddTo(cmd, {"IMAGE"}, kImageHelp);
    cmd->add_option("--textfile", a->textfile,
                    "Write them to this file, replaced atomically (node-exporter's textfile collector: *.prom)");
    cmd->add_option("--catalog", a->catalog, "Catalog database (display names and states as labels)");
  }
}

}  // namespace barge::cli
