// Fuzzes the manifest JSON decoder: any input must give a manifest or an
// Error, a decoded manifest must survive a re-encode round trip, and it
// names only its own point's files.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "formats/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = barge::formats::DecodeManifest(text);
  if (!m.ok()) return 0;
  // Text the parser accepted is UTF-8, so it always encodes again.
  auto encoded = barge::formats::EncodeManifest(*m);
  if (!encoded.ok()) std::abort();
  auto again = barge::formats::DecodeManifest(*encoded);
  if (!again.ok() || again->id != m->id || again->image_digest != m->image_digest) std::abort();
  if (again->disk_identity != m->disk_identity || again->chain_id != m->chain_id) std::abort();
  // Every file a decoded manifest names is its own point's, of its kind
  // (issue 35): nothing it names can be another point's file.
  if (m->image != m->id + ".qcow2" || m->digest_table != m->id + ".digests") std::abort();
  if (!m->strong_digest_table.empty() && m->strong_digest_table != m->id + ".sha256") std::abort();
  if (m->parent && m->parent->image != m->parent->id + ".qcow2") std::abort();
  if (m->base && m->base->image != m->base->id + ".qcow2") std::abort();
  return 0;
}
