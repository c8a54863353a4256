// Output: text or NDJSON events, errors with their exit codes, and the
// subcommand registration every command goes through.
#include "cli/output.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <ostream>
#include <sstream>
#include <streambuf>

#include "blockio/nbd.h"
#include "cli/interrupt.h"

namespace barge::cli {

namespace {

// One line to stderr in one write: what stdout holds goes first (as the
// tie to std::cout would), and a reader merging both streams (a log, a
// test) never sees the line cut in two by stdout's text.
void WriteStderrLine(const std::string& line) {
  std::cout.flush();
  // One line whatever it names: a line break or another control byte in a
  // file name or URL is written as \n, \r or \xHH, so a reader never takes
  // the rest for a line of its own.
  std::string text;
  text.reserve(line.size() + 1);
  for (unsigned char c : line) {
    if (c == '\n') {
      text += "\\n";
    } else if (c == '\r') {
      text += "\\r";
    } else if ((c < 0x20 && c != '\t') || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      text += "\\x";
      text += kHex[c >> 4];
      text += kHex[c & 0xf];
    } else {
      text += static_cast<char>(c);
    }
  }
  text += "\n";
  std::cerr.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::cerr.flush();
}

// A stream that drops everything: text() under --json.
class NullBuffer final : public std::streambuf {
 protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

std::ostream& NullStream() {
  static NullBuffer buffer;
  static std::ostream stream(&buffer);
  return stream;
}

std::string FullName(const CLI::App* app) {
  std::string name = app->get_name();
  for (const CLI::App* p = app->get_parent(); p != nullptr && p->get_parent() != nullptr;
       p = p->get_parent()) {
    name = p->get_name() + " " + name;
  }
  return name;
}

}  // namespace

std::string ExitCodeTable() {
  return "Exit codes:\n"
         "  0    success (check: no errors; compare: identical)\n"
         "  1    failed: I/O, not found, not supported, invalid input, no space\n"
         "       (compare: the images differ)\n"
         "  2    corruption: an image, manifest or digest table is damaged or does\n"
         "       not match its digests (compare: any error)\n"
         "  3    check: leaked clusters only\n"
         "  4    busy: another process holds a lock on it; retry later\n"
         "  64   usage: unknown command or option, bad option value\n"
         "  70   internal error (a bug in barge)\n"
         "  130  interrupted (SIGINT); 143 terminated (SIGTERM): temporaries removed\n";
}

constexpr EnvVar kEnvironment[] = {
    {"BARGE_CATALOG",
     "The SQLite catalog (trackers, checkpoints, backup records, backing images) when --catalog is not given."},
    {"XDG_STATE_HOME",
     "Without --catalog and BARGE_CATALOG, the catalog is $XDG_STATE_HOME/barge/catalog.db "
     "(default ~/.local/state/barge/catalog.db)."},
    {"BARGE_LIBVIRT_URI", "The libvirt connection URI of the vm, cbt, tracker, checkpoint and doctor commands "
                          "and of snapshot --domain when --connect is not given (default qemu:///system)."},
    {"BARGE_NO_URING", "Set to 1 to read and write files with pread/pwrite instead of io_uring (where a "
                       "seccomp profile lets io_uring start but fail)."},
};

std::span<const EnvVar> Environment() { return kEnvironment; }

std::string EnvironmentTable() {
  // Each variable's text wrapped under its name, as the exit code table.
  std::string out = "Environment:\n";
  for (const EnvVar& e : kEnvironment) {
    out += "  " + std::string(e.name) + "\n";
    std::string line = "      ";
    std::istringstream words(e.text);
    for (std::string w; words >> w;) {
      if (line.size() > 6 && line.size() + 1 + w.size() > 78) {
        out += line + "\n";
        line = "      ";
      }
      line += (line.size() > 6 ? " " : "") + w;
    }
    out += line + "\n";
  }
  return out;
}

int ExitCodeFor(const Error& error) {
  switch (error.code()) {
    case ErrorCode::kCorruption: return kExitCorruption;
    case ErrorCode::kBusy: return kExitBusy;
    case ErrorCode::kInternal: return kExitInternal;
    case ErrorCode::kCancelled:
      if (InterruptSignal() == SIGINT) return kExitSigint;
      if (InterruptSignal() == SIGTERM) return kExitSigterm;
      return kExitError;
    default: return kExitError;
  }
}

Output::Output(std::string command, bool json) : command_(std::move(command)), json_(json) {}

std::ostream& Output::text() { return json_ ? NullStream() : std::cout; }

void Output::Event(std::string_view event, const nlohmann::json& fields) {
  if (!json_) return;
  // "event" and "command" first, for people reading the stream.
  nlohmann::ordered_json j;
  j["event"] = event;
  j["command"] = command_;
  if (fields.is_object()) {
    for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = it.value();
  }
  // One line per event, whole: never interleaved with another thread's.
  std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  std::lock_guard lock(mu_);
  std::cout.flush();
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fflush(stdout);
}

void Output::Warning(const std::string& message_given, const std::string& file_given) {
  // A location is shown without its secrets, whoever built the message.
  const std::string file = RedactUri(file_given);
  const std::string message = RedactUrisIn(message_given);
  {
    std::lock_guard lock(mu_);
    WriteStderrLine("barge: warning: " + (file.empty() ? "" : file + ": ") + message);
  }
  nlohmann::json j = {{"message", message}};
  if (!file.empty()) j["file"] = file;
  Event("warning", j);
}

void Output::Notice(std::string_view event, const std::string& line, const nlohmann::json& fields) {
  {
    std::lock_guard lock(mu_);
    WriteStderrLine("barge: " + line);
  }
  Event(event, fields);
}

int Output::Fail(const Error& error) { return Fail(error, ExitCodeFor(error)); }

int Output::Fail(const Error& error_given, int exit_code) {
  // The last guard: a URI as the error's file or in its message loses its
  // secrets here even if a layer below forgot (blockio names exports by
  // RedactUri).
  Error error(error_given.code(), RedactUrisIn(error_given.message()));
  error.set_errno(error_given.errno_value()).set_retryable(error_given.retryable());
  error.set_path(RedactUri(error_given.path()));
  if (error_given.offset()) error.set_offset(*error_given.offset());
  if (error_given.offset() && error_given.length()) error.set_range(*error_given.offset(), *error_given.length());
  // Interrupted runs exit 130/143 whatever the command's own codes say.
  if (error.code() == ErrorCode::kCancelled && InterruptSignal() != 0) {
    exit_code = 128 + InterruptSignal();
  }
  {
    std::lock_guard lock(mu_);
    WriteStderrLine("barge: " + error.ToString());
  }
  nlohmann::json j = {{"code", ErrorCodeName(error.code())},
                      {"message", error.message()},
                      {"exit_code", exit_code},
                      {"retryable", error.retryable()}};
  if (!error.path().empty()) j["file"] = error.path();
  if (error.offset()) j["offset"] = *error.offset();
  if (error.length()) j["length"] = *error.length();
  if (error.errno_value() != 0) j["errno"] = error.errno_value();
  Event("error", j);
  return exit_code;
}

int Output::Usage(const std::string& message) {
  return Fail(Error::InvalidArgument(message), kExitUsage);
}

CLI::App* AddCommand(CLI::App& parent, const std::string& name, const std::string& description,
                     int& exit_code, std::function<int(Output&)> run) {
  CLI::App* cmd = parent.add_subcommand(name, description);
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "NDJSON on stdout: one object per line with an \"event\" (docs/json.md)");
  cmd->callback([cmd, json, run = std::move(run), &exit_code]() {
    Output out(FullName(cmd), *json);
    exit_code = run(out);
  });
  return cmd;
}

CLI::App* AddGroup(CLI::App& parent, const std::string& name, const std::string& description) {
  CLI::App* group = parent.add_subcommand(name, description);
  group->require_subcommand(1);
  return group;
}

}  // namespace barge::cli
