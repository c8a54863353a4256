// JSON that crosses barge's edge: fields read from files, catalog rows and
// QEMU's replies, and documents written with text from outside (paths,
// names found in images). nlohmann throws on a field of the wrong type and
// on text that is not UTF-8; these never throw.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "blockio/error.h"

namespace barge::formats {

// j[key] when j is an object holding a string there, else `fallback`.
std::string JsonString(const nlohmann::json& j, std::string_view key, std::string fallback = {});

// j[key] when j is an object holding a non-negative integer there, else
// `fallback` (a float, a negative number or a string are not taken).
uint64_t JsonUint(const nlohmann::json& j, std::string_view key, uint64_t fallback = 0);

// j[key] when j is an object holding a bool there, else `fallback`.
bool JsonBool(const nlohmann::json& j, std::string_view key, bool fallback = false);

// Whether `text` is valid UTF-8 (what a JSON document can hold exactly).
bool IsUtf8(std::string_view text);

// j serialised like nlohmann's dump(indent). Text that is not valid UTF-8
// is an InvalidArgument naming `what` (a JSON document cannot hold it
// exactly, and a record that renamed a file would name a different one).
// Works for nlohmann::json and nlohmann::ordered_json.
template <typename Json>
Result<std::string> DumpJson(const Json& j, int indent, std::string_view what) {
  try {
    return j.dump(indent);
  } catch (const nlohmann::json::exception&) {
    return Error::InvalidArgument(std::string(what) +
                                  " would hold text that is not valid UTF-8 (a path or name with other bytes)");
  }
}

// j serialised for display only (HTTP status, messages): text that is not
// UTF-8 is replaced by U+FFFD.
template <typename Json>
std::string DumpJsonForDisplay(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

}  // namespace barge::formats
