// Issue 40 section 1: `barge sync SRC DST` through the real binary, folder
// to folder: only the points DST lacks are copied, each verified and
// committed whole; another disk's chain and a locked DST are refused; a
// damaged source point is never copied; a killed sync resumes.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"
#include "tests/testing/sync_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMiB = 1 << 20;

// Every name in `dir` but the lock file, sorted ("" list for none).
std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> names;
  if (!fs::exists(dir)) return names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != ".lock") names.insert(e.path().filename().string());
  }
  return names;
}

// "" when every manifest in `chain` names files that are all there whole
// (the image as large as the manifest says), else what is wrong.
std::string PartialPoint(const std::string& chain) {
  if (!fs::exists(chain)) return "";
  for (const std::string& id : PointIds(chain)) {
    json m;
    try {
      m = ReadJson(ManifestPath(chain, id));
    } catch (const std::exception& e) {
      if (!fs::exists(ManifestPath(chain, id))) continue;  // removed meanwhile
      return id + ": manifest does not parse: " + e.what();
    }
    const std::string image = chain + "/" + m["image"].get<std::string>();
    std::error_code ec;
    const uint64_t size = fs::file_size(image, ec);
    if (ec) return id + ": manifest without its image";
    if (size != m["bytes_written"].get<uint64_t>()) return id + ": image of " + std::to_string(size) + " bytes";
    if (!fs::exists(chain + "/" + m["digest_table"].get<std::string>())) return id + ": no digest table";
  }
  return "";
}

class SyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveTool("qemu-img") || !HaveTool("qemu-io")) {
      if (ToolsRequired()) FAIL() << "qemu-img and qemu-io are required";
      GTEST_SKIP() << "qemu-img or qemu-io missing";
    }
    root_ = fs::canonical(dir_.path()).string();
    disk_ = root_ + "/disk.qcow2";
    MakeDisk(disk_, 16 * kMiB);
  }
  void MakeDisk(const std::string& path, uint64_t size) { MakeCbtDisk(path, size); }
  void Change(const std::string& disk, const std::string& pattern, const std::string& where) {
    RunOk("qemu-io -f qcow2 -c 'write -P " + pattern + " " + where + " 256k' " + Q(disk) + " >/dev/null");
  }
  // A backup of `disk` into TARGET/disk: a full, or an incremental by cbt0.
  void Backup(const std::string& disk, const std::string& target, bool incremental) {
    RunOk(Barge("backup --compress none --source " + Q(disk) + " --target " + Q(target) + " --name disk" +
                (incremental ? " --incremental --dirty-bitmap cbt0" : "")));
  }
  TempDir dir_;
  std::string root_, disk_;
};

TEST_F(SyncTest, CopiesMissingPointsVerifiedThenOnlyTheNewOne) {
  const std::string a = root_ + "/A", b = root_ + "/B";
  Backup(disk_, a, false);
  Change(disk_, "0x11", "1M");
  Backup(disk_, a, true);
  Change(disk_, "0x22", "5M");
  Backup(disk_, a, true);
  const std::vector<std::string> ids = PointIds(a + "/disk");
  ASSERT_EQ(ids.size(), 3u);

  json r = RunResult(Barge("sync --json " + Q(a + "/disk") + " " + Q(b + "/disk")));
  EXPECT_EQ(r["copied"], 3) << r.dump();
  EXPECT_EQ(r["skipped"], 0) << r.dump();
  ASSERT_EQ(r["chains"].size(), 1u) << r.dump();
  for (const json& p : r["chains"][0]["points"]) {
    EXPECT_EQ(p["action"], "copied") << r.dump();
    EXPECT_TRUE(p["verified"].get<bool>()) << r.dump();
  }
  EXPECT_EQ(PointIds(b + "/disk"), ids);
  RunOk(Barge("verify --all " + Q(b + "/disk")));
  RunOk(Barge("restore " + Q(b + "/disk") + " --to " + Q(root_ + "/out.raw")));
  RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(disk_) + " " + Q(root_ + "/out.raw"));

  // One more point: only it moves, its files' bytes reported.
  Change(disk_, "0x33", "9M");
  Backup(disk_, a, true);
  const std::string fourth = PointIds(a + "/disk").back();
  r = RunResult(Barge("sync --json " + Q(a + "/disk") + " " + Q(b + "/disk")));
  EXPECT_EQ(r["copied"], 1) << r.dump();
  EXPECT_EQ(r["skipped"], 3) << r.dump();
  EXPECT_EQ(r["bytes"].get<uint64_t>(), PointBytes(a + "/disk", fourth)) << r.dump();
  EXPECT_EQ(r["chains"][0]["points"][3]["id"], fourth) << r.dump();
  // Text mode, nothing left to copy.
  CommandResult t = Sh(Barge("sync " + Q(a + "/disk") + " " + Q(b + "/disk")));
  EXPECT_EQ(t.exit_code, 0) << t.output;
  EXPECT_TRUE(Has(t.output, "nothing to copy (DST has all 4 points)")) << t.output;
  EXPECT_TRUE(Has(t.output, "skipped " + fourth)) << t.output;
}

