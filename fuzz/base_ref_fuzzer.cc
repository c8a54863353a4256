// Fuzzes the base reference decoder (.bases/<chain id>.json in a base
// chain's folder, read by forget, merge, retention and list): any input
// gives a reference with safe names or an Error, and a decoded reference
// survives an encode/decode round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/manifest.h"
#include "pipeline/base_refs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge::pipeline;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = DecodeBaseRef(text);
  if (!r.ok()) return 0;
  if (!barge::formats::IsBaseChainPath(r->dependent) || r->chain_id.empty() ||
      r->chain_id.find('/') != std::string::npos || r->base_id.empty() || r->base_id.front() == '.' ||
      r->base_id.find('/') != std::string::npos) {
    std::abort();
  }
  auto again = DecodeBaseRef(EncodeBaseRef(*r));
  if (!again.ok() || again->dependent != r->dependent || again->chain_id != r->chain_id ||
      again->base_id != r->base_id) {
    std::abort();
  }
  return 0;
}
