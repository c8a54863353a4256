// TZif (RFC 8536) and POSIX TZ rule reader for orchestrate/schedule/time_zone.h.
#include "orchestrate/schedule/time_zone.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace barge::orchestrate {

using std::chrono::days;
using std::chrono::local_seconds;
using std::chrono::seconds;
using std::chrono::sys_days;
using std::chrono::sys_seconds;

// A POSIX TZ rule: standard offset, and optionally a DST offset with the
// dates DST starts and ends each year.
struct TimeZone::Rule {
  struct Date {
    char kind = 'M';  // 'J': Julian day 1..365 without Feb 29; 'n': 0..365; 'M': month.week.day
    int n = 0;
    int month = 0, week = 0, weekday = 0;
    int32_t time = 2 * 3600;  // local seconds after midnight (may be negative or > 24h)
  };
  int32_t std_off = 0;  // seconds east of UTC
  bool has_dst = false;
  int32_t dst_off = 0;
  Date start, end;

  sys_days DayOf(int y, const Date& d) const {
    using namespace std::chrono;
    const bool leap = year{y}.is_leap();
    if (d.kind == 'J') return sys_days{year{y} / January / 1} + days{d.n - 1 + (leap && d.n >= 60 ? 1 : 0)};
    if (d.kind == 'n') return sys_days{year{y} / January / 1} + days{d.n};
    sys_days first{year{y} / month{static_cast<unsigned>(d.month)} / 1};
    unsigned first_wd = weekday{first}.c_encoding();
    sys_days day = first + days{(d.weekday - static_cast<int>(first_wd) + 7) % 7 + (d.week - 1) * 7};
    sys_days next_month{(year_month{year{y}, month{static_cast<unsigned>(d.month)}} + months{1}) / 1};
    while (day >= next_month) day -= days{7};
    return day;
  }

  int32_t OffsetAt(sys_seconds t) const {
    using namespace std::chrono;
    if (!has_dst) return std_off;
    int y = static_cast<int>(year_month_day{floor<days>(t + seconds{std_off})}.year());
    // The transitions of the years around t; the last one at or before t wins.
    std::pair<sys_seconds, bool> events[6];
    int n = 0;
    for (int yy = y - 1; yy <= y + 1; ++yy) {
      events[n++] = {sys_seconds{DayOf(yy, start)} + seconds{start.time - std_off}, true};
      events[n++] = {sys_seconds{DayOf(yy, end)} + seconds{end.time - dst_off}, false};
    }
    std::sort(events, events + n, [](const auto& a, const auto& b) { return a.first < b.first; });
    bool dst = !events[0].second;  // before the first event: the state it ends
    for (int i = 0; i < n && events[i].first <= t; ++i) dst = events[i].second;
    return dst ? dst_off : std_off;
  }
};

namespace {

class RuleParser {
 public:
  explicit RuleParser(std::string_view s) : s_(s) {}

  bool Parse(TimeZone::Rule& r) {
    if (!Name() || !Offset(r.std_off, 24)) return false;
    r.std_off = -r.std_off;  // POSIX offsets are west of Greenwich
    if (pos_ == s_.size()) return true;
    r.has_dst = true;
    if (!Name()) return false;
    r.dst_off = r.std_off + 3600;
    if (pos_ < s_.size() && s_[pos_] != ',') {
      if (!Offset(r.dst_off, 24)) return false;
      r.dst_off = -r.dst_off;
    }
    if (pos_ == s_.size()) {  // no dates: the US rules POSIX names as default
      r.start = {'M', 0, 3, 2, 0, 7200};
      r.end = {'M', 0, 11, 1, 0, 7200};
      return true;
    }
    if (!Eat(',') || !Date(r.start) || !Eat(',') || !Date(r.end)) return false;
    return pos_ == s_.size();
  }

