// Time zones of the TZ database, read from the system's zoneinfo files
// (TZif, RFC 8536) without touching the process's TZ or localtime: the
// conversions cron schedules need (UTC <-> local wall time). libstdc++ 12
// (Debian 12) has no std::chrono::tzdb, hence this small reader; Debian's
// date library (libdate-tz, 3.0.1) was measured and is not used: wrong
// offsets after 2037, $TZDIR ignored (docs/dependencies.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

// An immutable zone; copyable; safe for concurrent use.
class TimeZone {
 public:
  // UTC (no file needed).
  static TimeZone Utc();

  // Loads a zone by TZ database name ("Europe/Berlin", "UTC") from $TZDIR,
  // else /usr/share/zoneinfo, through `env`. "" , "UTC", "Etc/UTC" and "Z"
  // give Utc() without reading a file.
  // Returns: the zone; kInvalidArgument for a name that is not a plain
  // relative path (empty parts, "..", leading '/'); kNotFound when no such
  // zone file exists; kCorruption for a file that is not valid TZif.
  static Result<TimeZone> Load(Env& env, std::string_view name);

  // Parses TZif bytes (versions 1 to 4; the 64-bit data of version 2+ and
  // its POSIX TZ footer for instants after the last transition). Leap
  // second records are ignored. kCorruption naming what is wrong.
  static Result<TimeZone> FromTzif(std::string name, std::string_view bytes);

  // A zone from a POSIX TZ rule string ("CET-1CEST,M3.5.0,M10.5.0/3").
  // kInvalidArgument when it does not parse.
  static Result<TimeZone> FromPosixRule(std::string name, std::string_view rule);

  const std::string& name() const { return name_; }
  bool is_utc() const { return transitions_.empty() && !rule_ && types_.size() == 1 && types_[0].utoff == 0; }

  // The offset from UTC in effect at `t` (local = t + offset).
  std::chrono::seconds OffsetAt(std::chrono::sys_seconds t) const;
  std::chrono::local_seconds ToLocal(std::chrono::sys_seconds t) const {
    return std::chrono::local_seconds{t.time_since_epoch() + OffsetAt(t)};
  }

  // Where a local wall time falls:
  //   instants: the UTC instants showing `local`, ascending: one normally,
  //             two in a repeated hour (clocks set back), none in a gap;
  //   gap_end:  for a gap (clocks set forward), the instant the gap ends.
  struct LocalMapping {
    std::vector<std::chrono::sys_seconds> instants;
    std::optional<std::chrono::sys_seconds> gap_end;
  };
  LocalMapping FromLocal(std::chrono::local_seconds local) const;

  // Internal representation (public for the parser's helpers).
  struct Type {
    int32_t utoff = 0;  // seconds east of UTC
    bool is_dst = false;
  };
  struct Rule;  // a POSIX TZ rule (time_zone.cc)

 private:
  std::string name_;
  std::vector<int64_t> transitions_;     // UTC seconds, strictly increasing
  std::vector<uint8_t> transition_type_;  // index into types_
  std::vector<Type> types_;               // at least one; types_[0] before the first transition
  std::shared_ptr<const Rule> rule_;      // after the last transition, if any
};

}  // namespace barge::orchestrate
