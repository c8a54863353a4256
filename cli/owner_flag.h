// --allow-other-owner, shared by every command that writes into chain
// folders (backup, vm backup, merge, forget, run, serve, export, files,
// verify's records, vm instant-restore).
#pragma once

#include <CLI/CLI.hpp>

namespace barge::cli {

// Adds --allow-other-owner to `cmd`: given, chain folders (and the folders
// holding them) that another user owns are written in
// (pipeline::SetAllowOtherOwner); by default they are refused.
void AddAllowOtherOwnerFlag(CLI::App* cmd);

}  // namespace barge::cli
