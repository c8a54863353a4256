// Fuzzes the base reference decoder (.bases/<chain id>.json in a base
// chain's folder, read by forget, merge, retention and list) and the
// catalog image marker's (.catalog-image.json, read by `backup --base
// image:NAME`): any input gives a record with safe names or an Error, and
// a decoded one survives an encode/decode round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/manifest.h"
#include "pipeline/base_refs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge::pipeline;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto m = DecodeCatalogImageMarker(text); m.ok()) {
    if (m->point.empty() || m->point.front() == '.' || m->point.find('/') != std::string::npos ||
        m->sha512.size() != 128) {
      std::abort();
    }
    if (auto text2 = EncodeCatalogImageMarker(*m); text2.ok()) {
      auto m2 = DecodeCatalogImageMarker(*text2);
      if (!m2.ok() || m2->image != m->image || m2->point != m->point || m2->sha512 != m->sha512 ||
          m2->copy != m->copy) {
        std::abort();
      }
    }
  }
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
