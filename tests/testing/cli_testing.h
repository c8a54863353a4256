// The preamble of the tests that drive the barge binary through the shell:
// command lines, quoting, text and JSON files, extents files, and the
// points of a chain folder.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/testing.h"

namespace barge::testing {

// The built barge binary quoted for /bin/sh; with `args`, a command line.
inline std::string Barge() { return ShellQuote(BargeBinary()); }
inline std::string Barge(const std::string& args) { return Barge() + " " + args; }

inline std::string Q(const std::string& s) { return ShellQuote(s); }

// Run by another name: in a TEST_F body the name Run finds gtest's own
// (private) ::testing::Test::Run first.
inline CommandResult Sh(const std::string& command) { return Run(command); }

inline bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// A whole file as text, and text as a whole file.
inline std::string Slurp(const std::string& path) {
  const std::vector<std::byte> bytes = ReadFile(path);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}
inline void WriteText(const std::string& path, const std::string& text) {
  const auto* b = reinterpret_cast<const std::byte*>(text.data());
  WriteFile(path, std::vector<std::byte>(b, b + text.size()));
}

// A JSON file (a manifest, a record): parsed (throws if it is not JSON),
// and written as barge writes them (indented, a newline at the end).
inline nlohmann::json ReadJson(const std::string& path) { return nlohmann::json::parse(Slurp(path)); }
inline void WriteJson(const std::string& path, const nlohmann::json& j) { WriteText(path, j.dump(2) + "\n"); }

// An extents file (docs/formats/extents.md) of a disk of `virtual_size`
// bytes whose changed ranges are `ranges`, each {offset, length}.
inline void WriteExtentsFile(const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                             uint64_t virtual_size) {
  nlohmann::json extents = nlohmann::json::array();
  for (const auto& [offset, length] : ranges) extents.push_back({{"offset", offset}, {"length", length}});
  WriteText(path, nlohmann::json({{"format", "barge-extents"},
                                  {"version", 1},
                                  {"virtual_size", virtual_size},
                                  {"extents", extents}})
                      .dump());
}

// The ids of a chain folder's points (its manifests' stems, "0000-..."),
// oldest first.
inline std::vector<std::string> PointIds(const std::string& chain_dir) {
  std::vector<std::string> ids;
  for (const auto& e : std::filesystem::directory_iterator(chain_dir)) {
    std::string name = e.path().filename().string();
    if (name[0] != '.' && e.path().extension() == ".json") ids.push_back(e.path().stem().string());
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

// The manifest of point `id` in `chain_dir`.
inline std::string ManifestPath(const std::string& chain_dir, const std::string& id) {
  return chain_dir + "/" + id + ".json";
}

}  // namespace barge::testing
