// Issue 18: `barge forget CHAIN_DIR` with restic's rules (the reasons each
// point is kept, merges through the retention machinery under the chain
// lock, every kept point restored and compared with qemu-img); a merged
// full says what it is; `runs list` shows folded points as "merged into
// ID" and each record's point ids and states; `list` durations to the
// fraction of a second.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::Barge;
using testing::PointIds;
using testing::Q;
using testing::ReadJson;
using testing::RunOk;
using testing::TempDir;
using testing::WriteExtentsFile;
using testing::WriteJson;

// A chain of six points of a raw disk (a full and five incrementals from
// extents files), each taken at a made-up time (the manifests' started_at
// rewritten: forget reads nothing else), and the disk as it was at each.
class ForgetCliTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSize = 4 << 20;
  // 2026-11-22 is a Sunday: points 0..3 are in ISO week 47, 4 and 5 in 48.
  const std::vector<std::string> kTimes = {"2026-11-20T10:00:00Z", "2026-11-21T10:00:00Z", "2026-11-22T09:00:00Z",
                                           "2026-11-22T15:00:00Z", "2026-11-24T08:00:00Z", "2026-11-25T08:00:00Z"};

  void SetUp() override {
    BARGE_REQUIRE_TOOL("qemu-img");
    BARGE_REQUIRE_TOOL("qemu-io");
    disk_ = dir_ / "disk.raw";
    chain_ = dir_ / "bk/vda";
    testing::WriteFile(disk_, testing::RandomBytes(kSize, 18));
    for (size_t i = 0; i < kTimes.size(); ++i) {
      std::string args = " backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") + " --name vda";
      if (i > 0) {
        const uint64_t offset = (i * 512) << 10;
        RunOk("qemu-io -f raw -c 'write -P " + std::to_string(0x40 + i) + " " + std::to_string(offset) +
              " 192k' " + Q(disk_) + " >/dev/null");
        const std::string extents = dir_ / ("dirty" + std::to_string(i) + ".json");
        WriteExtentsFile(extents, {{offset, 192 << 10}}, kSize);
        args += " --incremental --dirty-extents " + Q(extents);
      }
      RunOk(Barge() + args);
      const std::string state = dir_ / ("state" + std::to_string(i) + ".raw");
      fs::copy_file(disk_, state);
      states_.push_back(state);
    }
    ids_ = PointIds(chain_);
    ASSERT_EQ(ids_.size(), kTimes.size());
    for (size_t i = 0; i < ids_.size(); ++i) {
      const std::string manifest = chain_ + "/" + ids_[i] + ".json";
      json m = ReadJson(manifest);
      m["started_at"] = kTimes[i];
      WriteJson(manifest, m);
      state_of_[ids_[i]] = states_[i];
    }
  }

  testing::CommandResult Forget(const std::string& args) {
    return testing::Run(Barge() + " forget " + Q(chain_) + " " + args);
  }

  // Every point left restores to the disk as it was when it was taken.
  void ExpectRemainingRestore() {
    for (const auto& id : PointIds(chain_)) {
      const std::string out = dir_ / ("restored-" + id + ".raw");
      RunOk(Barge() + " restore " + Q(chain_) + " --at " + Q(id) + " --to " + Q(out) + " --no-sync");
      RunOk("qemu-img compare -q -f raw -F raw " + Q(out) + " " + Q(state_of_[id]));
      RunOk("qemu-img check -q " + Q(chain_ + "/" + id + ".qcow2"));
      fs::remove(out);
    }
  }

  TempDir dir_;
  std::string disk_, chain_;
  std::vector<std::string> states_, ids_;
  std::map<std::string, std::string> state_of_;
};

