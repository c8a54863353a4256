// Fuzzes the cron parser and the next-run search: any input must give a
// schedule or an Error; a schedule's runs must be strictly increasing,
// whole minutes, and match again when re-parsed. The first input line may
// name a POSIX TZ rule ("TZ=CET-1CEST,M3.5.0,M10.5.0/3") to fuzz zones too.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "orchestrate/schedule/cron.h"
#include "orchestrate/schedule/time_zone.h"

using namespace barge::orchestrate;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  TimeZone zone = TimeZone::Utc();
  if (text.starts_with("TZ=")) {
    size_t nl = text.find('\n');
    if (nl == std::string_view::npos) return 0;
    auto z = TimeZone::FromPosixRule("fuzz", text.substr(3, nl - 3));
    if (!z.ok()) return 0;
    zone = *z;
    text.remove_prefix(nl + 1);
  }
  auto s = CronSchedule::Parse(text, zone);
  if (!s.ok()) return 0;
  using std::chrono::seconds;
  using std::chrono::sys_seconds;
  for (int64_t start : {int64_t{0}, int64_t{1798761599}, int64_t{4102444800}}) {
    sys_seconds after{seconds{start}};
    for (int i = 0; i < 4; ++i) {
      auto n = s->Next(after);
      if (!n.ok()) break;
      if (*n <= after) std::abort();
      if (zone.is_utc() && n->time_since_epoch().count() % 60 != 0) std::abort();
      after = *n;
    }
  }
  auto again = CronSchedule::Parse(s->expression(), zone);
  if (!again.ok()) std::abort();
  return 0;
}
