// Sizes, durations and times as users type and read them: the one parser
// and printer of each, shared by every command, message and file format.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "blockio/error.h"

namespace barge::formats {

// "1.5 GiB"-style, 3 significant digits ("512 B", "64 KiB", "1.18 MiB").
std::string HumanBytes(uint64_t bytes);
// "1.18 MiB (1234567 bytes)": for messages where the exact count matters.
std::string HumanBytesExact(uint64_t bytes);

// "0x1f0000": offsets, table entries and feature bits in messages, as
// qemu-img prints them.
std::string Hex(uint64_t value);

// "4G", "512M", "65536", "64k", "1KiB" (binary units; B/K/M/G/T/P, optional
// "iB"). kInvalidArgument naming the text otherwise (empty, junk, a
// fraction, a negative number, overflow).
Result<uint64_t> ParseSize(std::string_view text);

// Durations: "0", "90s", "15m", "26h", "7d", "1w", "1d12h30m" (units w, d,
// h, m, s, largest first, each once; whole numbers; a bare number is
// seconds; at most 100 years). kInvalidArgument naming the text and the
// position of the first bad character otherwise.
Result<int64_t> ParseDurationSeconds(std::string_view text);
// "1d12h", "15m", "0s": the shortest form ParseDurationSeconds reads back.
std::string FormatDurationSeconds(int64_t seconds);

// Elapsed time for people, 3 significant digits: "0.0123 s", "1.23 s",
// "12.3 s", "123 s", "20 min 34 s", "2 h 05 min".
std::string HumanSeconds(double seconds);

// A point in time: seconds since the Unix epoch (UTC) and nanoseconds.
struct Timestamp {
  int64_t seconds = 0;
  int32_t nanos = 0;  // 0..999999999
  friend auto operator<=>(const Timestamp&, const Timestamp&) = default;
};

// RFC 3339 date-time: "2026-11-24T01:05:49-05:00", "...Z", an optional
// fraction ("...:49.25Z"), 'T', 't' or one space between date and time, 'Z'
// or 'z'. Also the compact UTC form of backup ids, "20261124T060549Z".
// Everything else (trailing junk, a missing offset, a month 13, Feb 30,
// hour 24) is kInvalidArgument saying what is wrong. A leap second (:60)
// is read as :59.
Result<Timestamp> ParseRfc3339(std::string_view text);
// UTC, "2026-11-24T06:05:49Z" (with ".123456789" trimmed of trailing
// zeros when nanos is not zero).
std::string FormatRfc3339(Timestamp t);
// The current time, UTC.
Timestamp Now();

}  // namespace barge::formats