 private:
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool Name() {
    if (Eat('<')) {
      size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] != '>') {
        char c = s_[pos_];
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-') return false;
        ++pos_;
      }
      return pos_ - start >= 3 && Eat('>');
    }
    size_t start = pos_;
    while (pos_ < s_.size() && std::isalpha(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    return pos_ - start >= 3;
  }
  bool Number(int& out, int max) {
    size_t start = pos_;
    out = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_])) && pos_ - start < 4) {
      out = out * 10 + (s_[pos_++] - '0');
    }
    return pos_ > start && out <= max;
  }
  // [+-]hh[:mm[:ss]] in seconds.
  bool Offset(int32_t& out, int max_hours) {
    int sign = 1;
    if (Eat('-')) sign = -1;
    else Eat('+');
    int h, m = 0, sec = 0;
    if (!Number(h, max_hours)) return false;
    if (Eat(':')) {
      if (!Number(m, 59)) return false;
      if (Eat(':') && !Number(sec, 59)) return false;
    }
    out = sign * (h * 3600 + m * 60 + sec);
    return true;
  }
  bool Date(TimeZone::Rule::Date& d) {
    if (Eat('J')) {
      d.kind = 'J';
      if (!Number(d.n, 365) || d.n < 1) return false;
    } else if (Eat('M')) {
      d.kind = 'M';
      if (!Number(d.month, 12) || d.month < 1 || !Eat('.') || !Number(d.week, 5) || d.week < 1 || !Eat('.') ||
          !Number(d.weekday, 6)) {
        return false;
      }
    } else {
      d.kind = 'n';
      if (!Number(d.n, 365)) return false;
    }
    d.time = 7200;
    if (Eat('/')) return Offset(d.time, 167);
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view b) : b_(b) {}
  bool Has(uint64_t n) const { return n <= b_.size() - pos_; }
  size_t pos() const { return pos_; }
  void Skip(size_t n) { pos_ += n; }
  uint8_t U8() { return static_cast<uint8_t>(b_[pos_++]); }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = (v << 8) | U8();
    return v;
  }
  int64_t I64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | U8();
    return static_cast<int64_t>(v);
  }
  std::string_view Rest() const { return b_.substr(pos_); }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

struct TzifHeader {
  char version = 0;
  uint32_t isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt;
  uint64_t DataBytes(int time_size) const {
    return uint64_t{timecnt} * time_size + timecnt + uint64_t{typecnt} * 6 + charcnt +
           uint64_t{leapcnt} * (time_size + 4) + isstdcnt + isutcnt;
  }
};

Result<TzifHeader> ReadHeader(ByteReader& r, const std::string& name) {
  auto bad = [&](const std::string& why) { return Error::Corruption("time zone " + name + ": " + why); };
  if (!r.Has(44) || r.Rest().substr(0, 4) != "TZif") return bad("not a TZif file");
  r.Skip(4);
  TzifHeader h;
  h.version = static_cast<char>(r.U8());
  if (h.version != 0 && (h.version < '2' || h.version > '4')) return bad("unknown TZif version");
  r.Skip(15);
  h.isutcnt = r.U32();
  h.isstdcnt = r.U32();
  h.leapcnt = r.U32();
  h.timecnt = r.U32();
  h.typecnt = r.U32();
  h.charcnt = r.U32();
  if (h.typecnt == 0 || h.typecnt > 256) return bad("bad number of local time types");
  if ((h.isutcnt != 0 && h.isutcnt != h.typecnt) || (h.isstdcnt != 0 && h.isstdcnt != h.typecnt)) {
    return bad("bad indicator counts");
  }
  return h;
}

}  // namespace

TimeZone TimeZone::Utc() {
  TimeZone z;
  z.name_ = "UTC";
  z.types_.push_back(Type{0, false});
  return z;
}

Result<TimeZone> TimeZone::FromPosixRule(std::string name, std::string_view rule) {
  Rule r;
  if (!RuleParser(rule).Parse(r)) {
    return Error::InvalidArgument("time zone " + name + ": bad POSIX TZ rule '" + std::string(rule) + "'");
  }
  TimeZone z;
  z.name_ = std::move(name);
  z.types_.push_back(Type{r.std_off, false});
  z.rule_ = std::make_shared<const Rule>(r);
  return z;
}

Result<TimeZone> TimeZone::FromTzif(std::string name, std::string_view bytes) {
  auto bad = [&](const std::string& why) { return Error::Corruption("time zone " + name + ": " + why); };
  ByteReader r(bytes);
  BARGE_ASSIGN_OR_RETURN(TzifHeader h, ReadHeader(r, name));
  int time_size = 4;
  if (h.version >= '2') {
    // Skip the 32-bit block; the second header describes the 64-bit one.
    if (!r.Has(h.DataBytes(4))) return bad("truncated");
    r.Skip(h.DataBytes(4));
    BARGE_ASSIGN_OR_RETURN(h, ReadHeader(r, name));
    time_size = 8;
  }
  if (!r.Has(h.DataBytes(time_size))) return bad("truncated");
  TimeZone z;
  z.name_ = std::move(name);
  z.transitions_.reserve(h.timecnt);
  for (uint32_t i = 0; i < h.timecnt; ++i) {
    int64_t t = time_size == 8 ? r.I64() : static_cast<int32_t>(r.U32());
    if (!z.transitions_.empty() && t <= z.transitions_.back()) return bad("transition times not ascending");
    z.transitions_.push_back(t);
  }
  for (uint32_t i = 0; i < h.timecnt; ++i) {
    uint8_t type = r.U8();
    if (type >= h.typecnt) return bad("transition names a missing local time type");
    z.transition_type_.push_back(type);
  }
  for (uint32_t i = 0; i < h.typecnt; ++i) {
    int32_t utoff = static_cast<int32_t>(r.U32());
    uint8_t isdst = r.U8();
    uint8_t desig = r.U8();
    if (utoff <= -89999 || utoff >= 93600 || isdst > 1 || desig >= std::max<uint32_t>(h.charcnt, 1)) {
      return bad("bad local time type");
    }
    z.types_.push_back(Type{utoff, isdst == 1});
  }
  r.Skip(h.charcnt + uint64_t{h.leapcnt} * (time_size + 4) + h.isstdcnt + h.isutcnt);
  if (time_size == 8) {
    std::string_view rest = r.Rest();
    if (rest.empty() || rest[0] != '\n') return bad("missing footer");
    size_t end = rest.find('\n', 1);
    if (end == std::string_view::npos) return bad("unterminated footer");
    std::string_view footer = rest.substr(1, end - 1);
    if (!footer.empty()) {
      Rule rule;
      if (!RuleParser(footer).Parse(rule)) return bad("bad POSIX TZ footer '" + std::string(footer) + "'");
      z.rule_ = std::make_shared<const Rule>(rule);
    }
  }
  return z;
}

