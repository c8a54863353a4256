// Rendezvous assignment of sources to shards: stable, spread, and growing
// N to N+1 moves sources only to the new shard.
#include "orchestrate/policy/policy_shard.h"

#include <gtest/gtest.h>

#include <xxhash.h>

namespace barge::orchestrate {
namespace {

std::vector<std::string> Names(size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) out.push_back("vm" + std::to_string(i));
  return out;
}

TEST(PolicyShardTest, ParseShard) {
  auto s = ParseShard("3/8");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->index, 3u);
  EXPECT_EQ(s->count, 8u);
  EXPECT_EQ(s->ToString(), "3/8");
  for (const char* bad : {"8/8", "0/0", "a/2", "1/", "/2", "1/2/3", "+1/2", "1/100001", "", "0"}) {
    EXPECT_FALSE(ParseShard(bad).ok()) << bad;
  }
  EXPECT_EQ(ShardSpec{}.ToString(), "");
}

TEST(PolicyShardTest, WeightIsTheDocumentedHash) {
  const std::string key = std::string("web1") + '\0' + "2";
  EXPECT_EQ(ShardWeight("web1", 2), XXH3_64bits(key.data(), key.size()));
}

TEST(PolicyShardTest, EverySourceInExactlyOneShard) {
  const auto names = Names(300);
  std::vector<size_t> per(5, 0);
  for (const auto& n : names) {
    size_t in = 0;
    for (uint32_t i = 0; i < 5; ++i) in += InShard({i, 5}, n) ? 1 : 0;
    EXPECT_EQ(in, 1u) << n;
    ++per[ShardOfSource(n, 5)];
  }
  // Spread: 60 expected each; a hash this bad would be a bug.
  for (size_t c : per) EXPECT_GT(c, 30u);
  EXPECT_TRUE(InShard({}, "anything"));
}

TEST(PolicyShardTest, GrowingMovesOnlyToTheNewShard) {
  const auto names = Names(400);
  for (uint32_t n = 1; n < 8; ++n) {
    size_t moved = 0;
    for (const auto& name : names) {
      const uint32_t before = ShardOfSource(name, n);
      const uint32_t after = ShardOfSource(name, n + 1);
      if (before != after) {
        EXPECT_EQ(after, n) << name << " moved between old shards";
        ++moved;
      }
    }
    // About 1/(n+1) of the sources move.
    EXPECT_GT(moved, names.size() / (n + 1) / 2) << n;
    EXPECT_LT(moved, names.size() * 2 / (n + 1)) << n;
  }
}

TEST(PolicyShardTest, ShardSourcesInFileOrder) {
  Policy p;
  for (const auto& n : Names(10)) {
    PolicySource s;
    s.name = n;
    p.sources.push_back(s);
  }
  std::vector<std::string> all;
  for (uint32_t i = 0; i < 3; ++i) {
    for (const auto& n : ShardSources(p, {i, 3})) all.push_back(n);
  }
  EXPECT_EQ(all.size(), 10u);
  EXPECT_EQ(ShardSources(p, {}).size(), 10u);
  const auto one = ShardSources(p, {1, 3});
  EXPECT_TRUE(std::is_sorted(one.begin(), one.end(), [](const std::string& a, const std::string& b) {
    return std::stoi(a.substr(2)) < std::stoi(b.substr(2));
  }));
}

}  // namespace
}  // namespace barge::orchestrate