TEST_F(ForgetCliTest, ChainFolderKeepsWhatTheRulesSayAndWhy) {
  // No rule at all is a usage error (it would remove every point), as are
  // a chain folder and a policy both, or --source without a policy.
  for (const std::string& args : std::vector<std::string>{"", "--keep-last 0", "--keep-within 0", "--keep-last 1 --policy " + Q(disk_),
                                  "--keep-last 1 --source x", "--keep-within 2x"}) {
    auto r = Forget(args + " --json");
    EXPECT_EQ(r.exit_code, 64) << args << ": " << r.output;
    EXPECT_EQ(testing::ErrorOf(r.stdout_text).value("exit_code", -1), 64) << args;
  }
  EXPECT_EQ(PointIds(chain_).size(), 6u);

  // Dry run: the newest point (last 1, its day), the newest of each of the
  // two days before that have points; the rest is merged into the oldest
  // kept point.
  json dry = testing::RunResult(Barge() + " forget " + Q(chain_) + " --keep-last 1 --keep-daily 3 --dry-run --json");
  EXPECT_EQ(dry.at("chain_dir"), chain_);
  EXPECT_FALSE(dry.contains("policy"));
  EXPECT_EQ(dry.at("dry_run"), true);
  EXPECT_EQ(dry.at("keep").at("last"), 1);
  EXPECT_EQ(dry.at("keep").at("daily"), 3);
  EXPECT_EQ(dry.at("keep").at("within_seconds"), 0);
  EXPECT_EQ(dry.at("forgotten"), 3);
  ASSERT_EQ(dry.at("sources").size(), 1u);
  const json& src = dry.at("sources")[0];
  ASSERT_EQ(src.at("kept").size(), 3u) << src.dump();
  EXPECT_EQ(src.at("kept")[0].at("id"), ids_[5]);
  EXPECT_EQ(src.at("kept")[0].at("time"), kTimes[5]);
  EXPECT_EQ(src.at("kept")[0].at("reasons"), json({"last 1", "daily 2026-11-25"}));
  EXPECT_EQ(src.at("kept")[1].at("id"), ids_[4]);
  EXPECT_EQ(src.at("kept")[1].at("reasons"), json({"daily 2026-11-24"}));
  EXPECT_EQ(src.at("kept")[2].at("id"), ids_[3]);
  EXPECT_EQ(src.at("kept")[2].at("reasons"), json({"daily 2026-11-22"}));
  ASSERT_EQ(src.at("forgotten").size(), 3u);
  EXPECT_EQ(src.at("forgotten")[0].at("id"), ids_[2]);
  ASSERT_EQ(src.at("actions").size(), 1u);
  EXPECT_EQ(src.at("actions")[0].at("action"), "merge");
  EXPECT_EQ(src.at("actions")[0].at("through"), ids_[3]);
  EXPECT_EQ(src.at("actions")[0].at("ids"), json({ids_[0], ids_[1], ids_[2]}));
  EXPECT_EQ(PointIds(chain_).size(), 6u);  // nothing changed

  // The text says the same, point by point.
  auto text = Forget("--keep-last 1 --keep-daily 3 --dry-run");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.stdout_text.find("keep " + ids_[5] + ": last 1, daily 2026-11-25\n"), std::string::npos)
      << text.stdout_text;
  EXPECT_NE(text.stdout_text.find("keep " + ids_[3] + ": daily 2026-11-22\n"), std::string::npos);
  for (int i : {0, 1, 2}) {
    EXPECT_NE(text.stdout_text.find("would remove " + ids_[i] + "\n"), std::string::npos) << text.stdout_text;
  }
  EXPECT_NE(text.stdout_text.find("dry run: nothing was changed"), std::string::npos);

  // Busy: a backup or merge holds the chain lock (exit 4, nothing changed).
  {
    int fd = ::open((chain_ + "/.lock").c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX), 0);
    auto busy = Forget("--keep-last 1 --json");
    EXPECT_EQ(busy.exit_code, 4) << busy.output;
    ::close(fd);
    EXPECT_EQ(PointIds(chain_).size(), 6u);
  }

  // For real: the three older points are folded into a full of ids_[3].
  json done = testing::RunResult(Barge() + " forget " + Q(chain_) + " --keep-last 1 --keep-daily 3 --json");
  EXPECT_EQ(done.at("dry_run"), false);
  EXPECT_EQ(done.at("failed"), 0);
  EXPECT_EQ(PointIds(chain_), (std::vector<std::string>{ids_[3], ids_[4], ids_[5]}));
  // A merged full says what it is: no change tracking of its own.
  json merged = ReadJson(chain_ + "/" + ids_[3] + ".json");
  EXPECT_EQ(merged.at("type"), "full");
  EXPECT_EQ(merged.at("reason"), "merged " + ids_[0] + ".." + ids_[3]);
  EXPECT_EQ(merged.at("dirty").at("source"), "");
  EXPECT_EQ(merged.at("dirty").at("bytes"), 0);
  EXPECT_NE(ReadJson(chain_ + "/" + ids_[4] + ".json").at("dirty").at("source"), "");  // still an increment
  ExpectRemainingRestore();

  // --keep-within: every point later than the newest minus 1d12h.
  auto within = Forget("--keep-within 1d12h");
  ASSERT_EQ(within.exit_code, 0) << within.output;
  EXPECT_NE(within.stdout_text.find("keep " + ids_[4] + ": within 1d12h\n"), std::string::npos) << within.output;
  EXPECT_NE(within.stdout_text.find("remove " + ids_[3] + "\n"), std::string::npos) << within.output;
  EXPECT_EQ(PointIds(chain_), (std::vector<std::string>{ids_[4], ids_[5]}));
  ExpectRemainingRestore();

  // --keep-weekly 1 keeps only the newest point of week 48; ids_[4] is
  // folded into it.
  json weekly = testing::RunResult(Barge() + " forget " + Q(chain_) + " --keep-weekly 1 --json");
  EXPECT_EQ(weekly.at("sources")[0].at("kept")[0].at("reasons"), json({"weekly 2026-W48"}));
  EXPECT_EQ(PointIds(chain_), (std::vector<std::string>{ids_[5]}));
  ExpectRemainingRestore();

  // A folder without backups, and one that does not exist.
  fs::create_directories(dir_ / "empty");
  EXPECT_EQ(testing::Run(Barge() + " forget " + Q(dir_ / "empty") + " --keep-last 1").exit_code, 1);
  EXPECT_FALSE(fs::exists(dir_ / "empty/.lock"));
  EXPECT_EQ(testing::Run(Barge() + " forget " + Q(dir_ / "nope") + " --keep-last 1").exit_code, 1);
}

