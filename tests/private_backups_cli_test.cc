// Issue 35, item 5: backups of a private disk stay private. A new chain
// (folder and every file barge writes in it) and a restored file are the
// owner's alone whatever the umask; `--group NAME` lets one group read
// them (folders 0750 setgid, files 0640, group-owned); a later point keeps
// its chain folder's access; a chain made before keeps working.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using testing::Barge;
using testing::Q;
using testing::RunOk;
using testing::Sh;

constexpr uint64_t kSize = 1 << 20;

struct st_info {
  uint32_t mode = 0;
  uint32_t gid = 0;
};

st_info StatOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return {static_cast<uint32_t>(st.st_mode & 07777), static_cast<uint32_t>(st.st_gid)};
}

std::string Octal(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
}

class PrivateBackupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("runuser");
    // The test's folder is traversable by everyone, as a backup volume's
    // mount point is: only barge's own modes keep other users out.
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                     fs::perms::others_read | fs::perms::others_exec);
    disk_ = dir_ / "disk.raw";
    testing::WriteFile(disk_, testing::RandomBytes(kSize, 35));
    ::chmod(disk_.c_str(), 0600);  // a private disk
    testing::WriteExtentsFile(dir_ / "dirty.json", {{0, 64 << 10}}, kSize);
  }

  // `barge ARGS` under `umask`.
  void BargeUnder(const std::string& umask, const std::string& args) {
    RunOk("umask " + umask + " && " + Barge(args));
  }

  // A full and an incremental into TARGET (made by barge), then a restore
  // of the chain to OUT.
  void BackupAndRestore(const std::string& umask, const std::string& target, const std::string& out,
                        const std::string& extra = "") {
    BargeUnder(umask, "backup --source " + Q(disk_) + " --target " + Q(target) + " --name vda" + extra);
    BargeUnder(umask, "backup --source " + Q(disk_) + " --target " + Q(target) +
                          " --name vda --incremental --dirty-extents " + Q(dir_ / "dirty.json"));
    BargeUnder(umask, "restore " + Q(target + "/vda") + " --to " + Q(out) + extra);
  }

  // Every folder under `root` (itself included) has `dir_mode`, every file
  // `file_mode`; with `gid`, every one is that group's. Returns how many
  // files were looked at.
  size_t ExpectModes(const std::string& root, uint32_t dir_mode, uint32_t file_mode, int64_t gid = -1) {
    size_t files = 0;
    auto check = [&](const std::string& p, bool dir) {
      st_info s = StatOf(p);
      EXPECT_EQ(Octal(s.mode), Octal(dir ? dir_mode : file_mode)) << p;
      if (gid >= 0) {
        EXPECT_EQ(s.gid, static_cast<uint32_t>(gid)) << p;
      }
    };
    check(root, true);
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      check(e.path().string(), e.is_directory());
      if (!e.is_directory()) ++files;
    }
    return files;
  }

  // The first point's image in the chain folder.
  std::string FirstImage(const std::string& chain) {
    return chain + "/" + testing::PointIds(chain).front() + ".qcow2";
  }

  testing::TempDir dir_;
  std::string disk_;
};

TEST_F(PrivateBackupsTest, ChainsAndRestoresArePrivateWhateverTheUmask) {
  for (const std::string umask : {"022", "000"}) {
    SCOPED_TRACE("umask " + umask);
    const std::string target = dir_ / ("bk" + umask), out = dir_ / ("out" + umask + ".raw");
    BackupAndRestore(umask, target, out);
    // Points, manifests, digest tables, verification records (restore
    // writes one), the lock: 0600 in 0700 folders.
    EXPECT_GE(ExpectModes(target, 0700, 0600), 7u);
    EXPECT_EQ(Octal(StatOf(out).mode), "0600");
    EXPECT_EQ(testing::Slurp(out), testing::Slurp(disk_));
    // Another local user reads neither the backup nor the restored disk.
    EXPECT_NE(Sh("runuser -u nobody -- cat " + Q(FirstImage(target + "/vda")) + " >/dev/null 2>&1").exit_code, 0);
    EXPECT_NE(Sh("runuser -u nobody -- cat " + Q(out) + " >/dev/null 2>&1").exit_code, 0);
  }
  // A merge writes its new full and journal as privately.
  BargeUnder("000", "merge " + Q(dir_ / "bk000/vda") + " --through latest");
  ExpectModes(dir_ / "bk000", 0700, 0600);
}