TEST_F(SyncTest, TargetFolderSyncsEveryChainUnderIt) {
  const std::string other = root_ + "/other.qcow2";
  MakeDisk(other, 4 * kMiB);
  Backup(disk_, root_ + "/A", false);
  RunOk(Barge("backup --compress none --source " + Q(other) + " --target " + Q(root_ + "/A") + " --name other"));
  json r = RunResult(Barge("sync --json " + Q(root_ + "/A") + " " + Q(root_ + "/B")));
  EXPECT_EQ(r["copied"], 2) << r.dump();
  EXPECT_EQ(PointIds(root_ + "/B/disk").size(), 1u);
  EXPECT_EQ(PointIds(root_ + "/B/other").size(), 1u);
}

// "clone" sorts before "golden", the base it stands on: a target's sync
// copies the base first, so the clone's copy verifies in DST.
TEST_F(SyncTest, TargetFolderSyncCopiesABaseBeforeItsClone) {
  const std::string golden = root_ + "/golden.raw", clone = root_ + "/clone.qcow2";
  WriteFile(golden, RandomBytes(4 * kMiB, 23));
  RunOk(Barge("backup --compress none --source " + Q(golden) + " --target " + Q(root_ + "/A") + " --name golden"));
  RunOk("qemu-img create -q -f qcow2 -b golden.raw -F raw " + Q(clone) + " && qemu-io -f qcow2 -c 'write -P 0x55 "
        "512k 128k' " + Q(clone) + " >/dev/null");
  RunOk(Barge("backup --source " + Q(clone) + " --target " + Q(root_ + "/A") + " --name clone --base golden"));
  // The clone alone, its base not in DST: refused before any copy.
  CommandResult alone = Sh(Barge("sync " + Q(root_ + "/A/clone") + " " + Q(root_ + "/C/clone")));
  EXPECT_EQ(alone.exit_code, 1) << alone.output;
  EXPECT_TRUE(Has(alone.output, "barge: NotFound: ")) << alone.output;
  EXPECT_TRUE(Has(alone.output, "sync its base chain first")) << alone.output;
  EXPECT_FALSE(fs::exists(root_ + "/C"));
  json r = RunResult(Barge("sync --json " + Q(root_ + "/A") + " " + Q(root_ + "/B")));
  EXPECT_EQ(r["copied"], 2) << r.dump();
  ASSERT_EQ(r["chains"].size(), 2u) << r.dump();
  EXPECT_EQ(r["chains"][0]["src"], root_ + "/A/golden") << r.dump();
  RunOk(Barge("verify " + Q(root_ + "/B/clone")));
  RunOk(Barge("restore " + Q(root_ + "/B/clone") + " --to " + Q(root_ + "/out.raw")));
  RunOk("qemu-img compare -q -f qcow2 -F raw " + Q(clone) + " " + Q(root_ + "/out.raw"));
}

TEST_F(SyncTest, AnotherDisksChainUnderTheNameIsRefusedAndNothingWritten) {
  const std::string other = root_ + "/other.qcow2";
  MakeDisk(other, 16 * kMiB);
  Backup(disk_, root_ + "/A", false);
  Backup(other, root_ + "/C", false);
  const std::set<std::string> before = Names(root_ + "/C/disk");
  CommandResult r = Sh(Barge("sync " + Q(root_ + "/A/disk") + " " + Q(root_ + "/C/disk")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "barge: InvalidArgument: " + root_ + "/C/disk: ")) << r.output;
  EXPECT_TRUE(Has(r.output, "another disk's chain")) << r.output;
  EXPECT_TRUE(Has(r.output, other)) << r.output;
  EXPECT_EQ(Names(root_ + "/C/disk"), before);
}

