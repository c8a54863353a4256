// Fuzzes the dirty-extents file decoder: every input gives ranges or an Error,
// and the ranges come back normalized.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/extents_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = barge::formats::DecodeExtentsFile(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!f.ok()) return 0;
  for (size_t i = 1; i < f->dirty.size(); ++i) {
    if (f->dirty[i].offset <= f->dirty[i - 1].end()) std::abort();
  }
  return 0;
}
