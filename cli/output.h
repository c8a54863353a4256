// What every command prints, one way (docs/json.md, docs/errors.md):
// readable text on stdout by default; with --json, NDJSON on stdout: one
// compact object per line, each with "event" ("progress", "warning",
// "result", "error") and "command". An error is also one line on stderr,
// "barge: <Code>: <file>: <what>", in both modes. Exit codes come from one
// table (ExitCode below, shown by `barge --help`).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <iosfwd>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "blockio/error.h"
#include "orchestrate/base/closest_match.h"

namespace barge::cli {

// The exit codes of every command. Keep docs/errors.md and ExitCodeTable()
// in step with it.
enum ExitCode : int {
  kExitOk = 0,          // success; check: no errors; compare: identical
  kExitError = 1,       // failed (I/O, not found, not supported, invalid input,
                        // no space); compare: the images differ
  kExitCorruption = 2,  // damaged data: an image, manifest or digest table
                        // breaks its format or its digests; compare: any error
  kExitLeaks = 3,       // check: leaked clusters only
  kExitBusy = 4,        // a lock is held by another process: retry later
  kExitUsage = 64,      // unknown command or option, bad option value
  kExitInternal = 70,   // a bug in barge (please report it)
  kExitSigint = 130,    // stopped by SIGINT (Ctrl-C); temporaries removed
  kExitSigterm = 143,   // stopped by SIGTERM; temporaries removed
};

// The table as text, for `barge --help`.
std::string ExitCodeTable();

// The environment variables barge reads (user configuration, never a test
// seam): the man page's ENVIRONMENT section and `barge --help` list them.
struct EnvVar {
  const char* name;
  const char* text;
};
std::span<const EnvVar> Environment();

// Environment() as text, for `barge --help`.
std::string EnvironmentTable();

// The exit code for an error: kCorruption -> 2, kBusy -> 4, kInternal ->
// 70, kCancelled after SIGINT/SIGTERM -> 130/143, anything else -> 1.
int ExitCodeFor(const Error& error);

// One command's output. Thread-safe: progress may come from any thread.
class Output {
 public:
  // `command` is the full subcommand name ("restore", "image add").
  Output(std::string command, bool json);
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  bool json() const { return json_; }
  const std::string& command() const { return command_; }

  // Where readable text goes: stdout, or nowhere under --json (so text
  // printing needs no branch of its own).
  std::ostream& text();

  // {"event": EVENT, "command": ..., FIELDS...} as one line on stdout
  // (JSON mode only; nothing in text mode). Keys are snake_case, sizes in
  // bytes, durations "*_seconds", times RFC 3339 UTC.
  void Event(std::string_view event, const nlohmann::json& fields);
  // The command's one result object (JSON mode); text mode prints nothing:
  // commands print their readable result through text().
  void Result(const nlohmann::json& fields) { Event("result", fields); }
  // Progress (JSON mode only; the bar is ProgressReporter's).
  void Progress(const nlohmann::json& fields) { Event("progress", fields); }
  // "barge: warning: <file>: <message>" on stderr, and a "warning" event.
  void Warning(const std::string& message, const std::string& file = "");
  // Something that happened and was dealt with (a reconnect): "barge:
  // <line>" on stderr in both modes, and event EVENT with `fields`.
  void Notice(std::string_view event, const std::string& line, const nlohmann::json& fields);

  // Reports `error` (stderr line; "error" event with code, message, file,
  // offset, errno, retryable, exit_code) and returns its exit code from
  // the table, or `exit_code` where a command has its own (compare).
  int Fail(const Error& error);
  int Fail(const Error& error, int exit_code);
  // A usage error found after parsing (a bad combination of options, a
  // value out of range): reported like Fail, exit kExitUsage.
  int Usage(const std::string& message);

 private:
  std::string command_;
  bool json_;
  std::mutex mu_;
};

// Adds subcommand `name` under `parent`, with a --json flag. When it is
// given on the command line, `run` is called with the command's Output
// and what it returns is the process's exit code. `exit_code` must
// outlive the parse (Main's).
CLI::App* AddCommand(CLI::App& parent, const std::string& name, const std::string& description,
                     int& exit_code, std::function<int(Output&)> run);

// A parent command that only groups others ("image", "bitmap"): needs one.
CLI::App* AddGroup(CLI::App& parent, const std::string& name, const std::string& description);

// "Did you mean ...": orchestrate's, for the commands' own typos too.
using orchestrate::ClosestMatch;

}  // namespace barge::cli
