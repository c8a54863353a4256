// Sharded policy runs (issue 21): `barge run --shard I/N | auto` backs up
// each source of a policy in exactly one shard (as `policy shards` lists),
// with the index and count from the command line, a Slurm array's or a
// Kubernetes Indexed Job's variables; every shard's records go to its own
// file of a records folder and `runs list` reads them as one table (or one
// shard); the metrics textfiles are one per shard. Two workers that overlap
// never back up one source at once (the chain lock: the second fails that
// source, Busy), and a worker killed with SIGKILL mid-backup leaves
// nothing behind that the next worker trips over: its record reads
// "interrupted", its staged files are swept by the next run of its shard.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>
#include <map>
#include <set>

#include "tests/policy_support.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using namespace policy_testing;

using testing::RunOk;
using testing::TempDir;

struct Ran {
  int exit_code = -1;
  json result = json::object();
  std::string output;
};

// `ENV barge ARGS --json` (ENV: "VAR=value ..." assignments for env(1),
// after the scheduler variables of the test's own environment are removed).
Ran BargeIn(const std::string& env, const std::string& args) {
  auto r = testing::Run("env -u JOB_COMPLETION_INDEX -u BARGE_SHARD_COUNT -u SLURM_ARRAY_TASK_ID "
                        "-u SLURM_ARRAY_TASK_MIN -u SLURM_ARRAY_TASK_STEP -u SLURM_ARRAY_TASK_COUNT " +
                        env + " " + Barge() + " " + args + " --json");
  Ran out;
  out.exit_code = r.exit_code;
  out.output = r.output;
  for (const json& e : testing::Events(r.stdout_text)) {
    if (e.at("event") == "result") out.result = e;
  }
  return out;
}

void WriteText(const std::string& path, const std::string& text) {
  testing::WriteFile(path, std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                                  reinterpret_cast<const std::byte*>(text.data()) + text.size()));
}

// Files under `dir` whose names say "unfinished" (staged temporaries).
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find("barge-tmp") != std::string::npos || name.find("barge-resume") != std::string::npos) {
      out.push_back(e.path().string());
    }
  }
  return out;
}

