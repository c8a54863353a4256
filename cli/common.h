// Shared pieces of the subcommands: opening images, reporting errors, and
// human/JSON output in qemu-img's habits.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "blockio/error.h"
#include "formats/image.h"

namespace barge::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;

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

// Prints "barge: <error>" to stderr and returns `exit_code`.
int ReportError(const Error& error, int exit_code = kExitError);
int ReportError(const std::string& context, const Error& error, int exit_code = kExitError);

// Prints a JSON document to stdout.
void PrintJson(const nlohmann::json& j);

// "1.5 GiB" style sizes.
std::string HumanBytes(uint64_t bytes);

// Parses "4G", "512M", "65536", "64k" (binary units). kInvalidArgument else.
Result<uint64_t> ParseSize(const std::string& text);

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

}  // namespace barge::cli
