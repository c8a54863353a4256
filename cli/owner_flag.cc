// The --allow-other-owner flag.
#include "cli/owner_flag.h"

#include "pipeline/chain_files.h"

namespace barge::cli {

void AddAllowOtherOwnerFlag(CLI::App* cmd) {
  cmd->add_flag_callback(
      "--allow-other-owner", [] { pipeline::SetAllowOtherOwner(true); },
      "Write into chain folders (or target folders) another user owns; refused by default, since that user "
      "could lead barge's writes elsewhere (docs/security.md)");
}

}  // namespace barge::cli
