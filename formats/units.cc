// Sizes, durations and RFC 3339 times: parsing and printing.
#include "formats/units.h"

#include <chrono>
#include <cmath>
#include <cstdio>

namespace barge::formats {

namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Reads a run of digits as an unsigned number; false on none or overflow.
bool ReadNumber(std::string_view text, size_t& pos, uint64_t& value) {
  size_t start = pos;
  value = 0;
  while (pos < text.size() && IsDigit(text[pos])) {
    uint64_t digit = static_cast<uint64_t>(text[pos] - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
    ++pos;
  }
  return pos > start;
}

// Days since 1970-01-01 of a proleptic Gregorian date (month 1..12).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

unsigned DaysInMonth(int64_t y, unsigned m) {
  static const unsigned kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : kDays[m - 1];
}

Error BadTime(std::string_view text, const std::string& why) {
  return Error::InvalidArgument("not an RFC 3339 time ('" + std::string(text) + "'): " + why +
                                " (use e.g. 2026-11-24T06:05:49Z or 2026-11-24 01:05:49-05:00)");
}

// Exactly `n` digits at pos.
bool Fixed(std::string_view t, size_t& pos, size_t n, unsigned& out) {
  if (pos + n > t.size()) return false;
  out = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!IsDigit(t[pos + i])) return false;
    out = out * 10 + static_cast<unsigned>(t[pos + i] - '0');
  }
  pos += n;
  return true;
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.3g %s", v, kUnits[u]);
  return buf;
}

std::string HumanBytesExact(uint64_t bytes) {
  if (bytes < 1024) return HumanBytes(bytes);
  return HumanBytes(bytes) + " (" + std::to_string(bytes) + " bytes)";
}

std::string Hex(uint64_t value) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(value));
  return buf;
}

Result<uint64_t> ParseSize(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error::InvalidArgument("not a size: '" + std::string(text) + "' (" + why +
                                  "; use a whole number with an optional K, M, G, T or P)");
  };
  if (text.empty()) return bad("empty");
  size_t pos = 0;
  uint64_t value = 0;
  if (!ReadNumber(text, pos, value)) return bad(pos < text.size() && IsDigit(text[pos]) ? "too large" : "no number");
  std::string_view unit = text.substr(pos);
  int shift = -1;
  if (unit.empty() || unit == "b" || unit == "B") shift = 0;
  const char* names = "KMGTP";
  for (int i = 0; i < 5 && shift < 0; ++i) {
    char up = names[i], low = static_cast<char>(names[i] + ('a' - 'A'));
    if (unit.size() >= 1 && (unit[0] == up || unit[0] == low) &&
        (unit.size() == 1 || unit.substr(1) == "iB" || unit.substr(1) == "B")) {
      shift = 10 * (i + 1);
    }
  }
  if (shift < 0) return bad("unknown unit '" + std::string(unit) + "'");
  if (shift && value > (UINT64_MAX >> shift)) return bad("too large");
  return value << shift;
}

Result<int64_t> ParseDurationSeconds(std::string_view text) {
  auto bad = [&](const std::string& why) {
    return Error::InvalidArgument("not a duration: '" + std::string(text) + "' (" + why +
                                  "; use e.g. 90s, 15m, 26h, 7d, 1d12h or 0)");
  };
  if (text.empty()) return bad("empty");
  size_t pos = 0;
  uint64_t total = 0;
  int last_rank = 99;
  while (pos < text.size()) {
    uint64_t n = 0;
    if (!ReadNumber(text, pos, n)) return bad("expected a number at position " + std::to_string(pos + 1));
    uint64_t unit = 1;
    int rank = 0;
    if (pos == text.size()) {
      if (total != 0 || last_rank != 99) return bad("a unit is missing after the last number");
    } else {
      switch (text[pos]) {
        case 's': unit = 1; rank = 1; break;
        case 'm': unit = 60; rank = 2; break;
        case 'h': unit = 3600; rank = 3; break;
        case 'd': unit = 86400; rank = 4; break;
        case 'w': unit = 7 * 86400; rank = 5; break;
        default:
          return bad("unknown unit '" + std::string(1, text[pos]) + "' at position " + std::to_string(pos + 1));
      }
      ++pos;
      if (rank >= last_rank) {
        return bad("units must go from largest to smallest, each once (position " + std::to_string(pos) + ")");
      }
      last_rank = rank;
    }
    // A century is more than any schedule or retention needs, and keeps
    // every sum far from overflow.
    constexpr uint64_t kMax = 100ull * 366 * 86400;
    if (n > (kMax - total) / unit) return bad("longer than 100 years");
    total += n * unit;
  }
  return static_cast<int64_t>(total);
}

std::string FormatDurationSeconds(int64_t seconds) {
  if (seconds <= 0) return "0s";
  std::string out;
  const std::pair<int64_t, char> units[] = {{86400, 'd'}, {3600, 'h'}, {60, 'm'}, {1, 's'}};
  for (auto [size, name] : units) {
    if (seconds >= size) {
      out += std::to_string(seconds / size) + name;
      seconds %= size;
    }
  }
  return out;
}

