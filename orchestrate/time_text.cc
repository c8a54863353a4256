// Durations and RFC 3339 instants as text.
#include "orchestrate/time_text.h"

#include <cstdint>
#include <cstdio>

namespace barge::orchestrate {

namespace {

constexpr int64_t kMaxDurationSeconds = int64_t{100} * 366 * 86400;

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

Error BadDuration(std::string_view text, size_t pos, std::string_view why) {
  return Error::InvalidArgument("not a duration: '" + std::string(text) + "' at position " +
                                std::to_string(pos + 1) + ": " + std::string(why) +
                                " (e.g. 26h, 90m, 1d12h, 0)");
}

}  // namespace

Result<std::chrono::seconds> ParseDuration(std::string_view text) {
  if (text.empty()) return Error::InvalidArgument("empty duration (e.g. 26h, 90m, 1d12h, 0)");
  static constexpr struct {
    char unit;
    int64_t seconds;
  } kUnits[] = {{'w', 7 * 86400}, {'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};
  int64_t total = 0;
  size_t next_unit = 0;  // units must come largest first, each once
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    int64_t value = 0;
    while (pos < text.size() && IsDigit(text[pos])) {
      if (value > kMaxDurationSeconds) return BadDuration(text, start, "too large (over 100 years)");
      value = value * 10 + (text[pos] - '0');
      ++pos;
    }
    if (pos == start) return BadDuration(text, pos, "expected a number");
    if (pos == text.size()) {
      if (start != 0) return BadDuration(text, pos, "a number needs a unit after another part");
      total = value;  // a bare integer: seconds
      break;
    }
    size_t u = next_unit;
    while (u < std::size(kUnits) && kUnits[u].unit != text[pos]) ++u;
    if (u == std::size(kUnits)) {
      bool known = false;
      for (const auto& k : kUnits) known |= k.unit == text[pos];
      return BadDuration(text, pos,
                         known ? "units must go from largest to smallest, each once"
                               : "unknown unit '" + std::string(1, text[pos]) + "' (use w, d, h, m, s)");
    }
    if (value > kMaxDurationSeconds / kUnits[u].seconds) return BadDuration(text, start, "too large (over 100 years)");
    total += value * kUnits[u].seconds;
    if (total > kMaxDurationSeconds) return BadDuration(text, start, "too large (over 100 years)");
    next_unit = u + 1;
    ++pos;
  }
  if (total > kMaxDurationSeconds) return BadDuration(text, 0, "too large (over 100 years)");
  return std::chrono::seconds(total);
}

std::string FormatDuration(std::chrono::seconds duration) {
  int64_t s = duration.count();
  if (s == 0) return "0s";
  std::string out;
  if (s < 0) {
    out = "-";
    s = -s;
  }
  static constexpr struct {
    char unit;
    int64_t seconds;
  } kUnits[] = {{'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}};
  for (const auto& u : kUnits) {
    if (s >= u.seconds) {
      out += std::to_string(s / u.seconds) + u.unit;
      s %= u.seconds;
    }
  }
  return out;
}

std::string FormatRfc3339(std::chrono::sys_seconds t) {
  using namespace std::chrono;
  auto day = floor<days>(t);
  year_month_day ymd{day};
  hh_mm_ss<seconds> hms{t - day};
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02dZ", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                static_cast<int>(hms.hours().count()), static_cast<int>(hms.minutes().count()),
                static_cast<int>(hms.seconds().count()));
  return buf;
}

Result<std::chrono::sys_seconds> ParseRfc3339(std::string_view text) {
  using namespace std::chrono;
  auto bad = [&] {
    return Error::InvalidArgument("not an RFC 3339 time: '" + std::string(text) +
                                  "' (e.g. 2026-11-22T15:01:02Z)");
  };
  auto num = [&](size_t pos, size_t len, int& out) {
    if (pos + len > text.size()) return false;
    out = 0;
    for (size_t i = pos; i < pos + len; ++i) {
      if (!IsDigit(text[i])) return false;
      out = out * 10 + (text[i] - '0');
    }
    return true;
  };
  int y, mo, d, h, mi, s;
  if (text.size() < 20 || !num(0, 4, y) || text[4] != '-' || !num(5, 2, mo) || text[7] != '-' ||
      !num(8, 2, d) || (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || !num(11, 2, h) ||
      text[13] != ':' || !num(14, 2, mi) || text[16] != ':' || !num(17, 2, s)) {
    return bad();
  }
  size_t pos = 19;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    size_t digits = pos;
    while (pos < text.size() && IsDigit(text[pos])) ++pos;
    if (pos == digits) return bad();
  }
  int offset_seconds = 0;
  if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    ++pos;
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    int oh, om;
    if (!num(pos + 1, 2, oh) || pos + 3 >= text.size() || text[pos + 3] != ':' || !num(pos + 4, 2, om) ||
        oh > 23 || om > 59) {
      return bad();
    }
    offset_seconds = (oh * 3600 + om * 60) * (text[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return bad();
  }
  if (pos != text.size()) return bad();
  year_month_day ymd{year{y}, month{static_cast<unsigned>(mo)}, day{static_cast<unsigned>(d)}};
  if (!ymd.ok() || h > 23 || mi > 59 || s > 60) return bad();
  // A leap second (":60") is read as the next second.
  return sys_days{ymd} + hours{h} + minutes{mi} + seconds{s} - seconds{offset_seconds};
}

std::chrono::sys_seconds NowSeconds() {
  return std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now());
}

}  // namespace barge::orchestrate
