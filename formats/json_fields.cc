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
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;  // cut short
    for (size_t k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(text[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += extra + 1;
  }
  return true;
}

bool JsonBool(const json& j, std::string_view key, bool fallback) {
  const json* f = Field(j, key);
  return f && f->is_boolean() ? f->get<bool>() : fallback;
}

}  // namespace barge::formats
