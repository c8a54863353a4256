// Catalog path resolution.
#include "orchestrate/catalog_path.h"

#include <cstdlib>

namespace barge::orchestrate {

std::string ResolveCatalogPath(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("BARGE_CATALOG"); env && *env) return env;
  if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state) {
    return std::string(state) + "/barge/catalog.db";
  }
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/root") + "/.local/state/barge/catalog.db";
}

}  // namespace barge::orchestrate
