// Where the SQLite catalog lives: --catalog, else $BARGE_CATALOG, else
// $XDG_STATE_HOME/barge/catalog.db (~/.local/state/barge/catalog.db).
#pragma once

#include <string>

namespace barge::orchestrate {

std::string ResolveCatalogPath(const std::string& flag_value);

}  // namespace barge::orchestrate