TEST(PolicyShardTest, EverySourceInOneShardRecordsAndMetricsPerShard) {
  TempDir dir;
  const std::string target = dir / "t", records = dir / "records", metrics = dir / "metrics";
  for (const auto& d : {target, records, metrics}) fs::create_directories(d);
  std::string sources;
  for (int i = 0; i < 6; ++i) {
    const std::string image = dir / ("s" + std::to_string(i) + ".raw");
    testing::WriteFile(image, testing::RandomBytes(256 << 10, 100 + i));
    sources += "  - image: " + image + "\n";
  }
  const std::string policy = dir / "fleet.yaml";
  WriteText(policy, "name: fleet\nsources:\n" + sources + "targets: [" + target + "]\nfree_space_multiple: 0\n");

  // What goes where, as an admin sees it.
  Ran listing = BargeIn("", "policy shards " + Q(policy) + " --shards 3");
  ASSERT_EQ(listing.exit_code, 0) << listing.output;
  std::map<std::string, int> shard_of;
  std::vector<std::set<std::string>> expected(3);
  for (const auto& s : listing.result.at("shards")) {
    for (const auto& name : s.at("sources")) {
      EXPECT_FALSE(shard_of.count(name)) << name << " in two shards";
      shard_of[name] = s.at("index");
      expected[s.at("index").get<int>()].insert(name.get<std::string>());
    }
  }
  ASSERT_EQ(shard_of.size(), 6u) << listing.output;

  // Shard 0 from the command line, shard 1 as task 11 of a Slurm array
  // 10-12, shard 2 as index 2 of a Kubernetes Indexed Job of 3.
  const std::string common = "run --force --policy " + Q(policy) + " --catalog " + Q(records) +
                             " --metrics-textfile " + Q(metrics + "/barge-fleet.prom");
  const std::vector<std::pair<std::string, std::string>> workers = {
      {"", common + " --shard 0/3"},
      {"SLURM_ARRAY_TASK_ID=11 SLURM_ARRAY_TASK_MIN=10 SLURM_ARRAY_TASK_MAX=12 SLURM_ARRAY_TASK_COUNT=3",
       common + " --shard auto"},
      {"JOB_COMPLETION_INDEX=2 BARGE_SHARD_COUNT=3", common + " --shard auto"},
  };
  for (int i = 0; i < 3; ++i) {
    Ran r = BargeIn(workers[i].first, workers[i].second);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.result.at("shard"), (json{{"index", i}, {"count", 3}})) << r.output;
    std::set<std::string> ran;
    for (const auto& s : r.result.at("sources")) {
      EXPECT_EQ(s.at("result"), "success") << s.dump();
      ran.insert(s.at("source").get<std::string>());
    }
    EXPECT_EQ(ran, expected[i]) << "shard " << i;
    EXPECT_EQ(r.result.at("metrics_textfile"), metrics + "/barge-fleet.shard-" + std::to_string(i) + ".prom");
    EXPECT_TRUE(fs::exists(records + "/fleet.shard-" + std::to_string(i) + ".db"));
  }
  // Every source backed up exactly once.
  for (const auto& [name, shard] : shard_of) EXPECT_EQ(Manifests(target + "/fleet/" + name), 1u) << name;

  // One table over the shards' files, and one shard's view.
  Ran all = BargeIn("", "runs list --policy " + Q(policy) + " --catalog " + Q(records));
  ASSERT_EQ(all.exit_code, 0) << all.output;
  ASSERT_EQ(all.result.at("runs").size(), 6u) << all.output;
  EXPECT_EQ(all.result.at("catalogs").size(), 3u);
  for (const auto& run : all.result.at("runs")) {
    const std::string source = run.at("source");
    EXPECT_EQ(run.at("shard"), (json{{"index", shard_of[source]}, {"count", 3}})) << run.dump();
    EXPECT_EQ(run.at("catalog"), records + "/fleet.shard-" + std::to_string(shard_of[source]) + ".db");
    EXPECT_EQ(run.at("result"), "success");
  }
  Ran one = BargeIn("", "runs list --catalog " + Q(records) + " --shard 1/3");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::set<std::string> listed;
  for (const auto& run : one.result.at("runs")) listed.insert(run.at("source").get<std::string>());
  EXPECT_EQ(listed, expected[1]);

  // One metrics file per shard, each with its own sources, labelled.
  for (int i = 0; i < 3; ++i) {
    const std::string text = testing::Slurp(metrics + "/barge-fleet.shard-" + std::to_string(i) + ".prom");
    EXPECT_NE(text.find("shard=\"" + std::to_string(i) + "/3\""), std::string::npos) << text;
    for (const auto& [name, shard] : shard_of) {
      EXPECT_EQ(text.find("source=\"" + name + "\"") != std::string::npos, shard == i) << name << " in " << i;
    }
  }

  // Bad values are usage errors (64), naming what is wrong or missing.
  Ran bad = BargeIn("", common + " --shard 3/3");
  EXPECT_EQ(bad.exit_code, 64) << bad.output;
  EXPECT_NE(bad.output.find("below 3"), std::string::npos) << bad.output;
  Ran none = BargeIn("", common + " --shard auto");
  EXPECT_EQ(none.exit_code, 64) << none.output;
  EXPECT_NE(none.output.find("JOB_COMPLETION_INDEX"), std::string::npos) << none.output;
  Ran k8s = BargeIn("JOB_COMPLETION_INDEX=1", common + " --shard auto");
  EXPECT_EQ(k8s.exit_code, 64) << k8s.output;
  EXPECT_NE(k8s.output.find("BARGE_SHARD_COUNT"), std::string::npos) << k8s.output;
  Ran slurm = BargeIn("SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_MIN=0", common + " --shard auto");
  EXPECT_EQ(slurm.exit_code, 64) << slurm.output;
  EXPECT_NE(slurm.output.find("SLURM_ARRAY_TASK_COUNT"), std::string::npos) << slurm.output;
}