std::string HumanSeconds(double s) {
  char buf[48];
  if (!(s >= 0) || !std::isfinite(s)) return "0 s";
  if (s < 999.5) {
    std::snprintf(buf, sizeof buf, "%.3g s", s);
  } else if (s < 3600) {
    auto total = static_cast<long long>(std::llround(s));
    std::snprintf(buf, sizeof buf, "%lld min %lld s", total / 60, total % 60);
  } else {
    auto minutes = static_cast<long long>(std::llround(s / 60));
    std::snprintf(buf, sizeof buf, "%lld h %02lld min", minutes / 60, minutes % 60);
  }
  return buf;
}

Result<Timestamp> ParseRfc3339(std::string_view t) {
  size_t pos = 0;
  unsigned year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  bool compact = t.size() >= 9 && t[8] == 'T' && t.find('-') == std::string_view::npos;
  if (!Fixed(t, pos, 4, year)) return BadTime(t, "expected a 4-digit year");
  if (!compact && (pos >= t.size() || t[pos++] != '-')) return BadTime(t, "expected '-' after the year");
  if (!Fixed(t, pos, 2, month)) return BadTime(t, "expected a 2-digit month");
  if (!compact && (pos >= t.size() || t[pos++] != '-')) return BadTime(t, "expected '-' after the month");
  if (!Fixed(t, pos, 2, day)) return BadTime(t, "expected a 2-digit day");
  if (pos >= t.size()) return BadTime(t, "a time of day and an offset are missing");
  char sep = t[pos++];
  if (sep != 'T' && sep != 't' && !(sep == ' ' && !compact)) {
    return BadTime(t, "expected 'T' or a space between date and time");
  }
  if (!Fixed(t, pos, 2, hour)) return BadTime(t, "expected a 2-digit hour");
  if (!compact && (pos >= t.size() || t[pos++] != ':')) return BadTime(t, "expected ':' after the hour");
  if (!Fixed(t, pos, 2, minute)) return BadTime(t, "expected 2-digit minutes");
  if (!compact && (pos >= t.size() || t[pos++] != ':')) return BadTime(t, "expected ':' after the minutes");
  if (!Fixed(t, pos, 2, second)) return BadTime(t, "expected 2-digit seconds");
  int32_t nanos = 0;
  if (!compact && pos < t.size() && t[pos] == '.') {
    ++pos;
    size_t digits = 0;
    while (pos < t.size() && IsDigit(t[pos])) {
      if (digits < 9) nanos = nanos * 10 + (t[pos] - '0');
      ++digits;
      ++pos;
    }
    if (digits == 0) return BadTime(t, "expected digits after '.'");
    for (size_t i = digits; i < 9; ++i) nanos *= 10;
  }
  if (month < 1 || month > 12) return BadTime(t, "month " + std::to_string(month) + " does not exist");
  if (day < 1 || day > DaysInMonth(year, month)) {
    return BadTime(t, "day " + std::to_string(day) + " does not exist in that month");
  }
  if (hour > 23) return BadTime(t, "hour " + std::to_string(hour) + " is out of range");
  if (minute > 59) return BadTime(t, "minute " + std::to_string(minute) + " is out of range");
  if (second > 60) return BadTime(t, "second " + std::to_string(second) + " is out of range");
  if (second == 60) second = 59;
  int64_t offset = 0;
  if (pos >= t.size()) return BadTime(t, "the UTC offset is missing (add Z for UTC, or e.g. -05:00)");
  if (t[pos] == 'Z' || t[pos] == 'z') {
    ++pos;
  } else if (!compact && (t[pos] == '+' || t[pos] == '-')) {
    int sign = t[pos++] == '-' ? -1 : 1;
    unsigned oh = 0, om = 0;
    if (!Fixed(t, pos, 2, oh) || pos >= t.size() || t[pos++] != ':' || !Fixed(t, pos, 2, om) ||
        oh > 23 || om > 59) {
      return BadTime(t, "the UTC offset must look like +HH:MM");
    }
    offset = sign * static_cast<int64_t>(oh * 3600 + om * 60);
  } else {
    return BadTime(t, "expected Z or an offset like -05:00 after the time");
  }
  if (pos != t.size()) return BadTime(t, "unexpected '" + std::string(t.substr(pos)) + "' after the time");
  Timestamp ts;
  ts.seconds = DaysFromCivil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset;
  ts.nanos = nanos;
  return ts;
}

std::string FormatRfc3339(Timestamp ts) {
  int64_t days = ts.seconds >= 0 ? ts.seconds / 86400 : -((-ts.seconds + 86399) / 86400);
  int64_t rem = ts.seconds - days * 86400;
  // civil_from_days
  int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t y = static_cast<int64_t>(yoe) + era * 400;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  const unsigned d = doy - (153 * mp + 2) / 5 + 1;
  const unsigned m = mp < 10 ? mp + 3 : mp - 9;
  y += m <= 2;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04lld-%02u-%02uT%02lld:%02lld:%02lld", static_cast<long long>(y), m,
                d, static_cast<long long>(rem / 3600), static_cast<long long>(rem % 3600 / 60),
                static_cast<long long>(rem % 60));
  std::string out = buf;
  if (ts.nanos > 0) {
    char frac[16];
    std::snprintf(frac, sizeof frac, ".%09d", ts.nanos);
    std::string f = frac;
    while (f.back() == '0') f.pop_back();
    out += f;
  }
  return out + "Z";
}

Timestamp Now() {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  Timestamp t;
  t.seconds = ns / 1000000000;
  t.nanos = static_cast<int32_t>(ns % 1000000000);
  return t;
}

}  // namespace barge::formats
