#include "orchestrate/policy/runs_listing.h"

#include <algorithm>

#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/policy/policy.h"
#include "orchestrate/policy/policy_runner.h"

namespace barge::orchestrate {

Result<std::vector<std::string>> ListedCatalogs(Env& env, const std::vector<std::string>& flags) {
  std::vector<std::string> out;
  if (flags.empty()) {
    BARGE_ASSIGN_OR_RETURN(std::string path, CatalogPathFromFlag(env, ""));
    if (!env.Exists(path)) {
      return Error::NotFound("no catalog here (nothing recorded yet; --catalog or $BARGE_CATALOG name another)")
          .set_path(path);
    }
    out.push_back(path);
    return out;
  }
  for (const auto& flag : flags) {
    auto st = env.Stat(flag);
    if (st.ok() && st->is_directory()) {
      BARGE_ASSIGN_OR_RETURN(auto names, env.ListDir(flag));
      std::sort(names.begin(), names.end());
      std::string dir = flag;
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      size_t found = 0;
      for (const auto& n : names) {
        if (n.size() <= 3 || !n.ends_with(".db") || n.starts_with(".")) continue;
        out.push_back(dir + "/" + n);
        ++found;
      }
      if (found == 0) return Error::NotFound("no catalog (*.db) in this records folder").set_path(flag);
      continue;
    }
    BARGE_ASSIGN_OR_RETURN(std::string path, CatalogPathFromFlag(env, flag));
    if (!env.Exists(path)) return Error::NotFound("no catalog here (nothing recorded yet)").set_path(path);
    out.push_back(path);
  }
  return out;
}

Result<std::string> PolicyNameFromFlag(Env& env, const std::string& policy_flag) {
  if (auto st = env.Stat(policy_flag); !policy_flag.empty() && st.ok() && st->is_regular()) {
    BARGE_ASSIGN_OR_RETURN(Policy p, LoadPolicy(env, policy_flag));
    return p.name;
  }
  return policy_flag;
}

Result<std::vector<std::pair<RunRecord, std::string>>> ListRunsOf(Env& env, const std::vector<std::string>& files,
                                                                  const RunFilter& filter,
                                                                  const std::optional<ShardSpec>& shard,
                                                                  const ListWarning& warn) {
  std::vector<std::pair<RunRecord, std::string>> out;
  for (const auto& file : files) {
    BARGE_ASSIGN_OR_RETURN(auto catalog, PolicyCatalog::Open(env, file));
    // A run whose process died shows as what it is: interrupted.
    auto settled = SettleCutRuns(env, file, *catalog);
    if (!settled.ok()) warn("records of runs cut short not settled: " + settled.error().ToString(), file);
    BARGE_ASSIGN_OR_RETURN(auto list, catalog->ListRuns(filter, shard));
    for (auto& r : list) out.emplace_back(std::move(r), file);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& x, const auto& y) { return x.first.started_at > y.first.started_at; });
  if (filter.limit > 0 && out.size() > filter.limit) out.resize(filter.limit);
  return out;
}

std::string PartState(const RunRecord& r, size_t i) {
  return i < r.point_states.size() ? r.point_states[i] : "present";
}

std::string PointFate(const RunRecord& r) {
  if (r.point_state.empty() || r.point_state == "present") return "";
  if (r.point_state != "removed") return "point " + r.point_state;
  std::vector<std::string> into;
  for (size_t i = 0; i < r.points.size(); ++i) {
    const std::string state = PartState(r, i);
    if (!state.starts_with("merged into ")) return "point removed";
    std::string id = state.substr(std::string("merged into ").size());
    if (std::find(into.begin(), into.end(), id) == into.end()) into.push_back(id);
  }
  std::string text = "point merged into ";
  for (size_t i = 0; i < into.size(); ++i) text += (i ? ", " : "") + into[i];
  return text;
}

}  // namespace barge::orchestrate
