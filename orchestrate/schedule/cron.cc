// Cron expression parser and next-run search for orchestrate/schedule/cron.h.
#include "orchestrate/schedule/cron.h"

#include <cctype>
#include <optional>

namespace barge::orchestrate {

namespace {

using namespace std::chrono;
using local_minutes = local_time<minutes>;

struct Field {
  const char* name;
  int min, max;
  const char* const* names;  // index 0 = value `min` (months) or 0 (days)
  int name_count;
};

constexpr const char* kMonthNames[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                       "jul", "aug", "sep", "oct", "nov", "dec"};
constexpr const char* kDayNames[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat"};
constexpr Field kFields[5] = {
    {"minute", 0, 59, nullptr, 0},
    {"hour", 0, 23, nullptr, 0},
    {"day of month", 1, 31, nullptr, 0},
    {"month", 1, 12, kMonthNames, 12},
    {"day of week", 0, 7, kDayNames, 7},
};

struct Token {
  std::string_view text;
  size_t pos;  // 0-based offset in the expression
};

class FieldParser {
 public:
  FieldParser(int index, Token token) : index_(index), f_(kFields[index]), tok_(token) {}

  // Fills `bits` (indexed by value) from the field; star = starts with '*'.
  Status Parse(std::vector<bool>& bits, bool& star) {
    bits.assign(f_.max + 1, false);
    star = !tok_.text.empty() && tok_.text[0] == '*';
    size_t i = 0;
    while (true) {
      BARGE_RETURN_IF_ERROR(Item(i, bits));
      if (i == tok_.text.size()) break;
      if (tok_.text[i] != ',') return Bad(i, "expected ',' or the end of the field");
      ++i;
      if (i == tok_.text.size()) return Bad(i, "a list cannot end with ','");
    }
    return OkStatus();
  }

 private:
  Error Bad(size_t i, const std::string& why) const {
    return Error::InvalidArgument("cron: " + std::string(f_.name) + " (field " + std::to_string(index_ + 1) +
                                  ") at position " + std::to_string(tok_.pos + i + 1) + ": " + why);
  }

  Result<int> Value(size_t& i) const {
    const std::string_view t = tok_.text;
    size_t start = i;
    if (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
      int v = 0;
      while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
        if (v > 1000) return Bad(start, "number too large");
        v = v * 10 + (t[i++] - '0');
      }
      if (v < f_.min || v > f_.max) {
        return Bad(start, std::to_string(v) + " is out of range " + std::to_string(f_.min) + "-" +
                              std::to_string(f_.max));
      }
      return v;
    }
    while (i < t.size() && std::isalpha(static_cast<unsigned char>(t[i]))) ++i;
    std::string word(t.substr(start, i - start));
    for (auto& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (word.empty()) return Bad(start, i < t.size() ? "unexpected '" + std::string(1, t[i]) + "'" : "expected a value");
    for (int n = 0; n < f_.name_count; ++n) {
      if (word == f_.names[n]) return f_.names == kMonthNames ? n + 1 : n;
    }
    return Bad(start, f_.name_count ? "unknown name '" + word + "'" : "names are not allowed here");
  }

  Status Item(size_t& i, std::vector<bool>& bits) {
    const std::string_view t = tok_.text;
    int lo, hi;
    bool range = false;
    size_t start = i;
    if (i < t.size() && t[i] == '*') {
      lo = f_.min;
      hi = f_.max == 7 ? 6 : f_.max;  // "*" in day of week is 0-6
      range = true;
      ++i;
    } else {
      BARGE_ASSIGN_OR_RETURN(lo, Value(i));
      hi = lo;
      if (i < t.size() && t[i] == '-') {
        ++i;
        size_t hi_pos = i;
        BARGE_ASSIGN_OR_RETURN(hi, Value(i));
        if (hi < lo) return Bad(hi_pos, "range " + std::to_string(lo) + "-" + std::to_string(hi) + " goes backwards");
        range = true;
      }
    }
    int step = 1;
    if (i < t.size() && t[i] == '/') {
      if (!range) return Bad(i, "a step needs '*' or a range before it");
      ++i;
      size_t step_pos = i;
      if (i >= t.size() || !std::isdigit(static_cast<unsigned char>(t[i]))) return Bad(i, "expected a step number");
      step = 0;
      while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) {
        if (step > 1000) return Bad(step_pos, "step too large");
        step = step * 10 + (t[i++] - '0');
      }
      if (step == 0) return Bad(step_pos, "step 0");
      if (step > f_.max) return Bad(step_pos, "step " + std::to_string(step) + " larger than the field's range");
    }
    (void)start;
    for (int v = lo; v <= hi; v += step) bits[v] = true;
    return OkStatus();
  }

  int index_;
  const Field& f_;
  Token tok_;
};

std::optional<std::string_view> Macro(std::string_view name) {
  static constexpr std::pair<std::string_view, std::string_view> kMacros[] = {
      {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
      {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
      {"@hourly", "0 * * * *"},
  };
  for (const auto& [k, v] : kMacros) {
    if (k == name) return v;
  }
  return std::nullopt;
}

constexpr unsigned kDaysIn[13] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};

}  // namespace

using std::chrono::local_seconds;
using local_minutes = std::chrono::local_time<std::chrono::minutes>;

Result<CronSchedule> CronSchedule::Parse(std::string_view expression, TimeZone zone) {
  CronSchedule s;
  s.expression_ = std::string(expression);
  s.zone_ = std::move(zone);
  std::vector<Token> tokens;
  for (size_t i = 0; i < expression.size();) {
    while (i < expression.size() && (expression[i] == ' ' || expression[i] == '\t')) ++i;
    if (i == expression.size()) break;
    size_t start = i;
    while (i < expression.size() && expression[i] != ' ' && expression[i] != '\t') ++i;
    tokens.push_back({expression.substr(start, i - start), start});
  }
  if (tokens.size() == 1 && tokens[0].text.starts_with('@')) {
    auto expanded = Macro(tokens[0].text);
    if (!expanded) {
      return Error::InvalidArgument("cron: unknown schedule '" + std::string(tokens[0].text) +
                                    "' at position " + std::to_string(tokens[0].pos + 1) +
                                    " (use @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly"
                                    " or 5 fields)");
    }
    auto parsed = Parse(*expanded, s.zone_);
    if (parsed.ok()) parsed->expression_ = std::string(expression);
    return parsed;
  }
  if (tokens.size() != 5) {
    return Error::InvalidArgument("cron: expected 5 fields (minute hour day-of-month month day-of-week) or an "
                                  "@name, got " + std::to_string(tokens.size()) + " in '" +
                                  std::string(expression) + "'");
  }
  std::vector<bool> bits[5];
  bool star[5];
  for (int f = 0; f < 5; ++f) BARGE_RETURN_IF_ERROR(FieldParser(f, tokens[f]).Parse(bits[f], star[f]));
  for (int v = 0; v < 60; ++v) s.minutes_[v] = bits[0][v];
  for (int v = 0; v < 24; ++v) s.hours_[v] = bits[1][v];
  for (int v = 1; v <= 31; ++v) s.days_of_month_[v] = bits[2][v];
  for (int v = 1; v <= 12; ++v) s.months_[v] = bits[3][v];
  for (int v = 0; v <= 7; ++v) {
    if (bits[4][v]) s.days_of_week_[v % 7] = true;
  }
  s.dom_star_ = star[2];
  s.dow_star_ = star[4];
  // A restricted day of month with an unrestricted day of week must occur
  // in some selected month ("0 0 30 2 *" never runs).
  if (!s.dom_star_ && s.dow_star_) {
    bool possible = false;
    for (unsigned m = 1; m <= 12; ++m) {
      for (unsigned d = 1; d <= kDaysIn[m]; ++d) possible |= s.months_[m] && s.days_of_month_[d];
    }
    if (!possible) {
      return Error::InvalidArgument("cron: '" + std::string(expression) +
                                    "' never runs: no selected month has the selected day of month");
    }
  }
  return s;
}

bool CronSchedule::DayMatches(year_month_day ymd) const {
  bool dom = days_of_month_[static_cast<unsigned>(ymd.day())];
  bool dow = days_of_week_[weekday{sys_days{ymd}}.c_encoding()];
  if (dom_star_ || dow_star_) return dom && dow;
  return dom || dow;
}

Result<sys_seconds> CronSchedule::Next(sys_seconds after) const {
  // Walk local wall times minute by minute, jumping over whole months,
  // days and hours that cannot match; map each matching local time back to
  // UTC. In a zone with offsets, start a day early: a local time before
  // the local time of `after` may still come after it (clocks set back).
  const bool fixed = zone_.is_utc();
  local_seconds start = zone_.ToLocal(after);
  local_minutes lm = floor<minutes>(start) + minutes{1};
  if (!fixed) lm -= hours{26};
  const local_minutes limit = lm + days{3660 + 2};
  while (lm < limit) {
    local_days d = floor<days>(lm);
    year_month_day ymd{sys_days{d.time_since_epoch()}};
    if (!ymd.ok() || static_cast<int>(ymd.year()) > 9990) break;
    if (!months_[static_cast<unsigned>(ymd.month())]) {
      year_month next = year_month{ymd.year(), ymd.month()} + months{1};
      lm = local_days{(sys_days{next / 1}).time_since_epoch()};
      continue;
    }
    if (!DayMatches(ymd)) {
      lm = d + days{1};
      continue;
    }
    hh_mm_ss<minutes> hm{lm - d};
    if (!hours_[hm.hours().count()]) {
      lm = floor<hours>(lm) + hours{1};
      continue;
    }
    if (!minutes_[hm.minutes().count()]) {
      lm += minutes{1};
      continue;
    }
    const local_seconds local{lm};
    std::optional<sys_seconds> t;
    if (fixed) {
      t = sys_seconds{local.time_since_epoch()} - zone_.OffsetAt(after);
    } else {
      TimeZone::LocalMapping m = zone_.FromLocal(local);
      if (!m.instants.empty()) t = m.instants.front();
      else t = m.gap_end;
    }
    if (t && *t > after) return *t;
    lm += minutes{1};
  }
  return Error::NotFound("cron: '" + expression_ + "' has no run within 10 years after " +
                         std::to_string(after.time_since_epoch().count()));
}

std::vector<sys_seconds> CronSchedule::NextN(sys_seconds after, size_t count) const {
  std::vector<sys_seconds> out;
  while (out.size() < count) {
    auto t = Next(after);
    if (!t.ok()) break;
    out.push_back(*t);
    after = *t;
  }
  return out;
}

}  // namespace barge::orchestrate
