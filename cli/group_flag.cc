// --group NAME: the flag and its access.
#include "cli/group_flag.h"

#include <CLI/CLI.hpp>

namespace barge::cli {

void AddGroupFlag(CLI::App* cmd, std::string& group, const std::string& what) {
  cmd->add_option("--group", group,
                  "Let group NAME (a name or number) read " + what +
                      ": folders 0750 (setgid), files 0640, owned by the group; default: the owner alone "
                      "(folders 0700, files 0600), whatever the umask")
      ->type_name("NAME");
}

Result<std::optional<pipeline::FileAccess>> GroupFlagAccess(const std::string& group) {
  if (group.empty()) return std::optional<pipeline::FileAccess>();
  auto access = pipeline::AccessForGroup(group);
  if (!access.ok()) return Error(access.error()).Wrap("--group " + group);
  return std::optional<pipeline::FileAccess>(*access);
}

}  // namespace barge::cli