TEST(PolicyShardTest, OverlappingWorkersAndAKilledWorker) {
  BARGE_REQUIRE_TOOL("nbdkit");
  TempDir dir;
  const std::string target = dir / "t", policy = dir / "p.yaml";
  // Two machines' catalogs: their folders (and so their lock folders) differ.
  const std::string cat_a = dir / "a/catalog.db", cat_b = dir / "b/catalog.db";
  for (const auto& d : {target, dir / "a", dir / "b"}) fs::create_directories(d);
  // 2 s per read: minutes for 1 GiB, time enough to overlap and kill.
  const std::string slow_sock = dir / "slow.sock";
  auto slow = std::make_unique<testing::SocketServer>(
      "nbdkit -f -U " + Q(slow_sock) + " --filter=delay pattern 1G rdelay=2", slow_sock);
  ASSERT_TRUE(slow->WaitReady());
  auto write_policy = [&](const std::string& uri) {
    WriteText(policy, "name: ov\nsources:\n  - nbd: " + uri + "\n    name: vm\ntargets: [" + target +
                          "]\nfree_space_multiple: 0\n");
  };
  write_policy(slow->uri());

  // Worker A: shard 0 of 1, its records in a.db.
  Background a(Barge() + " run --force --json --shard 0/1 --catalog " + Q(cat_a) + " --policy " + Q(policy),
               dir / "a.out", dir / "a.err");
  // Until its backup staged data (the chain folder is locked by then).
  ASSERT_TRUE(WaitFor([&] { return !Leftovers(target).empty() || !a.running(); }, std::chrono::seconds(30)));
  ASSERT_TRUE(a.running()) << a.out() << a.err();

  // A retry of shard 0 on A's machine while A runs: the shard's lock, exit 4.
  Ran retry = BargeIn("", "run --force --shard 0/1 --catalog " + Q(cat_a) + " --policy " + Q(policy));
  EXPECT_EQ(retry.exit_code, 4) << retry.output;
  EXPECT_NE(retry.output.find("a run of shard 0 of policy ov is in progress"), std::string::npos) << retry.output;
  // A worker elsewhere (its own records) whose count is wrong (shard 0 of 2
  // holds the source too, or 1 of 2 does): the chain folder's lock refuses
  // the source; the record says why.
  const std::string other = BargeIn("", "policy shards " + Q(policy) + " --shards 2")
                                .result.at("sources")[0].at("shard").get<int>() == 0 ? "0/2" : "1/2";
  Ran b = BargeIn("", "run --force --shard " + other + " --catalog " + Q(cat_b) + " --policy " + Q(policy));
  EXPECT_EQ(b.exit_code, 1) << b.output;
  ASSERT_EQ(b.result.at("sources").size(), 1u) << b.output;
  EXPECT_EQ(b.result.at("sources")[0].at("result"), "failed");
  EXPECT_NE(b.result.at("sources")[0].at("error").get<std::string>().find(
                "another barge job is writing this chain folder now"),
            std::string::npos)
      << b.output;
  // An unsharded run beside A, with A's catalog folder: the source's lock.
  Ran plain = BargeIn("", "run --force --catalog " + Q(cat_a) + " --policy " + Q(policy));
  EXPECT_EQ(plain.exit_code, 1) << plain.output;
  ASSERT_EQ(plain.result.at("sources").size(), 1u) << plain.output;
  EXPECT_NE(plain.result.at("sources")[0].at("error").get<std::string>().find(
                "source vm of policy ov is being backed up by another worker"),
            std::string::npos)
      << plain.output;
  EXPECT_TRUE(a.running()) << "worker A was disturbed: " << a.err();
  // While A lives its record stays running, also for runs list.
  Ran live = BargeIn("", "runs list --catalog " + Q(cat_a) + " --shard 0/1");
  ASSERT_EQ(live.exit_code, 0) << live.output;
  EXPECT_EQ(live.result.at("runs")[0].at("result"), "running") << live.output;

  // SIGKILL mid-backup: the kernel drops its locks; runs list says the run
  // was cut.
  a.Signal(SIGKILL);
  EXPECT_EQ(a.Wait(std::chrono::seconds(10)), 128 + SIGKILL);
  EXPECT_FALSE(Leftovers(target).empty()) << "nothing staged: the kill came too late to test anything";
  Ran cut = BargeIn("", "runs list --catalog " + Q(cat_a) + " --shard 0/1");  // not the plain run's
  ASSERT_EQ(cut.exit_code, 0) << cut.output;
  ASSERT_EQ(cut.result.at("runs").size(), 1u);
  EXPECT_EQ(cut.result.at("runs")[0].at("result"), "failed");
  EXPECT_NE(cut.result.at("runs")[0].at("error").get<std::string>().find("interrupted"), std::string::npos)
      << cut.output;

  // The next run of shard 0 (a fast source now) sweeps what A staged and
  // backs up; the merged view holds every record.
  slow.reset();
  const std::string fast_sock = dir / "fast.sock";
  testing::SocketServer fast("nbdkit -f -U " + Q(fast_sock) + " pattern 8M", fast_sock);
  ASSERT_TRUE(fast.WaitReady());
  write_policy(fast.uri());
  Ran next = BargeIn("", "run --shard 0/1 --catalog " + Q(cat_a) + " --policy " + Q(policy));
  ASSERT_EQ(next.exit_code, 0) << next.output;
  ASSERT_EQ(next.result.at("sources").size(), 1u);
  EXPECT_EQ(next.result.at("sources")[0].at("result"), "success") << next.output;
  EXPECT_NE(next.result.at("sources")[0].at("due_reason").get<std::string>().find("retry"), std::string::npos)
      << next.output;
  EXPECT_TRUE(Leftovers(target).empty()) << Leftovers(target)[0];
  EXPECT_EQ(Manifests(target + "/ov/vm"), 1u);
  for (const auto& e : fs::directory_iterator(target + "/ov/vm")) {
    if (e.path().extension() == ".qcow2") RunOk("qemu-img check " + Q(e.path().string()));
  }
  Ran merged = BargeIn("", "runs list --catalog " + Q(cat_a) + " --catalog " + Q(cat_b));
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  EXPECT_EQ(merged.result.at("runs").size(), 4u) << merged.output;  // A, the plain run, the next; B
}

}  // namespace
}  // namespace barge
