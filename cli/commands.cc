// Builds the barge command line and dispatches subcommands.
#include "cli/commands.h"

#include <CLI/CLI.hpp>

#include "cli/common.h"

namespace barge::cli {

int Main(int argc, char** argv) {
  CLI::App app{"barge: fast, verified block data for VM disks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "barge 0.1.0");
  int exit_code = kExitOk;
  RegisterImageCommands(app, exit_code);
  RegisterConvertCommand(app, exit_code);
  RegisterBitmapCommands(app, exit_code);
  RegisterBackupCommand(app, exit_code);
  RegisterRestoreCommands(app, exit_code);
  RegisterVmCommands(app, exit_code);
  RegisterBenchCommand(app, exit_code);
  RegisterMergeCommand(app, exit_code);
  RegisterReplicateCommand(app, exit_code);
  RegisterStateCommands(app, exit_code);
  RegisterImageCatalogCommands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}

}  // namespace barge::cli
