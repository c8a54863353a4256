// Cron parsing and next-run tables (UTC edges, month ends, Feb 29, the day
// field OR rule, steps, ranges, names, @names), time zones against glibc,
// and durations.
#include "orchestrate/schedule/cron.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>

#include "orchestrate/schedule/time_text.h"
#include "orchestrate/schedule/time_zone.h"

namespace barge::orchestrate {
namespace {

using std::chrono::sys_seconds;

sys_seconds T(const char* rfc3339) {
  auto t = ParseRfc3339(rfc3339);
  EXPECT_TRUE(t.ok()) << rfc3339;
  return t.ok() ? *t : sys_seconds{};
}

std::string NextAfter(const std::string& expr, const char* after, const TimeZone& zone = TimeZone::Utc()) {
  auto s = CronSchedule::Parse(expr, zone);
  if (!s.ok()) return "parse error: " + s.error().message();
  auto n = s->Next(T(after));
  if (!n.ok()) return "none";
  return FormatRfc3339(*n);
}

struct NextCase {
  const char* expr;
  const char* after;
  const char* want;
};

TEST(CronTest, NextRunTable) {
  const NextCase cases[] = {
      // every minute; strictly after, at whole minutes
      {"* * * * *", "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"},
      {"* * * * *", "2026-01-01T00:00:30Z", "2026-01-01T00:01:00Z"},
      {"0 2 * * *", "2026-03-10T01:59:59Z", "2026-03-10T02:00:00Z"},
      {"0 2 * * *", "2026-03-10T02:00:00Z", "2026-03-11T02:00:00Z"},
      // year end and month ends
      {"59 23 31 12 *", "2026-06-01T00:00:00Z", "2026-12-31T23:59:00Z"},
      {"0 0 1 * *", "2026-12-31T23:59:00Z", "2027-01-01T00:00:00Z"},
      {"0 0 31 * *", "2026-04-01T00:00:00Z", "2026-05-31T00:00:00Z"},  // April has no 31st
      {"0 0 30 * *", "2026-01-30T00:00:00Z", "2026-03-30T00:00:00Z"},  // February has no 30th
      // Feb 29: only in leap years
      {"0 12 29 2 *", "2026-01-01T00:00:00Z", "2028-02-29T12:00:00Z"},
      {"0 12 29 2 *", "2028-02-29T12:00:00Z", "2032-02-29T12:00:00Z"},
      {"0 0 29 2 *", "2096-03-01T00:00:00Z", "2104-02-29T00:00:00Z"},  // 2100 is not a leap year
      // day of week; 7 is Sunday too; names
      {"0 9 * * 1", "2026-11-22T00:00:00Z", "2026-11-23T09:00:00Z"},  // 2026-11-22 is a Sunday
      {"0 9 * * 7", "2026-11-22T09:00:00Z", "2026-11-29T09:00:00Z"},
      {"0 9 * * sun", "2026-11-21T00:00:00Z", "2026-11-22T09:00:00Z"},
      {"0 9 * * MON-FRI", "2026-11-20T09:00:00Z", "2026-11-23T09:00:00Z"},  // Friday -> Monday
      {"0 9 * * sat,SUN", "2026-11-20T09:00:00Z", "2026-11-21T09:00:00Z"},
      // both day fields restricted: either matches (Vixie)
      {"0 0 13 * 5", "2026-11-01T00:00:00Z", "2026-11-06T00:00:00Z"},  // Friday the 6th comes first
      {"0 0 13 * 5", "2026-11-12T00:00:00Z", "2026-11-13T00:00:00Z"},  // the 13th (also a Friday)
      {"0 0 1 * 1", "2026-11-24T00:00:00Z", "2026-11-30T00:00:00Z"},   // Monday before the 1st
      // one restricted, the other '*': both must match
      {"0 0 * 11 1", "2026-11-24T00:00:00Z", "2026-11-30T00:00:00Z"},
      // "*/2" in day of week counts as unrestricted: AND with the day of month
      {"0 0 1 * */2", "2026-11-02T00:00:00Z", "2026-12-01T00:00:00Z"},  // Dec 1 is a Tuesday (2)
      {"0 0 1 * */2", "2026-12-01T00:00:00Z", "2027-04-01T00:00:00Z"},  // Jan 1 Fri, Feb/Mar 1 Mon, Apr 1 Thu (4)

      // steps and ranges
      {"*/15 * * * *", "2026-01-01T00:07:00Z", "2026-01-01T00:15:00Z"},
      {"*/15 * * * *", "2026-01-01T00:45:00Z", "2026-01-01T01:00:00Z"},
      {"10-20/5 * * * *", "2026-01-01T00:16:00Z", "2026-01-01T00:20:00Z"},
      {"10-20/5 * * * *", "2026-01-01T00:20:00Z", "2026-01-01T01:10:00Z"},
      {"0 8-18/4 * * *", "2026-01-01T12:00:00Z", "2026-01-01T16:00:00Z"},
      {"0 0 * jan-mar/2 *", "2026-01-31T00:00:00Z", "2026-03-01T00:00:00Z"},
      {"5,10,55 3 * * *", "2026-01-01T03:10:00Z", "2026-01-01T03:55:00Z"},
      {"0 0 1 feb,AUG *", "2026-03-01T00:00:00Z", "2026-08-01T00:00:00Z"},
      // every @name
      {"@yearly", "2026-05-05T00:00:00Z", "2027-01-01T00:00:00Z"},
      {"@annually", "2026-12-31T23:59:59Z", "2027-01-01T00:00:00Z"},
      {"@monthly", "2026-02-28T23:59:00Z", "2026-03-01T00:00:00Z"},
      {"@weekly", "2026-11-23T00:00:00Z", "2026-11-29T00:00:00Z"},
      {"@daily", "2026-02-28T12:00:00Z", "2026-03-01T00:00:00Z"},
      {"@daily", "2028-02-28T12:00:00Z", "2028-02-29T00:00:00Z"},
      {"@midnight", "2026-11-22T00:00:00Z", "2026-11-23T00:00:00Z"},
      {"@hourly", "2026-11-22T23:30:00Z", "2026-11-23T00:00:00Z"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(NextAfter(c.expr, c.after), c.want) << c.expr << " after " << c.after;
  }
}

TEST(CronTest, NextN) {
  auto s = CronSchedule::Parse("0 2 * * *");
  ASSERT_TRUE(s.ok());
  auto runs = s->NextN(T("2026-02-27T12:00:00Z"), 3);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(FormatRfc3339(runs[0]), "2026-02-28T02:00:00Z");
  EXPECT_EQ(FormatRfc3339(runs[1]), "2026-03-01T02:00:00Z");
  EXPECT_EQ(FormatRfc3339(runs[2]), "2026-03-02T02:00:00Z");
}

TEST(CronTest, ErrorsNameFieldAndPosition) {
  struct Bad {
    const char* expr;
    const char* needle;
  } cases[] = {
      {"", "expected 5 fields"},
      {"* * * *", "got 4"},
      {"* * * * * *", "got 6"},
      {"60 * * * *", "minute (field 1) at position 1: 60 is out of range 0-59"},
      {"0 24 * * *", "hour (field 2) at position 3: 24 is out of range 0-23"},
      {"0 0 32 * *", "day of month (field 3) at position 5: 32 is out of range 1-31"},
      {"0 0 0 * *", "day of month (field 3) at position 5: 0 is out of range"},
      {"0 0 * 13 *", "month (field 4) at position 7"},
      {"0 0 * * 8", "day of week (field 5) at position 9"},
      {"0 0 * foo *", "unknown name 'foo'"},
      {"0 0 * * monday", "unknown name 'monday'"},
      {"jan 0 * * *", "names are not allowed here"},
      {"5-1 * * * *", "position 3: range 5-1 goes backwards"},
      {"*/0 * * * *", "step 0"},
      {"5/10 * * * *", "a step needs '*' or a range"},
      {"1,,2 * * * *", "position 3"},
      {"1, * * * *", "position 3: a list cannot end"},
      {"*/ * * * *", "expected a step number"},
      {"*/61 * * * *", "larger than the field's range"},
      {"1-* * * * *", "position 3"},
      {"0 0 30 2 *", "never runs"},
      {"0 0 31 4,6,9,11 *", "never runs"},
      {"@reboot", "unknown schedule '@reboot'"},
      {"@daily 5", "got 2"},
      {"0 0 * * 1#2", "position 10"},
      {"0 0 L * *", "names are not allowed here"},
  };
  for (const auto& c : cases) {
    auto s = CronSchedule::Parse(c.expr);
    ASSERT_FALSE(s.ok()) << c.expr;
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message().find(c.needle), std::string::npos)
        << c.expr << " -> " << s.error().message() << " (wanted " << c.needle << ")";
  }
  // Feb 30 is impossible, but with a day of week restricted too it runs.
  EXPECT_TRUE(CronSchedule::Parse("0 0 30 2 1").ok());
  EXPECT_TRUE(CronSchedule::Parse("\t0  2 *\t* *  ").ok());
}

// ---- time zones ----

std::string TzDir() {
  const char* d = std::getenv("TZDIR");
  return d && *d ? d : "/usr/share/zoneinfo";
}

bool HaveZone(const char* name) {
  auto z = TimeZone::Load(Env::Default(), name);
  return z.ok();
}

// Sets TZ for the test's lifetime (glibc is the oracle), then restores it.
class ScopedTz {
 public:
  explicit ScopedTz(const char* name) {
    const char* old = std::getenv("TZ");
    had_ = old != nullptr;
    if (had_) saved_ = old;
    ::setenv("TZ", name, 1);
    ::tzset();
  }
  ~ScopedTz() {
    if (had_) ::setenv("TZ", saved_.c_str(), 1);
    else ::unsetenv("TZ");
    ::tzset();
  }

