// Durations and instants as std::chrono values, for the scheduler: thin
// forms of formats/units.h (the one parser of each). Text forms:
// "26h", "90m", "1d12h", "0"; RFC 3339 UTC timestamps.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "blockio/error.h"

namespace barge::orchestrate {

// A duration: one or more <integer><unit> parts, largest unit first, each
// unit at most once ("1d12h", "90m", "26h", "2w3d"); units w (7 days), d,
// h, m, s. A bare integer is seconds ("0", "90"). No spaces, signs or
// fractions.
// Returns: the duration; kInvalidArgument naming the text and the position
// of the first bad character, or when it exceeds 100 years.
Result<std::chrono::seconds> ParseDuration(std::string_view text);

// The shortest form ParseDuration reads back: "1d12h", "90s" -> "1m30s",
// "0s" for zero. Negative durations get a leading '-' (not parseable).
std::string FormatDuration(std::chrono::seconds duration);

// "2026-11-22T15:01:02Z".
std::string FormatRfc3339(std::chrono::sys_seconds t);

// RFC 3339 with 'Z' or a numeric offset ("+02:00"), optional fractional
// seconds (dropped). kInvalidArgument otherwise.
Result<std::chrono::sys_seconds> ParseRfc3339(std::string_view text);

// Now, to the second.
std::chrono::sys_seconds NowSeconds();

}  // namespace barge::orchestrate
