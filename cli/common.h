// Shared pieces of the subcommands: opening images, reporting errors, and
// human/JSON output in qemu-img's habits.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "blockio/error.h"
#include "cli/output.h"
#include "formats/image.h"
#include "formats/units.h"

namespace barge::cli {

// Options every command that opens images shares.
struct ImageFlags {
  std::string format;  // "", "raw" or "qcow2"
  bool allow_any_path = false;
  std::vector<std::string> allow_dirs;

  void AddTo(CLI::App* app, const std::string& format_flag = "-f,--format");
  Result<formats::OpenOptions> ToOpenOptions() const;
};

// Opens a file or block device image (with its backing chain) for reading.
Result<std::unique_ptr<formats::Image>> OpenImageFile(const std::string& path,
                                                      const formats::OpenOptions& options);

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

}  // namespace barge::cli
