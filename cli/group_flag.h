// `--group NAME` of the commands that write backups or restore files
// (backup, vm backup, merge, restore, convert): who besides the owner may
// read them (pipeline/file_access.h; docs/security.md, "Backups are
// private").
#pragma once

#include <optional>
#include <string>

#include "blockio/error.h"
#include "pipeline/file_access.h"

namespace CLI {
class App;
}

namespace barge::cli {

// Adds `--group NAME` to `cmd`, storing into `group`; `what` says what the
// group may read ("the chain").
void AddGroupFlag(CLI::App* cmd, std::string& group, const std::string& what);

// The access `--group` asks for: nullopt when not given; folders 02750 and
// files 0640 owned by the group otherwise. kNotFound (a usage error) for
// an unknown group.
Result<std::optional<pipeline::FileAccess>> GroupFlagAccess(const std::string& group);

}  // namespace barge::cli
