// The reliability campaign per command (issue 13, docs/reliability.md):
// power loss at every durability boundary, an error injected at every
// filesystem call site, kill -9 at random moments of a real process. Each
// test reports its figure and fails on any loss, damage or bad error.
#include <gtest/gtest.h>

#include "tests/reliability/campaigns.h"
#include "tests/testing/testing.h"

namespace barge::reliability {
namespace {

class CampaignTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    scenario_ = MakeScenario(GetParam());
    ASSERT_NE(scenario_, nullptr);
  }
  void Expect(const Figure& fig) {
    Report(fig);
    EXPECT_EQ(fig.lost_or_damaged, 0u) << fig.command << " (" << fig.campaign << ")";
    EXPECT_EQ(fig.other, 0u) << fig.command << " (" << fig.campaign << ")";
    EXPECT_GT(fig.tried, 0u);
    for (const auto& f : fig.failures) ADD_FAILURE() << f;
  }
  std::unique_ptr<Scenario> scenario_;
};

TEST_P(CampaignTest, PowerLoss) {
  for (int v = 0; v < GetSizing().variants(); ++v) Expect(PowerLossCampaign(*scenario_, GetSizing().seed + v));
}

TEST_P(CampaignTest, InjectedErrors) {
  for (int v = 0; v < GetSizing().variants(); ++v) Expect(InjectedErrorCampaign(*scenario_, GetSizing().seed + v));
}

TEST_P(CampaignTest, Kill) { Expect(KillCampaign(*scenario_, GetSizing().seed)); }

// Only the commands that write a new file: removals and in-place edits
// (image cleanup, bitmap rotation, the snapshot commands) have nothing to
// fill the filesystem against, and are not registered (CI runs nothing
// that skips).
class FullFilesystemTest : public CampaignTest {};

TEST_P(FullFilesystemTest, FullFilesystem) {
  std::string skipped;
  Figure fig = FullFilesystemCampaign(*scenario_, GetSizing().seed, &skipped);
  if (!skipped.empty()) GTEST_SKIP() << "full-filesystem campaign not run: " << skipped;
  Expect(fig);
}

std::vector<std::string> WritingScenarioNames() {
  std::vector<std::string> names;
  for (const std::string& n : ScenarioNames()) {
    if (n == "image-cleanup" || n == "bitmap-rotate" || n.starts_with("snapshot-")) continue;
    names.push_back(n);
  }
  return names;
}

TEST(ConcurrentCatalogTest, AddAndSyncAtOnceOneKilled) {
  BARGE_REQUIRE_TOOL("qemu-img");
  Figure fig = ConcurrentCatalogCampaign(GetSizing().seed);
  Report(fig);
  EXPECT_EQ(fig.lost_or_damaged, 0u);
  EXPECT_EQ(fig.other, 0u);
  EXPECT_GT(fig.tried, 1u);
  for (const auto& f : fig.failures) ADD_FAILURE() << f;
}

std::string Name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) {
    if (c == '-') c = '_';
  }
  return n;
}

INSTANTIATE_TEST_SUITE_P(Commands, CampaignTest, ::testing::ValuesIn(ScenarioNames()), Name);
INSTANTIATE_TEST_SUITE_P(Commands, FullFilesystemTest, ::testing::ValuesIn(WritingScenarioNames()), Name);

}  // namespace
}  // namespace barge::reliability
