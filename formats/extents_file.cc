// Dirty-extents file decoder.
#include "formats/extents_file.h"

#include <nlohmann/json.hpp>

namespace barge::formats {

using nlohmann::json;

namespace {
constexpr size_t kMaxEntries = 50'000'000;

Error Bad(const std::string& what) { return Error::Corruption("extents file: " + what); }

Result<uint64_t> U64(const json& obj, const char* key, size_t index) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_unsigned()) {
    return Bad("entry " + std::to_string(index) + ": '" + key + "' must be a non-negative integer");
  }
  return it->get<uint64_t>();
}
}  // namespace

Result<ExtentsFile> DecodeExtentsFile(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("not valid JSON");
  ExtentsFile out;
  const json* list = &j;
  if (j.is_object()) {
    auto fmt = j.find("format");
    if (fmt == j.end() || *fmt != "barge-extents") return Bad("format must be \"barge-extents\"");
    auto ver = j.find("version");
    if (ver == j.end() || !ver->is_number_unsigned() || ver->get<uint64_t>() != 1) {
      return Error::NotSupported("extents file: only version 1 is supported");
    }
    if (auto vs = j.find("virtual_size"); vs != j.end()) {
      if (!vs->is_number_unsigned()) return Bad("virtual_size must be a non-negative integer");
      out.virtual_size = vs->get<uint64_t>();
    }
    auto ex = j.find("extents");
    if (ex == j.end()) return Bad("missing \"extents\"");
    list = &*ex;
  }
  if (!list->is_array()) return Bad("extents must be an array");
  if (list->size() > kMaxEntries) return Bad("too many entries");
  out.dirty.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& e = (*list)[i];
    if (!e.is_object()) return Bad("entry " + std::to_string(i) + " is not an object");
    if (auto d = e.find("dirty"); d != e.end()) {
      if (!d->is_boolean()) return Bad("entry " + std::to_string(i) + ": 'dirty' must be a boolean");
      if (!d->get<bool>()) continue;
    }
    BARGE_ASSIGN_OR_RETURN(uint64_t offset, U64(e, "offset", i));
    BARGE_ASSIGN_OR_RETURN(uint64_t length, U64(e, "length", i));
    if (length > UINT64_MAX - offset) return Bad("entry " + std::to_string(i) + " overflows");
    if (out.virtual_size && offset + length > *out.virtual_size) {
      return Bad("entry " + std::to_string(i) + " ends beyond virtual_size");
    }
    out.dirty.push_back({offset, length});
  }
  out.dirty = NormalizeRanges(std::move(out.dirty));
  return out;
}

}  // namespace barge::formats
