// barge forget's flag checks (CheckForgetFlags).
#include "orchestrate/policy/forget_flags.h"

#include <gtest/gtest.h>

namespace barge::orchestrate {
namespace {

ForgetPolicy Last(uint32_t n) {
  ForgetPolicy p;
  p.keep_last = n;
  return p;
}

TEST(ForgetFlagsTest, OneOfAChainFolderOrAPolicy) {
  auto both = CheckForgetFlags("p.yaml", "/c", false, "", Last(1));
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(both.error().message(), "give a chain folder or --policy FILE (one of them)");
  auto neither = CheckForgetFlags("", "", false, "", Last(1));
  ASSERT_FALSE(neither.ok());
  EXPECT_EQ(neither.error().message(), both.error().message());
  EXPECT_TRUE(CheckForgetFlags("p.yaml", "", true, "", Last(1)).ok());
  EXPECT_TRUE(CheckForgetFlags("", "/c", false, "", Last(1)).ok());
}

TEST(ForgetFlagsTest, SourcesOnlyWithAPolicy) {
  auto r = CheckForgetFlags("", "/c", true, "", Last(1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "--source goes with --policy, not a chain folder");
}

TEST(ForgetFlagsTest, KeepWithinIsParsedAndCountsAsARule) {
  auto r = CheckForgetFlags("", "/c", false, "2d12h", ForgetPolicy{});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->keep_within, std::chrono::hours(60));
  auto bad = CheckForgetFlags("", "/c", false, "soon", ForgetPolicy{});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(bad.error().message().rfind("--keep-within: ", 0), 0u) << bad.error().message();
}

TEST(ForgetFlagsTest, NoKeepRuleIsRefused) {
  auto r = CheckForgetFlags("", "/c", false, "", ForgetPolicy{});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("none would forget every point"), std::string::npos);
  auto kept = CheckForgetFlags("", "/c", false, "", Last(3));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->keep_last, 3u);
}

}  // namespace
}  // namespace barge::orchestrate
