// Fuzzes the verification record decoder (<id>.verified beside a manifest,
// read by `barge list`): any input gives a record or an Error, a decoded
// record's time and duration are what list prints, and a decoded record
// survives an encode/decode round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "pipeline/verification_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge::pipeline;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = DecodeVerificationRecord(text);
  if (!r.ok()) return 0;
  if (!(r->duration_seconds >= 0)) std::abort();
  // Text the parser accepted is UTF-8, so it always encodes again.
  auto encoded = EncodeVerificationRecord(*r);
  if (!encoded.ok()) std::abort();
  auto again = DecodeVerificationRecord(*encoded);
  if (!again.ok() || again->id != r->id || again->ok != r->ok || again->image_digest != r->image_digest ||
      again->image_bytes != r->image_bytes || again->clusters_checked != r->clusters_checked) {
    std::abort();
  }
  return 0;
}
