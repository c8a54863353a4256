// Apply config parsing and the reconcile decision.
#include "orchestrate/snapshot/snapshot_reconcile.h"

#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "formats/qcow2_snapshot.h"

namespace barge::orchestrate {

std::string_view SnapshotStateName(SnapshotState state) {
  switch (state) {
    case SnapshotState::kCreating: return "creating";
    case SnapshotState::kCreated: return "created";
    case SnapshotState::kDeleting: return "deleting";
    case SnapshotState::kImplicitlyDeleted: return "implicitly_deleted";
    case SnapshotState::kError: return "error";
  }
  return "unknown";
}

Result<SnapshotState> ParseSnapshotState(std::string_view name) {
  for (SnapshotState s : {SnapshotState::kCreating, SnapshotState::kCreated, SnapshotState::kDeleting,
                          SnapshotState::kImplicitlyDeleted, SnapshotState::kError}) {
    if (SnapshotStateName(s) == name) return s;
  }
  return Error::Corruption("unknown snapshot state '" + std::string(name) + "'");
}

std::string_view ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForget: return "forget";
    case ActionKind::kMarkImplicitlyDeleted: return "mark_implicitly_deleted";
    case ActionKind::kDelete: return "delete";
    case ActionKind::kAdopt: return "adopt";
    case ActionKind::kRename: return "rename";
    case ActionKind::kRollback: return "rollback";
    case ActionKind::kCreate: return "create";
  }
  return "unknown";
}

Result<ApplyConfig> ParseApplyConfig(std::string_view text) {
  using nlohmann::json;
  json j = json::parse(text, nullptr, false);
  auto bad = [](const std::string& what) { return Error::InvalidArgument("snapshot apply config: " + what); };
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object() || !j.contains("snapshots") || !j["snapshots"].is_array()) {
    return bad("expected an object with a \"snapshots\" list");
  }
  ApplyConfig config;
  std::set<std::string> seen;
  size_t index = 0;
  for (const json& e : j["snapshots"]) {
    const std::string at = "snapshots[" + std::to_string(index++) + "]";
    if (!e.is_object()) return bad(at + " is not an object");
    if (!e.contains("uuid") || !e["uuid"].is_string() || e["uuid"].get<std::string>().empty()) {
      return bad(at + " needs a non-empty \"uuid\" string");
    }
    DesiredSnapshot d;
    d.uuid = e["uuid"].get<std::string>();
    Status name_ok = formats::qcow2::ValidateSnapshotName(d.uuid);
    if (!name_ok.ok()) return bad(at + ": uuid: " + name_ok.error().message());
    if (!seen.insert(d.uuid).second) return bad(at + ": uuid '" + d.uuid + "' is listed twice");
    d.display_name = d.uuid;
    if (e.contains("display_name")) {
      if (!e["display_name"].is_string()) return bad(at + ": \"display_name\" must be a string");
      d.display_name = e["display_name"].get<std::string>();
    }
    if (e.contains("rollback") && !e["rollback"].is_null()) {
      const json& r = e["rollback"];
      if (!r.is_object() || !r.contains("counter") || !r["counter"].is_number_unsigned()) {
        return bad(at + ": \"rollback\" needs a non-negative integer \"counter\"");
      }
      DesiredRollback rb;
      rb.counter = r["counter"].get<uint64_t>();
      if (r.contains("discard_newer")) {
        if (!r["discard_newer"].is_boolean()) return bad(at + ": \"discard_newer\" must be true or false");
        rb.discard_newer = r["discard_newer"].get<bool>();
      }
      d.rollback = rb;
    }
    config.snapshots.push_back(std::move(d));
  }
  return config;
}

std::vector<SnapshotAction> ReconcileSnapshots(const ApplyConfig& desired, const std::vector<StoredSnapshot>& stored,
                                               const std::vector<formats::SnapshotInfo>& image) {
  std::map<std::string, const StoredSnapshot*> by_uuid;
  for (const StoredSnapshot& s : stored) by_uuid[s.uuid] = &s;
  std::set<std::string> in_image;
  for (const formats::SnapshotInfo& s : image) in_image.insert(s.name);
  std::set<std::string> listed;
  for (const DesiredSnapshot& d : desired.snapshots) listed.insert(d.uuid);

  std::vector<SnapshotAction> forget, vanished, deletes, adopts, renames, rollbacks, creates;
  for (const StoredSnapshot& s : stored) {
    if (listed.count(s.uuid)) continue;
    SnapshotAction a;
    a.uuid = s.uuid;
    if (in_image.count(s.uuid) && s.state != SnapshotState::kImplicitlyDeleted) {
      a.kind = ActionKind::kDelete;
      a.reason = "no longer listed";
      deletes.push_back(a);
    } else {
      a.kind = ActionKind::kForget;
      a.reason = s.state == SnapshotState::kImplicitlyDeleted ? "implicitly deleted and no longer listed"
                                                               : "no longer listed and not in the image";
      forget.push_back(a);
    }
  }
  for (const DesiredSnapshot& d : desired.snapshots) {
    auto it = by_uuid.find(d.uuid);
    const StoredSnapshot* s = it == by_uuid.end() ? nullptr : it->second;
    const uint64_t wanted_counter = d.rollback ? d.rollback->counter : 0;
    const bool exists = in_image.count(d.uuid) > 0;
    if (s && s->state == SnapshotState::kImplicitlyDeleted) continue;
    SnapshotAction a;
    a.uuid = d.uuid;
    a.display_name = d.display_name;
    if (s && s->state == SnapshotState::kCreated && !exists) {
      a.kind = ActionKind::kMarkImplicitlyDeleted;
      a.reason = "created earlier but no longer in the image";
      vanished.push_back(a);
      continue;
    }
    if (!exists) {
      a.kind = ActionKind::kCreate;
      a.rollback_counter = wanted_counter;
      a.reason = !s ? "listed and missing" : "listed and missing (state " + std::string(SnapshotStateName(s->state)) + ")";
      creates.push_back(a);
      continue;
    }
    uint64_t counter = wanted_counter;
    std::string name = d.display_name;
    if (!s || s->state != SnapshotState::kCreated) {
      a.kind = ActionKind::kAdopt;
      a.rollback_counter = counter = s ? s->rollback_counter : wanted_counter;
      a.reason = !s ? "in the image but unknown" : "in the image (state " + std::string(SnapshotStateName(s->state)) + ")";
      adopts.push_back(a);
    } else {
      counter = s->rollback_counter;
      name = s->display_name;
    }
    if (name != d.display_name) {
      SnapshotAction r = a;
      r.kind = ActionKind::kRename;
      r.reason = "display name '" + name + "' -> '" + d.display_name + "'";
      renames.push_back(r);
    }
    if (d.rollback && d.rollback->counter > counter) {
      SnapshotAction r = a;
      r.kind = ActionKind::kRollback;
      r.rollback_counter = d.rollback->counter;
      r.discard_newer = d.rollback->discard_newer;
      r.reason = "rollback counter " + std::to_string(counter) + " -> " + std::to_string(d.rollback->counter);
      rollbacks.push_back(r);
    }
  }
  std::vector<SnapshotAction> out;
  for (auto* group : {&forget, &vanished, &deletes, &adopts, &renames, &rollbacks, &creates}) {
    out.insert(out.end(), group->begin(), group->end());
  }
  return out;
}

}  // namespace barge::orchestrate
