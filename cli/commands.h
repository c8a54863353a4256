// The barge command line: builds the CLI11 app and dispatches subcommands.
#pragma once

namespace barge::cli {

// Parses argv and runs one subcommand; returns the process exit code.
int Main(int argc, char** argv);

}  // namespace barge::cli