 private:
  bool had_ = false;
  std::string saved_;
};

TEST(TimeZoneTest, OffsetsMatchGlibc) {
  const char* zones[] = {"Europe/Berlin", "America/New_York", "Australia/Sydney", "Australia/Lord_Howe",
                         "Asia/Kolkata", "America/Sao_Paulo", "Pacific/Chatham", "Africa/Casablanca"};
  int checked = 0;
  for (const char* name : zones) {
    auto z = TimeZone::Load(Env::Default(), name);
    if (!z.ok()) continue;  // zone missing on this system
    ScopedTz tz(name);
    // Every 7 hours 13 minutes from 1960 to 2060: past the end of the
    // transition table, the POSIX footer rule takes over.
    for (int64_t t = -315619200; t < 2840140800; t += 7 * 3600 + 13 * 60) {
      time_t tt = static_cast<time_t>(t);
      struct tm tm;
      ::localtime_r(&tt, &tm);
      ASSERT_EQ(z->OffsetAt(sys_seconds{std::chrono::seconds{t}}).count(), tm.tm_gmtoff) << name << " at " << t;
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no zoneinfo under " << TzDir();
}

TEST(TimeZoneTest, LoadErrors) {
  EXPECT_TRUE(TimeZone::Load(Env::Default(), "UTC")->is_utc());
  EXPECT_TRUE(TimeZone::Load(Env::Default(), "")->is_utc());
  EXPECT_EQ(TimeZone::Load(Env::Default(), "../etc/passwd").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(TimeZone::Load(Env::Default(), "/etc/localtime").error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(TimeZone::Load(Env::Default(), "Europe//Berlin").error().code(), ErrorCode::kInvalidArgument);
  if (HaveZone("Europe/Berlin")) {
    EXPECT_EQ(TimeZone::Load(Env::Default(), "Mars/Olympus_Mons").error().code(), ErrorCode::kNotFound);
  }
  EXPECT_EQ(TimeZone::FromTzif("x", "TZif2").error().code(), ErrorCode::kCorruption);
  EXPECT_EQ(TimeZone::FromTzif("x", std::string(60, 'a')).error().code(), ErrorCode::kCorruption);
}

TEST(TimeZoneTest, PosixRuleSouthernHemisphere) {
  // Sydney: DST from the first Sunday of October to the first Sunday of April.
  auto z = TimeZone::FromPosixRule("syd", "AEST-10AEDT,M10.1.0,M4.1.0/3");
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(z->OffsetAt(T("2030-01-15T00:00:00Z")).count(), 11 * 3600);
  EXPECT_EQ(z->OffsetAt(T("2030-07-15T00:00:00Z")).count(), 10 * 3600);
  EXPECT_FALSE(TimeZone::FromPosixRule("x", "CET-1CEST,M3.5.0").ok());
  EXPECT_FALSE(TimeZone::FromPosixRule("x", "C-1").ok());
}

TEST(CronTest, ZoneDaylightSavingGapsAndOverlaps) {
  auto z = TimeZone::FromPosixRule("berlin", "CET-1CEST,M3.5.0,M10.5.0/3");
  ASSERT_TRUE(z.ok());
  // 02:30 local on 2030-03-31 does not exist: it runs when the gap ends
  // (03:00 CEST = 01:00 UTC); the next day at 02:30 CEST.
  EXPECT_EQ(NextAfter("30 2 * * *", "2030-03-30T12:00:00Z", *z), "2030-03-31T01:00:00Z");
  EXPECT_EQ(NextAfter("30 2 * * *", "2030-03-31T01:00:00Z", *z), "2030-04-01T00:30:00Z");
  // 02:30 local on 2030-10-27 happens twice: it runs at the first (CEST).
  EXPECT_EQ(NextAfter("30 2 * * *", "2030-10-26T12:00:00Z", *z), "2030-10-27T00:30:00Z");
  EXPECT_EQ(NextAfter("30 2 * * *", "2030-10-27T00:30:00Z", *z), "2030-10-28T01:30:00Z");
  // Plain days: local 02:00 is 01:00 UTC in winter.
  EXPECT_EQ(NextAfter("0 2 * * *", "2030-01-10T00:00:00Z", *z), "2030-01-10T01:00:00Z");
  // Hourly across the gap: no hour is lost twice or repeated.
  auto s = CronSchedule::Parse("0 * * * *", *z);
  ASSERT_TRUE(s.ok());
  auto runs = s->NextN(T("2030-03-30T23:30:00Z"), 4);
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(FormatRfc3339(runs[0]), "2030-03-31T00:00:00Z");  // 01:00 CET
  EXPECT_EQ(FormatRfc3339(runs[1]), "2030-03-31T01:00:00Z");  // 03:00 CEST (02:00 skipped)
  EXPECT_EQ(FormatRfc3339(runs[2]), "2030-03-31T02:00:00Z");  // 04:00 CEST
  if (HaveZone("Europe/Berlin")) {
    EXPECT_EQ(NextAfter("0 2 * * *", "2026-07-01T00:30:00Z", *TimeZone::Load(Env::Default(), "Europe/Berlin")),
              "2026-07-02T00:00:00Z");
  }
}

// ---- durations and times ----

TEST(TimeTextTest, Durations) {
  struct {
    const char* text;
    int64_t seconds;
  } good[] = {{"0", 0}, {"90", 90}, {"26h", 26 * 3600}, {"90m", 5400}, {"1d12h", 129600},
              {"2w3d", 17 * 86400}, {"1h30m15s", 5415}, {"0s", 0}, {"7d", 604800}};
  for (const auto& g : good) {
    auto d = ParseDuration(g.text);
    ASSERT_TRUE(d.ok()) << g.text << ": " << d.error().message();
    EXPECT_EQ(d->count(), g.seconds) << g.text;
  }
  const char* bad[] = {"", "h", "1x", "-1h", "1.5h", "1h1h", "1m1h", "1h 30m", "1h30", " 1h", "1H",
                       "99999999999999999999d", "36600000d"};
  for (const char* b : bad) {
    auto d = ParseDuration(b);
    ASSERT_FALSE(d.ok()) << b;
    EXPECT_EQ(d.error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_NE(ParseDuration("1x").error().message().find("position 2"), std::string::npos);
  EXPECT_EQ(FormatDuration(std::chrono::seconds(129600)), "1d12h");
  EXPECT_EQ(FormatDuration(std::chrono::seconds(90)), "1m30s");
  EXPECT_EQ(FormatDuration(std::chrono::seconds(0)), "0s");
}

TEST(TimeTextTest, Rfc3339) {
  EXPECT_EQ(FormatRfc3339(T("2026-11-22T15:01:02Z")), "2026-11-22T15:01:02Z");
  EXPECT_EQ(FormatRfc3339(T("2026-11-22T17:01:02.123+02:00")), "2026-11-22T15:01:02Z");
  EXPECT_EQ(FormatRfc3339(T("1969-12-31T23:59:59Z")), "1969-12-31T23:59:59Z");
  for (const char* b : {"2026-11-22", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-11-22T15:01:02",
                        "2026-11-22T25:00:00Z", "2026-11-22T15:01:02Zjunk", "2026-11-22T15:01:02+0200"}) {
    EXPECT_FALSE(ParseRfc3339(b).ok()) << b;
  }
}

}  // namespace
}  // namespace barge::orchestrate
