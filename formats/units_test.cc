// Sizes, durations and RFC 3339 times: what is accepted, what is refused.
#include "formats/units.h"

#include <gtest/gtest.h>

namespace barge::formats {
namespace {

TEST(UnitsTest, Sizes) {
  EXPECT_EQ(*ParseSize("0"), 0u);
  EXPECT_EQ(*ParseSize("512"), 512u);
  EXPECT_EQ(*ParseSize("64k"), 65536u);
  EXPECT_EQ(*ParseSize("64K"), 65536u);
  EXPECT_EQ(*ParseSize("1KiB"), 1024u);
  EXPECT_EQ(*ParseSize("4G"), 4ull << 30);
  EXPECT_EQ(*ParseSize("2T"), 2ull << 40);
  EXPECT_EQ(*ParseSize("1P"), 1ull << 50);
  for (const char* bad : {"", "G", "1.5G", "-1", "4X", "4GG", "18446744073709551616", "16777216T", " 4G"}) {
    auto r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(HumanBytes(512), "512 B");
  EXPECT_EQ(HumanBytes(65536), "64 KiB");
  EXPECT_EQ(HumanBytes(1234567), "1.18 MiB");
  EXPECT_EQ(HumanBytesExact(1234567), "1.18 MiB (1234567 bytes)");
  EXPECT_EQ(Hex(0), "0x0");
  EXPECT_EQ(Hex(0x1f0000), "0x1f0000");
  EXPECT_EQ(Hex(UINT64_MAX), "0xffffffffffffffff");
}

TEST(UnitsTest, Durations) {
  EXPECT_EQ(*ParseDurationSeconds("0"), 0);
  EXPECT_EQ(*ParseDurationSeconds("90"), 90);
  EXPECT_EQ(*ParseDurationSeconds("90s"), 90);
  EXPECT_EQ(*ParseDurationSeconds("15m"), 900);
  EXPECT_EQ(*ParseDurationSeconds("26h"), 26 * 3600);
  EXPECT_EQ(*ParseDurationSeconds("7d"), 7 * 86400);
  EXPECT_EQ(*ParseDurationSeconds("1w"), 7 * 86400);
  EXPECT_EQ(*ParseDurationSeconds("1d12h30m"), 86400 + 12 * 3600 + 1800);
  for (const char* bad : {"", "h", "1.5h", "-1h", "1x", "1h1d", "1h1h", "1h30", "99999999999999999999d"}) {
    EXPECT_FALSE(ParseDurationSeconds(bad).ok()) << bad;
  }
  EXPECT_EQ(FormatDurationSeconds(0), "0s");
  EXPECT_EQ(FormatDurationSeconds(86400 + 12 * 3600), "1d12h");
  EXPECT_EQ(*ParseDurationSeconds(FormatDurationSeconds(93784)), 93784);
  EXPECT_EQ(HumanSeconds(0.012345), "0.0123 s");
  EXPECT_EQ(HumanSeconds(1.2345), "1.23 s");
  EXPECT_EQ(HumanSeconds(12.345), "12.3 s");
  EXPECT_EQ(HumanSeconds(123.45), "123 s");
  EXPECT_EQ(HumanSeconds(1234), "20 min 34 s");
  EXPECT_EQ(HumanSeconds(7500), "2 h 05 min");
}

TEST(UnitsTest, Rfc3339Accepted) {
  // The instant of the example: 01:05:49 at -05:00 is 06:05:49 UTC.
  auto a = ParseRfc3339("2026-11-24T01:05:49-05:00");
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(FormatRfc3339(*a), "2026-11-24T06:05:49Z");
  EXPECT_EQ(*ParseRfc3339("2026-11-24 06:05:49Z"), *a);
  EXPECT_EQ(*ParseRfc3339("2026-11-24t06:05:49z"), *a);
  EXPECT_EQ(*ParseRfc3339("2026-11-24T07:35:49+01:30"), *a);
  EXPECT_EQ(*ParseRfc3339("20261124T060549Z"), *a);  // backup ids' compact form
  auto f = ParseRfc3339("2026-11-24T06:05:49.25Z");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->seconds, a->seconds);
  EXPECT_EQ(f->nanos, 250000000);
  EXPECT_EQ(FormatRfc3339(*f), "2026-11-24T06:05:49.25Z");
  EXPECT_EQ(ParseRfc3339("1970-01-01T00:00:00Z")->seconds, 0);
  EXPECT_EQ(ParseRfc3339("2024-02-29T00:00:00Z")->seconds, 1709164800);
  EXPECT_EQ(FormatRfc3339({1709164800, 0}), "2024-02-29T00:00:00Z");
  EXPECT_EQ(FormatRfc3339({-1, 0}), "1969-12-31T23:59:59Z");
  EXPECT_EQ(ParseRfc3339("2016-12-31T23:59:60Z")->seconds, ParseRfc3339("2016-12-31T23:59:59Z")->seconds);
}

TEST(UnitsTest, Rfc3339Refused) {
  for (const char* bad : {"", "2026-11-24", "2026-11-24T06:05:49", "2026-11-24T06:05:49Zjunk",
                          "2026-11-24T06:05Z", "2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z",
                          "2025-02-29T00:00:00Z", "2026-11-24T24:00:00Z", "2026-11-24T06:05:49+5",
                          "2026-11-24T06:05:49.Z", "2026-11-24X06:05:49Z", "2026-11-24  06:05:49Z",
                          "26-11-24T06:05:49Z", "yesterday", "1732428349"}) {
    auto r = ParseRfc3339(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find(bad), std::string::npos) << r.error().message();
  }
}

}  // namespace
}  // namespace barge::formats
