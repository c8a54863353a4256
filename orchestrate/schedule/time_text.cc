// Chrono-typed forms of formats/units.h's durations and RFC 3339 times,
// for the scheduler's arithmetic: one parser of each, not two.
#include "orchestrate/schedule/time_text.h"

#include "formats/units.h"

namespace barge::orchestrate {

Result<std::chrono::seconds> ParseDuration(std::string_view text) {
  BARGE_ASSIGN_OR_RETURN(int64_t seconds, formats::ParseDurationSeconds(text));
  return std::chrono::seconds(seconds);
}

std::string FormatDuration(std::chrono::seconds duration) {
  int64_t s = duration.count();
  if (s < 0) return "-" + formats::FormatDurationSeconds(-s);
  return formats::FormatDurationSeconds(s);
}

std::string FormatRfc3339(std::chrono::sys_seconds t) {
  return formats::FormatRfc3339({t.time_since_epoch().count(), 0});
}

Result<std::chrono::sys_seconds> ParseRfc3339(std::string_view text) {
  BARGE_ASSIGN_OR_RETURN(formats::Timestamp t, formats::ParseRfc3339(text));
  return std::chrono::sys_seconds(std::chrono::seconds(t.seconds));
}

std::chrono::sys_seconds NowSeconds() {
  return std::chrono::sys_seconds(std::chrono::seconds(formats::Now().seconds));
}

}  // namespace barge::orchestrate
