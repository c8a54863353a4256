// Fuzzes the TZif reader (zoneinfo files are bytes we did not write): any
// input gives a zone or an Error, and a zone answers offsets and local
// mappings without crashing.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "orchestrate/schedule/time_zone.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto z = barge::orchestrate::TimeZone::FromTzif("fuzz", bytes);
  if (!z.ok()) return 0;
  using std::chrono::seconds;
  for (int64_t t : {int64_t{-2208988800}, int64_t{0}, int64_t{1798761599}, int64_t{4102444800}}) {
    std::chrono::sys_seconds at{seconds{t}};
    auto off = z->OffsetAt(at);
    if (off.count() <= -89999 * 2 || off.count() >= 93600 * 2) std::abort();
    auto m = z->FromLocal(z->ToLocal(at));
    if (m.instants.empty() && !m.gap_end) std::abort();
  }
  return 0;
}