TEST_F(SyncTest, DamagedSourcePointIsNotCopied) {
  const std::string a = root_ + "/A/disk";
  Backup(disk_, root_ + "/A", false);
  ASSERT_NO_FATAL_FAILURE(DamageFirstPoint(a));
  CommandResult r = Sh(Barge("sync " + Q(a) + " " + Q(root_ + "/D/disk")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Has(r.output, "barge: Corruption: ")) << r.output;
  EXPECT_TRUE(Has(r.output, "does not verify; not copied")) << r.output;
  EXPECT_FALSE(fs::exists(root_ + "/D")) << "nothing written";
}

TEST_F(SyncTest, LockedDestinationExitsBusy) {
  Backup(disk_, root_ + "/A", false);
  RunOk(Barge("sync " + Q(root_ + "/A/disk") + " " + Q(root_ + "/B/disk")));
  Change(disk_, "0x44", "2M");
  Backup(disk_, root_ + "/A", true);
  int fd = ::open((root_ + "/B/disk/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  CommandResult r = Sh(Barge("sync " + Q(root_ + "/A/disk") + " " + Q(root_ + "/B/disk")));
  ::close(fd);
  EXPECT_EQ(r.exit_code, 4) << r.output;
  EXPECT_TRUE(Has(r.output, "barge: Busy: ")) << r.output;
  EXPECT_EQ(PointIds(root_ + "/B/disk").size(), 1u);
  RunOk(Barge("sync " + Q(root_ + "/A/disk") + " " + Q(root_ + "/B/disk")));
  EXPECT_EQ(PointIds(root_ + "/B/disk").size(), 2u);
}

// Starts `barge sync SRC DST` and watches DST until a staged image of more
// than 8 MiB is there: returns its pid then (-1 when it ended first), and in
// `partial` what PartialPoint saw meanwhile ("" for nothing).
pid_t StartSyncUntilStaged(const std::string& src, const std::string& dst, std::string* partial) {
  const std::string cmd = Barge("sync " + Q(src) + " " + Q(dst)) + " >/dev/null 2>&1";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::string p = PartialPoint(dst); !p.empty() && partial->empty()) *partial = p;
    for (const std::string& name : Names(dst)) {
      std::error_code ec;
      if (name.find(".barge-tmp") != std::string::npos && fs::file_size(dst + "/" + name, ec) > 8 * kMiB) {
        return pid;
      }
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return -1;
}

class SyncKillTest : public SyncTest {
 protected:
  void SetUp() override {
    SyncTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    const std::string big = root_ + "/big.qcow2";
    MakeDisk(big, 192 * kMiB);
    Backup(big, root_ + "/A", false);
    Change(big, "0x55", "1M");
    Backup(big, root_ + "/A", true);
    src_ = root_ + "/A/disk";
    dst_ = root_ + "/B/disk";
  }
  std::string src_, dst_;
};

TEST_F(SyncKillTest, KilledSyncShowsOnlyWholePointsAndResumes) {
  std::string partial;
  const pid_t pid = StartSyncUntilStaged(src_, dst_, &partial);
  ASSERT_GT(pid, 0) << "the sync ended before it could be killed";
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_EQ(partial, "");
  EXPECT_EQ(PartialPoint(dst_), "");
  EXPECT_LT(PointIds(dst_).size(), 2u);

  json r = RunResult(Barge("sync --json " + Q(src_) + " " + Q(dst_)));
  EXPECT_EQ(PointIds(dst_), PointIds(src_)) << r.dump();
  for (const std::string& name : Names(dst_)) {
    EXPECT_EQ(name.find(".barge-tmp"), std::string::npos) << name;
  }
  RunOk(Barge("verify --all " + Q(dst_)));
}

TEST_F(SyncKillTest, InterruptedSyncExits130LeavingNoTemporary) {
  std::string partial;
  const pid_t pid = StartSyncUntilStaged(src_, dst_, &partial);
  ASSERT_GT(pid, 0) << "the sync ended before it could be interrupted";
  ASSERT_EQ(::kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_EQ(PartialPoint(dst_), "");
  for (const std::string& name : Names(dst_)) {
    EXPECT_EQ(name.find(".barge-tmp"), std::string::npos) << name;
  }
}

}  // namespace
}  // namespace barge::testing
