// Fuzzes the compression spelling that policies and manifests feed
// (formats::ParseCompressionSpec): any input gives a spec or an Error, and
// an accepted spec prints to text that parses back to the same spec.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/image.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = barge::formats::ParseCompressionSpec(text);
  if (!spec.ok()) return 0;
  const int max_level = barge::formats::MaxCompressionLevel(spec->type);
  if (spec->type != barge::formats::Compression::kNone && (spec->level < 1 || spec->level > max_level)) std::abort();
  auto again = barge::formats::ParseCompressionSpec(spec->ToString());
  if (!again.ok() || !(*again == *spec)) std::abort();
  return 0;
}