// A merged full says what it is (issue 18): the folded increments' dirty
// source and bytes are not its own.
TEST(MergedFullTest, HasNoDirtySourceOfItsOwn) {
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  const std::string disk = dir / "d.raw", extents = dir / "dirty.json";
  testing::WriteFile(disk, testing::RandomBytes(2 << 20, 9));
  const std::string backup = Barge() + " backup --source " + Q(disk) + " --target " + Q(dir / "bk") + " --name d";
  RunOk(backup);
  RunOk("qemu-io -f raw -c 'write -P 0x5a 1M 64k' " + Q(disk) + " >/dev/null");
  WriteExtentsFile(extents, {{1 << 20, 64 << 10}}, 2 << 20);
  RunOk(backup + " --incremental --dirty-extents " + Q(extents));
  const std::string chain = dir / "bk/d";
  const std::vector<std::string> ids = PointIds(chain);
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ReadJson(chain + "/" + ids[1] + ".json").at("dirty").at("source"), "extents:" + extents);
  RunOk(Barge() + " merge " + Q(chain) + " --through latest");
  json m = ReadJson(chain + "/" + ids[1] + ".json");
  EXPECT_EQ(m.at("type"), "full");
  EXPECT_EQ(m.at("reason"), "merged " + ids[0] + ".." + ids[1]);
  EXPECT_EQ(m.at("dirty").at("source"), "");
  EXPECT_EQ(m.at("dirty").at("bytes"), 0);
  json list = testing::RunResult(Barge() + " list --json " + Q(chain));
  EXPECT_EQ(list.at("points")[0].at("dirty_source"), "");
  EXPECT_EQ(list.at("points")[0].at("dirty_bytes"), 0);
  RunOk(Barge() + " restore " + Q(chain) + " --to " + Q(dir / "r.raw") + " --no-sync");
  RunOk("qemu-img compare -q -f raw -F raw " + Q(dir / "r.raw") + " " + Q(disk));
}

