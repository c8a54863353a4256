// --shard I/N | auto with the scheduler variables of Kubernetes Indexed Jobs
// and Slurm arrays, from a fake environment.
#include "cli/shard_flag.h"

#include <gtest/gtest.h>

#include <map>

namespace barge::cli {
namespace {

namespace orc = barge::orchestrate;

GetEnvFn Vars(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string Why(const Result<orc::ShardSpec>& r) { return r.ok() ? "" : r.error().message(); }

TEST(ShardFlagTest, ExplicitAndNone) {
  auto none = ResolveShard("", 0, Vars({{"JOB_COMPLETION_INDEX", "2"}}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->sharded());
  auto two = ResolveShard("2/5", 0, Vars({}));
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (orc::ShardSpec{2, 5}));
  EXPECT_NE(Why(ResolveShard("5/5", 0, Vars({}))).find("below 5"), std::string::npos);
  EXPECT_NE(Why(ResolveShard("1/0", 0, Vars({}))).find("count"), std::string::npos);
  EXPECT_FALSE(ResolveShard("-1/3", 0, Vars({})).ok());
  EXPECT_FALSE(ResolveShard("1", 0, Vars({})).ok());
  EXPECT_FALSE(ResolveShard(" 1/3", 0, Vars({})).ok());
  EXPECT_NE(Why(ResolveShard("1/3", 4, Vars({}))).find("contradicts"), std::string::npos);
  EXPECT_NE(Why(ResolveShard("", 4, Vars({}))).find("--shard-count"), std::string::npos);
}

TEST(ShardFlagTest, KubernetesIndexedJob) {
  auto flag = ResolveShard("auto", 4, Vars({{"JOB_COMPLETION_INDEX", "3"}}));
  ASSERT_TRUE(flag.ok()) << Why(flag);
  EXPECT_EQ(*flag, (orc::ShardSpec{3, 4}));
  auto env = ResolveShard("auto", 0, Vars({{"JOB_COMPLETION_INDEX", "0"}, {"BARGE_SHARD_COUNT", "2"}}));
  ASSERT_TRUE(env.ok()) << Why(env);
  EXPECT_EQ(*env, (orc::ShardSpec{0, 2}));
  // Kubernetes exports no count: missing, it is named.
  const std::string missing = Why(ResolveShard("auto", 0, Vars({{"JOB_COMPLETION_INDEX", "1"}})));
  EXPECT_NE(missing.find("BARGE_SHARD_COUNT"), std::string::npos) << missing;
  EXPECT_NE(missing.find("--shard-count"), std::string::npos) << missing;
  EXPECT_FALSE(ResolveShard("auto", 2, Vars({{"JOB_COMPLETION_INDEX", "2"}})).ok());
  EXPECT_NE(Why(ResolveShard("auto", 2, Vars({{"JOB_COMPLETION_INDEX", "x"}}))).find("not a number"),
            std::string::npos);
}

TEST(ShardFlagTest, SlurmArray) {
  // --array=4-6: ids 4, 5, 6 are shards 0, 1, 2.
  auto mid = ResolveShard("auto", 0,
                          Vars({{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_MIN", "4"},
                                {"SLURM_ARRAY_TASK_MAX", "6"}, {"SLURM_ARRAY_TASK_COUNT", "3"}}));
  ASSERT_TRUE(mid.ok()) << Why(mid);
  EXPECT_EQ(*mid, (orc::ShardSpec{1, 3}));
  // --array=10-14:2: ids 10, 12, 14.
  auto stepped = ResolveShard("auto", 0,
                              Vars({{"SLURM_ARRAY_TASK_ID", "14"}, {"SLURM_ARRAY_TASK_MIN", "10"},
                                    {"SLURM_ARRAY_TASK_STEP", "2"}, {"SLURM_ARRAY_TASK_COUNT", "3"}}));
  ASSERT_TRUE(stepped.ok()) << Why(stepped);
  EXPECT_EQ(*stepped, (orc::ShardSpec{2, 3}));
  // --array=0,5 (a list): id 5 is beyond a count of 2.
  EXPECT_FALSE(ResolveShard("auto", 0,
                            Vars({{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                                  {"SLURM_ARRAY_TASK_COUNT", "2"}}))
                   .ok());
  const std::string no_count =
      Why(ResolveShard("auto", 0, Vars({{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_MIN", "0"}})));
  EXPECT_NE(no_count.find("SLURM_ARRAY_TASK_COUNT"), std::string::npos) << no_count;
  EXPECT_NE(Why(ResolveShard("auto", 0, Vars({{"SLURM_ARRAY_TASK_ID", "0"}}))).find("SLURM_ARRAY_TASK_MIN"),
            std::string::npos);
}

TEST(ShardFlagTest, AutoWithoutScheduler) {
  const std::string why = Why(ResolveShard("auto", 3, Vars({})));
  EXPECT_NE(why.find("JOB_COMPLETION_INDEX"), std::string::npos) << why;
  EXPECT_NE(why.find("SLURM_ARRAY_TASK_ID"), std::string::npos) << why;
}

}  // namespace
}  // namespace barge::cli
