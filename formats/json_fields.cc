// Non-throwing JSON field access and serialisation (see json_fields.h).
#include "formats/json_fields.h"

namespace barge::formats {

using nlohmann::json;

namespace {

const json* Field(const json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

}  // namespace

std::string JsonString(const json& j, std::string_view key, std::string fallback) {
  const json* f = Field(j, key);
  return f && f->is_string() ? f->get<std::string>() : fallback;
}

uint64_t JsonUint(const json& j, std::string_view key, uint64_t fallback) {
  const json* f = Field(j, key);
  return f && f->is_number_unsigned() ? f->get<uint64_t>() : fallback;
}

bool IsUtf8(std::string_view text) {
  // The encoder's own check, so the answer always agrees with DumpJson.
  return DumpJson(json(std::string(text)), -1, "").ok();
}

bool JsonBool(const json& j, std::string_view key, bool fallback) {
  const json* f = Field(j, key);
  return f && f->is_boolean() ? f->get<bool>() : fallback;
}

}  // namespace barge::formats