// `runs list` after a forget that merged: the folded points' records say
// "merged into ID" (JSON: each point's state; text: the record line), and
// the text shows each record's point ids and states.
TEST(RunsListCliTest, FoldedPointsSayWhereTheyWent) {
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  TempDir dir;
  const std::string vm = dir / "vm.qcow2", cat = dir / "catalog.db", policy = dir / "p.yaml";
  RunOk("qemu-img create -q -f qcow2 " + Q(vm) + " 4M && qemu-io -f qcow2 -c 'write -P 0x11 0 1M' " + Q(vm) +
        " >/dev/null && qemu-img bitmap --add --enable " + Q(vm) + " cbt0");
  fs::create_directories(dir / "t");
  std::ofstream(policy) << "name: fold\nsources:\n  - image: " << vm << "\n    bitmap: cbt0\nretention_count: 10\n"
                        << "targets: [" << (dir / "t") << "]\nfree_space_multiple: 0\n";
  const std::string env = "BARGE_CATALOG=" + Q(cat) + " ";
  for (int i = 0; i < 3; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // ids and times to the second
    RunOk("qemu-io -f qcow2 -c 'write -P " + std::to_string(0x20 + i) + " " + std::to_string(i + 1) + "M 64k' " +
          Q(vm) + " >/dev/null");
    RunOk(env + Barge() + " run --force --policy " + Q(policy));
  }
  const std::string chain = dir / "t/fold/vm";
  std::vector<std::string> ids = PointIds(chain);
  ASSERT_EQ(ids.size(), 3u);
  // The chain folder's forget marks the policy's records in the catalog too.
  RunOk(env + Barge() + " forget " + Q(chain) + " --keep-last 1");
  EXPECT_EQ(PointIds(chain), std::vector<std::string>{ids[2]});

  json runs = testing::RunResult(env + Barge() + " runs list --policy fold --json");
  ASSERT_EQ(runs.at("runs").size(), 3u);
  EXPECT_EQ(runs.at("runs")[0].at("point_state"), "present");
  EXPECT_EQ(runs.at("runs")[0].at("points")[0].at("state"), "present");
  for (int r : {1, 2}) {
    EXPECT_EQ(runs.at("runs")[r].at("point_state"), "removed");
    EXPECT_EQ(runs.at("runs")[r].at("points")[0].at("state"), "merged into " + ids[2]) << runs.dump();
  }
  auto text = testing::Run(env + Barge() + " runs list --policy fold");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_EQ(text.stdout_text.find("(point removed)"), std::string::npos) << text.stdout_text;
  EXPECT_NE(text.stdout_text.find("(point merged into " + ids[2] + ")"), std::string::npos) << text.stdout_text;
  for (int r : {0, 1, 2}) {
    const int64_t id = runs.at("runs")[r].at("id");
    EXPECT_NE(text.stdout_text.find("[record " + std::to_string(id) + "]"), std::string::npos) << text.stdout_text;
  }
  EXPECT_NE(text.stdout_text.find("point " + ids[2] + " in " + chain + ": present\n"), std::string::npos)
      << text.stdout_text;
  EXPECT_NE(text.stdout_text.find("point " + ids[0] + " in " + chain + ": merged into " + ids[2] + "\n"),
            std::string::npos)
      << text.stdout_text;
}

// `list --json` durations come from the manifest's own measure (fractions
// of a second); a manifest without one falls back to its whole-second times.
TEST(ListDurationTest, SubSecondFromTheManifest) {
  BARGE_REQUIRE_TOOL("qemu-img");
  TempDir dir;
  testing::WriteFile(dir / "d.raw", testing::RandomBytes(1 << 20, 7));
  RunOk(Barge() + " backup --source " + Q(dir / "d.raw") + " --target " + Q(dir / "bk") + " --name d");
  const std::string chain = dir / "bk/d";
  const std::string manifest = chain + "/" + PointIds(chain)[0] + ".json";
  json m = ReadJson(manifest);
  ASSERT_TRUE(m.contains("duration_seconds")) << m.dump();
  const double recorded = m.at("duration_seconds");
  EXPECT_GT(recorded, 0);
  EXPECT_NE(recorded, std::floor(recorded));  // not whole seconds

  json list = testing::RunResult(Barge() + " list --json " + Q(chain));
  EXPECT_EQ(list.at("points")[0].at("duration_seconds").get<double>(), recorded);

  // An older manifest: the times, to the second.
  m.erase("duration_seconds");
  m["started_at"] = "2026-11-25T10:00:00Z";
  m["finished_at"] = "2026-11-25T10:00:03Z";
  WriteJson(manifest, m);
  list = testing::RunResult(Barge() + " list --json " + Q(chain));
  EXPECT_EQ(list.at("points")[0].at("duration_seconds").get<double>(), 3.0);
}

}  // namespace
}  // namespace barge
