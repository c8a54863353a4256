// Cron schedules: standard 5-field expressions and @names, in UTC or a TZ
// database zone, with the next run after a given instant.
#pragma once

#include <bitset>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/schedule/time_zone.h"

namespace barge::orchestrate {

// A parsed schedule. Copyable; safe for concurrent use.
//
// Syntax (as Vixie cron): "MIN HOUR DOM MONTH DOW", fields separated by
// spaces or tabs; each field a comma list of `*`, N, N-M, `*`/S or N-M/S;
// minute 0-59, hour 0-23, day of month 1-31, month 1-12 or JAN-DEC, day of
// week 0-7 (0 and 7 Sunday) or SUN-SAT (names case-insensitive, also in
// ranges). When both day fields are restricted, a day matches if EITHER
// matches (Vixie's rule; a field starting with `*`, "*/2" included, counts
// as unrestricted). Also @yearly (= @annually), @monthly, @weekly, @daily
// (= @midnight), @hourly. @reboot is refused.
class CronSchedule {
 public:
  // Parses `expression`, evaluated in `zone` (UTC by default).
  // Returns: the schedule; kInvalidArgument naming the field and the
  // 1-based character position ("day of month (field 3) at position 7: 32
  // is out of range 1-31"), or saying the expression can never match
  // ("0 0 30 2 *").
  static Result<CronSchedule> Parse(std::string_view expression, TimeZone zone = TimeZone::Utc());

  // The first instant strictly after `after` whose local time (in the zone)
  // matches, at a whole minute. In a zone with daylight saving time, a
  // local time that occurs twice (clocks set back) runs once, at its first
  // occurrence; local times skipped by a gap (clocks set forward) run once
  // when the gap ends.
  // Returns: the instant; kNotFound when nothing matches within 10 years
  // (cannot happen for an expression Parse accepted, except for dates
  // past year 9990).
  Result<std::chrono::sys_seconds> Next(std::chrono::sys_seconds after) const;

  // The next `count` run times after `after`, ascending (fewer if Next
  // fails).
  std::vector<std::chrono::sys_seconds> NextN(std::chrono::sys_seconds after, size_t count) const;

  const std::string& expression() const { return expression_; }
  const TimeZone& zone() const { return zone_; }

 private:
  bool DayMatches(std::chrono::year_month_day ymd) const;

  std::string expression_;
  TimeZone zone_ = TimeZone::Utc();
  std::bitset<60> minutes_;
  std::bitset<24> hours_;
  std::bitset<32> days_of_month_;  // 1..31
  std::bitset<13> months_;         // 1..12
  std::bitset<7> days_of_week_;    // 0..6, Sunday = 0
  bool dom_star_ = false;
  bool dow_star_ = false;
};

}  // namespace barge::orchestrate
