// Helpers shared by the tests of interrupted and resumed transfers
// (backup_resume_test, replicate_resume_test): what a run left behind, and
// how much a server says was read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "tests/testing/cli_testing.h"

namespace barge::testing {

// Bytes in one resume-journal entry (docs/formats/resume.md).
inline constexpr uint64_t kJournalEntryBytes = 40;

// The size of `path`, or 0 when it does not exist (yet).
inline uint64_t FileSize(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

// Bytes nbdkit's log filter saw read ("Read ... count=0x..." lines).
inline uint64_t BytesReadInLog(const std::string& log) {
  std::ifstream in(log);
  uint64_t total = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.find(" Read ") == std::string::npos) continue;
    auto at = line.find("count=0x");
    if (at != std::string::npos) total += std::stoull(line.substr(at + 8), nullptr, 16);
  }
  return total;
}

// Temporaries and resume journals in `dir` (recursively): what a finished
// run must not leave.
inline std::vector<std::string> Leftovers(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.ends_with(".barge-tmp") || name.ends_with(".barge-resume")) found.push_back(name);
  }
  return found;
}

// A shell command line running barge with `args`.
inline std::string JoinArgs(const std::vector<std::string>& args) {
  std::string cmd = Barge();
  for (const auto& a : args) cmd += " " + Q(a);
  return cmd;
}

}  // namespace barge::testing
