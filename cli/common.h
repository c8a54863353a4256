// Shared pieces of the subcommands: opening images, reporting errors, and
// human/JSON output in qemu-img's habits.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "blockio/error.h"
#include "blockio/http_client.h"
#include "cli/output.h"
#include "formats/image.h"
#include "formats/units.h"

namespace barge::cli {

// barge's version (`barge --version`, the man page, completion scripts).
inline constexpr const char* kBargeVersion = "0.1.0";

// Options every command that opens images shares.
struct ImageFlags {
  std::string format;  // "", "raw" or "qcow2"
  bool allow_any_path = false;
  std::vector<std::string> allow_dirs;
  // An http(s):// image's TLS authorities and credentials (info, map,
  // compare register their flags: cli/http_flags.h).
  HttpOptions http;

  void AddTo(CLI::App* app, const std::string& format_flag = "-f,--format");
  Result<formats::OpenOptions> ToOpenOptions() const;
};

// Opens a file or block device image (with its backing chain) for reading,
// or an NBD export (nbd://, nbd+unix://; raw, as the export serves it),
// through Env::Default() (the Env every command runs on).
// An http(s):// URL is read with `http` (its files checked first).
Result<std::unique_ptr<formats::Image>> OpenImageFile(const std::string& path,
                                                      const formats::OpenOptions& options,
                                                      const HttpOptions& http = {});

// A file named "*.qcow2" whose bytes are not a qcow2 image is read as a raw
// disk when no format is given: a mix-up worth a warning (Output::Warning),
// unless `format_flag` says which format it is. Files only; silent when the
// file cannot be read (opening it reports that).
void WarnIfMisnamed(Output& out, const std::string& path, const std::string& format_flag);

// A manifest's time for JSON, where a time is RFC 3339 UTC or null: null
// when the manifest has none (the field is optional) or it is not a time
// (docs/json.md, field rules).
nlohmann::json TimeJson(const std::string& text);

// printf-style formatting into a string (tables of the text output).
std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

using formats::HumanBytes;
using formats::HumanBytesExact;
using formats::HumanSeconds;
using formats::ParseSize;

// Each subcommand file registers its commands through one of these.
void RegisterImageCommands(CLI::App& app, int& exit_code);
void RegisterConvertCommand(CLI::App& app, int& exit_code);
void RegisterBitmapCommands(CLI::App& app, int& exit_code);
void RegisterBackupCommand(CLI::App& app, int& exit_code);
void RegisterRestoreCommands(CLI::App& app, int& exit_code);
void RegisterVmCommands(CLI::App& app, int& exit_code);
void RegisterBenchCommand(CLI::App& app, int& exit_code);
void RegisterMergeCommand(CLI::App& app, int& exit_code);
void RegisterReplicateCommand(CLI::App& app, int& exit_code);
void RegisterStateCommands(CLI::App& app, int& exit_code);
void RegisterImageCatalogCommands(CLI::App& app, int& exit_code);
void RegisterSnapshotCommands(CLI::App& app, int& exit_code);
void RegisterPolicyCommands(CLI::App& app, int& exit_code);
void RegisterServeCommand(CLI::App& app, int& exit_code);
// These add to groups the ones above made ("bitmap", "catalog") or walk
// the whole tree ("completion", "man"): register them last.
void RegisterBitmapEditCommands(CLI::App& app, int& exit_code);
void RegisterListCommands(CLI::App& app, int& exit_code);
void RegisterDocCommands(CLI::App& app, int& exit_code);

}  // namespace barge::cli
