// ChainFolder::Resolve: how --at and --through name a point (issue 12):
// times compared as instants, positions as indexes in the current list,
// ids stable across merges.
#include "pipeline/chain.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

ChainPoint Point(uint32_t sequence, const std::string& compact, const std::string& started_at) {
  ChainPoint p;
  char seq[16];
  std::snprintf(seq, sizeof seq, "%04u", sequence);
  p.manifest.id = std::string(seq) + "-" + compact;
  p.manifest.started_at = started_at;
  p.manifest_path = "chain/" + p.manifest.id + ".json";
  p.sequence = sequence;
  return p;
}

// Two points taken at 05:00Z and 06:00Z on 2026-11-24.
ChainFolder TwoPoints() {
  ChainFolder c;
  c.dir = "chain";
  c.points = {Point(0, "20261124T050000Z", "2026-11-24T05:00:00Z"),
              Point(1, "20261124T060000Z", "2026-11-24T06:00:00Z")};
  return c;
}

// Issue 12: "--at 2026-11-24T01:05:49-05:00" restored the oldest point:
// the time was compared as text, offset and all. It is 06:05:49Z, after
// both points: the newest is the one.
TEST(ChainResolveTest, AtTimeWithOffsetPicksNewestPointBeforeTheInstant) {
  ChainFolder c = TwoPoints();
  EXPECT_EQ(*c.Resolve("2026-11-24T01:05:49-05:00"), 1u);
  EXPECT_EQ(*c.Resolve("2026-11-24T00:30:00-05:00"), 0u);  // 05:30Z
  EXPECT_EQ(*c.Resolve("2026-11-24T06:00:00+00:00"), 1u);  // exactly at the start
  EXPECT_EQ(*c.Resolve("2026-11-24T07:59:59.5+02:00"), 0u);  // 05:59:59.5Z
}

TEST(ChainResolveTest, AtTimeAcceptsSpaceSeparatorAndLowercase) {
  ChainFolder c = TwoPoints();
  EXPECT_EQ(*c.Resolve("2026-11-24 06:30:00Z"), 1u);
  EXPECT_EQ(*c.Resolve("2026-11-24t05:30:00z"), 0u);
  EXPECT_EQ(*c.Resolve("20261124T053000Z"), 0u);  // the compact form of ids
}

// Issue 12: "...Zjunk" was accepted (junk ignored). Anything but a full
// RFC 3339 time is refused, saying what may name a point.
TEST(ChainResolveTest, AtTimeWithTrailingJunkIsRefused) {
  ChainFolder c = TwoPoints();
  for (const char* bad : {"2026-11-24T06:30:00Zjunk", "2026-11-24T06:30:00", "2026-13-01T00:00:00Z",
                          "2026-11-24", "yesterday", "-1", "1.5"}) {
    auto r = c.Resolve(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(r.error().message().find("RFC 3339"), std::string::npos) << r.error().message();
  }
  EXPECT_NE(c.Resolve("2026-11-24T06:30:00Zjunk").error().message().find("junk"), std::string::npos);
}

TEST(ChainResolveTest, AtTimeBeforeEveryPointIsNotFoundNamingTheOldest) {
  ChainFolder c = TwoPoints();
  auto r = c.Resolve("2026-11-23T23:59:59-05:00");  // 04:59:59Z
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.error().message().find("0000-20261124T050000Z"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("2026-11-24T05:00:00Z"), std::string::npos) << r.error().message();
}

// Points need not be in time order (a clock set back): the newest start
// at or before the instant wins, not the last such point in the list.
TEST(ChainResolveTest, AtTimeComparesStartsNotListOrder) {
  ChainFolder c;
  c.dir = "chain";
  c.points = {Point(0, "20261124T070000Z", "2026-11-24T07:00:00Z"),
              Point(1, "20261124T050000Z", "2026-11-24T05:00:00Z")};
  EXPECT_EQ(*c.Resolve("2026-11-24T08:00:00Z"), 0u);
  EXPECT_EQ(*c.Resolve("2026-11-24T06:00:00Z"), 1u);
}

TEST(ChainResolveTest, StartTimeFallsBackToTheId) {
  ChainFolder c = TwoPoints();
  c.points[1].manifest.started_at.clear();
  EXPECT_EQ(*c.Resolve("2026-11-24T06:30:00Z"), 1u);
}

// Issue 12: "--at 0" is "the full"; after a merge it said "no backup at
// position 0" because positions were the ids' sequence numbers. A
// position is the index in the current list; ids keep their numbers.
TEST(ChainResolveTest, PositionsAreIndexesAfterAMerge) {
  ChainFolder c;
  c.dir = "chain";
  // A merge through 0002 removed 0000 and 0001; 0002 is now the full.
  c.points = {Point(2, "20261124T070000Z", "2026-11-24T07:00:00Z"),
              Point(3, "20261124T080000Z", "2026-11-24T08:00:00Z")};
  EXPECT_EQ(*c.Resolve("0"), 0u);
  EXPECT_EQ(*c.Resolve("1"), 1u);
  EXPECT_EQ(*c.Resolve("0002-20261124T070000Z"), 0u);
  EXPECT_EQ(*c.Resolve("0003-20261124T080000Z"), 1u);
  auto past = c.Resolve("2");
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(past.error().message().find("positions 0 to 1"), std::string::npos) << past.error().message();
  auto gone = c.Resolve("0000-20261124T050000Z");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(c.next_sequence(), 4u);  // ids are never reused
}

TEST(ChainResolveTest, LatestAndEmpty) {
  ChainFolder c = TwoPoints();
  EXPECT_EQ(*c.Resolve(""), 1u);
  EXPECT_EQ(*c.Resolve("latest"), 1u);
  ChainFolder empty;
  EXPECT_EQ(empty.Resolve("latest").error().code(), ErrorCode::kNotFound);
}

TEST(ChainResolveTest, ParsePointSelectorKinds) {
  EXPECT_EQ(ParsePointSelector("latest")->kind, PointSelector::Kind::kLatest);
  EXPECT_EQ(ParsePointSelector("12")->kind, PointSelector::Kind::kPosition);
  EXPECT_EQ(ParsePointSelector("12")->position, 12u);
  EXPECT_EQ(ParsePointSelector("0012-20261124T080000Z")->kind, PointSelector::Kind::kId);
  EXPECT_EQ(ParsePointSelector("2026-11-24T08:00:00Z")->kind, PointSelector::Kind::kTime);
  EXPECT_FALSE(ParsePointSelector("0012-2026").ok());
}

}  // namespace
}  // namespace barge::pipeline