Result<TimeZone> TimeZone::Load(Env& env, std::string_view name) {
  if (name.empty() || name == "UTC" || name == "Etc/UTC" || name == "Z") return Utc();
  std::string n(name);
  bool ok = n.front() != '/' && n.back() != '/';
  size_t start = 0;
  while (ok && start <= n.size()) {
    size_t slash = n.find('/', start);
    std::string_view part = std::string_view(n).substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    ok = !part.empty() && part != "." && part != "..";
    for (char c : part) {
      ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '+');
    }
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (!ok) return Error::InvalidArgument("not a time zone name: '" + n + "' (e.g. Europe/Berlin, UTC)");
  const char* dir = std::getenv("TZDIR");
  std::string path = std::string(dir != nullptr && *dir != '\0' ? dir : "/usr/share/zoneinfo") + "/" + n;
  auto bytes = env.ReadFile(path, 1 << 20);
  if (!bytes.ok()) {
    if (bytes.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("unknown time zone '" + n + "' (no " + path + ")");
    }
    return std::move(bytes).error().Wrap("time zone " + n);
  }
  return FromTzif(n, *bytes);
}

seconds TimeZone::OffsetAt(sys_seconds t) const {
  const int64_t s = t.time_since_epoch().count();
  if (transitions_.empty() || s < transitions_.front()) {
    if (transitions_.empty() && rule_) return seconds{rule_->OffsetAt(t)};
    return seconds{types_[0].utoff};
  }
  if (s >= transitions_.back() && rule_) return seconds{rule_->OffsetAt(t)};
  auto it = std::upper_bound(transitions_.begin(), transitions_.end(), s);
  size_t i = static_cast<size_t>(it - transitions_.begin()) - 1;
  return seconds{types_[transition_type_[i]].utoff};
}

TimeZone::LocalMapping TimeZone::FromLocal(local_seconds local) const {
  LocalMapping m;
  const sys_seconds as_utc{local.time_since_epoch()};
  // Offsets change by well under a day around any instant; try the ones in
  // force a day and a half before and after.
  seconds offsets[3] = {OffsetAt(as_utc - seconds{129600}), OffsetAt(as_utc), OffsetAt(as_utc + seconds{129600})};
  for (seconds o : offsets) {
    sys_seconds t = as_utc - o;
    if (OffsetAt(t) == o && std::find(m.instants.begin(), m.instants.end(), t) == m.instants.end()) {
      m.instants.push_back(t);
    }
  }
  std::sort(m.instants.begin(), m.instants.end());
  if (!m.instants.empty()) return m;
  // A gap: the offset jumps from a smaller to a larger one inside
  // [local - largest, local - smallest]; find the jump.
  seconds lo_off = *std::max_element(std::begin(offsets), std::end(offsets));
  seconds hi_off = *std::min_element(std::begin(offsets), std::end(offsets));
  int64_t lo = (as_utc - lo_off).time_since_epoch().count();
  int64_t hi = (as_utc - hi_off).time_since_epoch().count();
  const seconds before = OffsetAt(sys_seconds{seconds{lo}});
  while (lo < hi) {  // first instant in (lo, hi] whose offset differs from `before`
    int64_t mid = lo + (hi - lo) / 2;
    if (OffsetAt(sys_seconds{seconds{mid}}) == before) lo = mid + 1;
    else hi = mid;
  }
  m.gap_end = sys_seconds{seconds{hi}};
  return m;
}

}  // namespace barge::orchestrate
