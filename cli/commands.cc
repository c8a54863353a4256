// Subcommand registration.
#include "cli/commands.h"

#include <CLI/CLI.hpp>

#include <iostream>

namespace barge::cli {

int Main(int argc, char** argv) {
  CLI::App app{"barge: fast, verified block data for VM disks"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "barge 0.1.0");
  CLI11_PARSE(app, argc, argv);
  return 0;
}

}  // namespace barge::cli
