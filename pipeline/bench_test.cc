#include "pipeline/bench.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "blockio/env.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

BenchMeasure Stage(const std::string& name, double wall, double cpu, bool in_backup_path = true) {
  BenchMeasure m;
  m.name = name;
  m.threads = 2;
  m.serial = name == "qcow2-write" || name == "sha512";
  m.wall_seconds = wall;
  m.user_seconds = cpu;
  m.in_backup_path = in_backup_path;
  return m;
}

BenchReport TwoCoreReport() {
  BenchReport r;
  r.logical_bytes = 1ull << 30;
  r.threads = 2;
  r.stages = {Stage("read", 0.10, 0.06), Stage("compress", 0.50, 1.00), Stage("sha512", 2.0, 2.0, false),
              Stage("qcow2-write", 0.30, 0.30)};
  r.end_to_end = Stage("end-to-end", 0.70, 1.36);
  return r;
}

TEST(SummarizeBenchTest, CeilingIsTheStagesCpuSpreadOverTheCores) {
  BenchSummary s = SummarizeBench(TwoCoreReport());
  EXPECT_EQ(s.slowest_stage, "compress");  // sha512 is not on the backup path
  EXPECT_NEAR(s.stages_cpu_seconds, 1.36, 1e-9);
  EXPECT_NEAR(s.ratio, 0.50 / 0.70, 1e-9);
  // 1.36 CPU s on 2 cores take at least 0.68 s; the compress stage's
  // 1.00 CPU s on its 2 threads take 0.50 s.
  EXPECT_NEAR(s.cpu_ceiling_ratio, 0.50 / 0.68, 1e-9);
}

TEST(SummarizeBenchTest, CeilingIsOneWhenTheSlowestStageBoundsTheRun) {
  BenchReport r = TwoCoreReport();
  r.threads = 16;  // 1.36 CPU s over 16 cores: the serial write's 0.30 s bounds the run
  r.stages[1].threads = 16;
  r.stages[1].user_seconds = 0.16;
  r.stages[3].user_seconds = 1.0;  // the write, one thread: 1.0 s however many cores
  EXPECT_DOUBLE_EQ(SummarizeBench(r).cpu_ceiling_ratio, 1.0);
}

TEST(SummarizeBenchTest, NoCeilingWithoutStages) {
  BenchReport r;
  r.threads = 2;
  EXPECT_EQ(SummarizeBench(r).cpu_ceiling_ratio, 0.0);
}

// Every output goes to a fresh private folder under the workdir (never a
// fixed name there), and nothing is left behind.
TEST(RunBenchRequestTest, MeasuresInAFreshFolderAndLeavesTheWorkdirEmpty) {
  testing::TempDir work;
  BenchRequest request;
  request.size_bytes = kMinBenchDiskBytes;
  request.workdir = work.path().string();
  request.options.threads = 1;
  auto run = RunBenchRequest(Env::Default(), request);
  ASSERT_TRUE(run.ok()) << run.error().ToString();
  EXPECT_GT(run->report.end_to_end.wall_seconds, 0);
  EXPECT_TRUE(std::filesystem::is_empty(work.path()));
}

}  // namespace
}  // namespace barge::pipeline