TEST_F(PrivateBackupsTest, GroupReadsWhatItIsGiven) {
  struct group* g = ::getgrnam("daemon");
  if (g == nullptr) GTEST_SKIP() << "no group 'daemon'";
  const uint32_t gid = g->gr_gid;
  // umask 077 would take the group's bits away: barge puts them back.
  const std::string target = dir_ / "bk", out = dir_ / "out.raw";
  BackupAndRestore("077", target, out, " --group daemon");
  // The incremental was taken without --group: the chain keeps its group.
  EXPECT_GE(ExpectModes(target, 02750, 0640, gid), 7u);
  EXPECT_EQ(Octal(StatOf(out).mode), "0640");
  EXPECT_EQ(StatOf(out).gid, gid);
  const std::string image = FirstImage(target + "/vda");
  EXPECT_EQ(Sh("runuser -u nobody -g daemon -- cat " + Q(image) + " >/dev/null").exit_code, 0);
  EXPECT_NE(Sh("runuser -u nobody -- cat " + Q(image) + " >/dev/null 2>&1").exit_code, 0);
  EXPECT_EQ(Sh("runuser -u nobody -g daemon -- cat " + Q(out) + " >/dev/null").exit_code, 0);

  // A private chain shared later: merge --group gives the folder and its
  // files to the group.
  BargeUnder("022", "backup --source " + Q(disk_) + " --target " + Q(dir_ / "priv") + " --name vda");
  BargeUnder("022", "backup --source " + Q(disk_) + " --target " + Q(dir_ / "priv") +
                        " --name vda --incremental --dirty-extents " + Q(dir_ / "dirty.json"));
  ExpectModes(dir_ / "priv", 0700, 0600);
  BargeUnder("022", "merge " + Q(dir_ / "priv/vda") + " --through latest --group daemon");
  ExpectModes(dir_ / "priv/vda", 02750, 0640, gid);

  // An unknown group is a usage error, before anything is written.
  auto r = Sh(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "none") +
                    " --name vda --group no-such-group-35"));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "none"));
}

TEST_F(PrivateBackupsTest, ExistingChainsAndFilesKeepTheirModes) {
  // A chain made before: 0755 folders, 0644 files. It keeps working, and
  // its new point is as readable as its folder says.
  const std::string target = dir_ / "old";
  BargeUnder("022", "backup --source " + Q(disk_) + " --target " + Q(target) + " --name vda");
  RunOk("chmod -R u=rwX,go=rX " + Q(target));
  BargeUnder("022", "backup --source " + Q(disk_) + " --target " + Q(target) +
                        " --name vda --incremental --dirty-extents " + Q(dir_ / "dirty.json"));
  EXPECT_GE(ExpectModes(target, 0755, 0644), 5u);
  RunOk(Barge("verify " + Q(target + "/vda") + " --all"));
  // A restore over an existing (empty) file keeps that file's mode.
  const std::string out = dir_ / "out.raw";
  RunOk("touch " + Q(out) + " && chmod 0604 " + Q(out));
  BargeUnder("022", "restore " + Q(target + "/vda") + " --to " + Q(out));
  EXPECT_EQ(Octal(StatOf(out).mode), "0604");
  EXPECT_EQ(testing::Slurp(out), testing::Slurp(disk_));
}

}  // namespace
}  // namespace barge
