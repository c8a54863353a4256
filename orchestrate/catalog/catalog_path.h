// Where the SQLite catalog lives: --catalog, else $BARGE_CATALOG, else
// $XDG_STATE_HOME/barge/catalog.db (~/.local/state/barge/catalog.db).
#pragma once

#include <string>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

// barge's state folder: $XDG_STATE_HOME/barge, else ~/.local/state/barge
// (HOME unset: /root). Not created here.
std::string BargeStateDir();

std::string ResolveCatalogPath(const std::string& flag_value);

// ResolveCatalogPath, and an explicit --catalog must name a file in a
// folder that exists: kNotFound naming the folder otherwise (a typo in the
// flag must not create a new, empty catalog somewhere), kInvalidArgument
// when it names a folder. The default places are created as needed.
Result<std::string> CatalogPathFromFlag(Env& env, const std::string& flag_value);

// For commands that update a catalog only where one exists (state migrate
// repoints the records that name a moved folder): an explicit --catalog is
// checked as CatalogPathFromFlag does and must exist (its kNotFound
// otherwise); without the flag, the default place when a catalog exists
// there, else "" (no catalog: nothing to update). Nothing is created.
Result<std::string> ExistingCatalogPath(Env& env, const std::string& flag_value);

}  // namespace barge::orchestrate
