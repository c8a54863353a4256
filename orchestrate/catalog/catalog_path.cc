// Catalog path resolution.
#include "orchestrate/catalog/catalog_path.h"

#include <cstdlib>

#include "blockio/env.h"

namespace barge::orchestrate {

std::string BargeStateDir() {
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) return std::string(state) + "/barge";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/root") + "/.local/state/barge";
}

std::string ResolveCatalogPath(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("BARGE_CATALOG"); env && *env) return env;
  return BargeStateDir() + "/catalog.db";
}

Result<std::string> CatalogPathFromFlag(Env& env, const std::string& flag_value) {
  std::string path = ResolveCatalogPath(flag_value);
  if (flag_value.empty()) return path;
  if (auto st = env.Stat(path); st.ok() && st->is_directory()) {
    return Error::InvalidArgument("--catalog names a folder; give the catalog's database file (e.g. " + path +
                                  "/catalog.db)")
        .set_path(path);
  }
  auto slash = path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  auto st = env.Stat(dir);
  if (!st.ok() || !st->is_directory()) {
    return Error::NotFound("the folder of --catalog " + path +
                           " does not exist (an explicit catalog's folder is not created: make it first, "
                           "or leave --catalog out for the default)")
        .set_path(dir);
  }
  return path;
}

Result<std::string> ExistingCatalogPath(Env& env, const std::string& flag_value) {
  BARGE_ASSIGN_OR_RETURN(std::string path, CatalogPathFromFlag(env, flag_value));
  auto st = env.Stat(path);
  if (st.ok()) return path;
  if (st.error().code() != ErrorCode::kNotFound) return std::move(st).error();
  if (flag_value.empty()) return std::string();
  return std::move(st).error().Wrap("catalog");
}

}  // namespace barge::orchestrate
