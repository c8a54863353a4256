// Issue 12, what a new user hit with bad input on purpose, through the real
// binary: each test is named after the defect and checks the exit code, the
// message and what is (not) left on disk. Text output only (no --json).
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;

// Hidden temporaries, lock files and staged merge files under `dir`.
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.ends_with(".barge-tmp") || name.ends_with(".merge-new") || name == ".lock") {
      found.push_back(it->path().string());
    }
  }
  return found;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

class UserMixupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    disk_ = dir_ / "disk.raw";
    WriteFile(disk_, RandomBytes(4 * kMiB, 12));
  }
  // A chain of two full backups of disk_ under dir_/bk/d.
  std::string TwoPointChain() {
    RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") + " --name d"));
    RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") + " --name d"));
    return dir_ / "bk/d";
  }
  TempDir dir_;
  std::string disk_;
};

// "--threads 99999" aborted (pthread_create failed, exit 134) leaving
// .X.barge-tmp files. Out-of-range values are usage errors naming the
// range, before anything is written.
TEST_F(UserMixupsTest, ThreadsAndMemoryOutOfRangeAreUsageErrorsNamingTheRange) {
  const std::string out = dir_ / "out.raw";
  for (std::string flags : {"--threads 99999", "--threads -1", "--memory 1K", "--memory 1P"}) {
    for (const std::string& cmd :
         std::vector<std::string>{"convert -f raw " + Q(disk_) + " " + Q(out) + " " + flags,
          "backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") + " " + flags,
          "replicate " + Q(disk_) + " --to " + Q(out) + " " + flags}) {
      CommandResult r = Sh(Barge(cmd));
      EXPECT_EQ(r.exit_code, 64) << cmd << "\n" << r.output;
      EXPECT_NE(r.output.find(flags.substr(0, flags.find(' ')) + " must be from"), std::string::npos) << r.output;
    }
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(dir_ / "bk"));
  EXPECT_TRUE(Leftovers(dir_.path().string()).empty()) << Join(Leftovers(dir_.path().string()));
}

// A thread that cannot start (here: too little address space for its
// stack) is an error with exit 1, never an abort, and leaves no temporary.
// Which limit starts the process but starves its threads depends on the
// machine: several are tried; none may abort or crash. (A worker oneTBB
// could not start used to end in std::terminate, and now and then in a
// SIGSEGV of another worker, exit 139, at 125 and 275 MiB here; the copy
// now starts only the workers that fit under the limit, pipeline/copy.cc.)
TEST_F(UserMixupsTest, ThreadStartFailureIsAnErrorNotAnAbort) {
  const std::string big = dir_ / "big.raw";
  WriteFile(big, RandomBytes(64 * kMiB, 3));
  const std::string out = dir_ / "out.raw";
  int thread_errors = 0;
  for (int mib = 100; mib <= 400; mib += 25) {
    CommandResult r = Sh("ulimit -c 0; ulimit -v " + std::to_string(mib * 1024) + "; " +
                          Barge("convert -f raw " + Q(big) + " " + Q(out) + " --force --threads 16 --memory 16M"));
    // 127: the loader itself found too little room (before barge ran).
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1 || r.exit_code == 127)
        << "ulimit -v " << mib << "M: exit " << r.exit_code << "\n" << r.output;
    if (r.output.find("could not start a thread") != std::string::npos) ++thread_errors;
    EXPECT_FALSE(fs::exists(dir_ / ".out.raw.barge-tmp")) << "ulimit -v " << mib << "M";
  }
  RecordProperty("thread_errors", thread_errors);
}

// "bench generate --size 1000" wrote a 0-byte disk and exited 0; "bench
// --size 0" printed a table of zeros.
TEST_F(UserMixupsTest, BenchTinySizesAreRefused) {
  const std::string g = dir_ / "g.raw";
  CommandResult r = Sh(Barge("bench generate --size 1000 " + Q(g)));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_NE(r.output.find("at least 1 MiB"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(g));
  r = Sh(Barge("bench generate --size 1049000 " + Q(g)));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_NE(r.output.find("multiple of 4 KiB"), std::string::npos) << r.output;
  r = Sh(Barge("bench --size 0 --workdir " + Q(dir_.path().string())));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_EQ(r.output.find("MiB/s"), std::string::npos) << r.output;  // no table
  RunOk(Barge("bench generate --size 1M " + Q(g)));
  EXPECT_EQ(fs::file_size(g), kMiB);
}

// "merge bk/nonexist" said ".lock: open lock failed".
TEST_F(UserMixupsTest, MergeOfMissingChainSaysTheChainDoesNotExist) {
  const std::string chain = dir_ / "bk/nonexist";
  CommandResult r = Sh(Barge("merge " + Q(chain) + " --through latest"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(chain + ": no such chain folder"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(".lock"), std::string::npos) << r.output;
  fs::create_directories(dir_ / "bk/empty");
  r = Sh(Barge("merge " + Q(dir_ / "bk/empty") + " --through latest"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("holds no backups"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::is_empty(dir_ / "bk/empty"));  // no .lock left
}

// "verify disk.qcow2" of a plain image named the missing manifest file.
TEST_F(UserMixupsTest, VerifyOfAnImageWithoutManifestSaysSo) {
  const std::string image = dir_ / "disk.qcow2";
  RunOk(Barge("convert -f raw " + Q(disk_) + " " + Q(image) + " -O qcow2"));
  CommandResult r = Sh(Barge("verify " + Q(image)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(image + ": no backup manifest beside it (disk.json)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("barge check"), std::string::npos) << r.output;
}

// "restore --to /dev/null" failed on an internal temporary name.
TEST_F(UserMixupsTest, RestoreToDevNullExplains) {
  const std::string chain = TwoPointChain();
  CommandResult r = Sh(Barge("restore " + Q(chain) + " --to /dev/null"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/dev/null: is not a regular file or block device"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("barge-tmp"), std::string::npos) << r.output;
  struct stat st {};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  r = Sh(Barge("restore " + Q(chain) + " --to " + Q(dir_ / "missing/r.raw")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir_ / "missing" + ": the output's folder does not exist"), std::string::npos)
      << r.output;
  r = Sh(Barge("convert -f raw " + Q(disk_) + " /dev/null"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("/dev/null: is not a regular file or block device"), std::string::npos) << r.output;
}

// NBD URIs in info/compare were opened as file names.
TEST_F(UserMixupsTest, InfoMapAndCompareReadNbdUrisCheckRefusesThemByName) {
  BARGE_REQUIRE_TOOL("qemu-nbd");
  const std::string sock = dir_ / "nbd.sock";
  SocketServer nbd("qemu-nbd -r -t -f raw --socket=" + Q(sock) + " " + Q(disk_), sock);
  ASSERT_TRUE(nbd.WaitReady());
  std::string info = RunOk(Barge("info " + Q(nbd.uri())));
  EXPECT_NE(info.find("virtual size: 4 MiB (4194304 bytes)"), std::string::npos) << info;
  RunOk(Barge("map " + Q(nbd.uri())));
  std::string same = RunOk(Barge("compare " + Q(nbd.uri()) + " " + Q(disk_)));
  EXPECT_NE(same.find("identical"), std::string::npos) << same;
  CommandResult r = Sh(Barge("check " + Q(nbd.uri())));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(nbd.uri() + ": check reads a qcow2 file"), std::string::npos) << r.output;
}

// "overlay create --data-file X.qcow2" made a qcow2 the "raw" data file.
TEST_F(UserMixupsTest, OverlayDataFileThatIsAnImageIsRefused) {
  const std::string image = dir_ / "X.qcow2";
  RunOk(Barge("convert -f raw " + Q(disk_) + " " + Q(image) + " -O qcow2"));
  const std::string overlay = dir_ / "overlay.qcow2";
  CommandResult r = Sh(Barge("overlay create --data-file " + Q(image) + " " + Q(overlay)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is a qcow2 image, not a raw disk"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(overlay));
  RunOk(Barge("overlay create --data-file " + Q(disk_) + " " + Q(overlay)));
}

// "check" on a raw file said corruption (exit 2).
TEST_F(UserMixupsTest, CheckOfANonQcow2FileIsAnInputError) {
  CommandResult r = Sh(Barge("check " + Q(disk_)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(disk_ + ": not a qcow2 image"), std::string::npos) << r.output;
}

// A file named .qcow2 holding raw bytes was read as raw without a word.
TEST_F(UserMixupsTest, Qcow2NamedRawFileGetsAWarning) {
  const std::string misnamed = dir_ / "really-raw.qcow2";
  fs::copy_file(disk_, misnamed);
  CommandResult r = Sh(Barge("info " + Q(misnamed)));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("barge: warning: " + misnamed + ": named .qcow2 but holds no qcow2 header"),
            std::string::npos)
      << r.output;
  r = Sh(Barge("info -f raw " + Q(misnamed)));
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  r = Sh(Barge("convert " + Q(misnamed) + " " + Q(dir_ / "o.raw")));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning"), std::string::npos) << r.output;
}

// A full backup of a disk of another size went into an existing chain.
TEST_F(UserMixupsTest, FullBackupOfAnotherSizeIntoAChainIsRefused) {
  const std::string chain = TwoPointChain();
  const std::string other = dir_ / "other/disk.raw";
  fs::create_directories(dir_ / "other");
  WriteFile(other, RandomBytes(6 * kMiB, 13));
  CommandResult r = Sh(Barge("backup --source " + Q(other) + " --target " + Q(dir_ / "bk") + " --name d"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is of a 4 MiB (4194304 bytes) disk"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("6 MiB (6291456 bytes)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--allow-resize"), std::string::npos) << r.output;
  RunOk(Barge("backup --source " + Q(other) + " --target " + Q(dir_ / "bk") + " --name d --allow-resize"));
}

// A failed first backup left a .lock and an empty chain folder.
TEST_F(UserMixupsTest, FailedFirstBackupLeavesNoLockOrFolder) {
  CommandResult r = Sh(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") +
                              " --name d --incremental --dirty-extents " + Q(dir_ / "none.json")));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "bk")) << Join(Leftovers(dir_.path().string()));
  fs::create_directories(dir_ / "bk2");
  r = Sh(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk2") +
                " --name d --incremental --dirty-extents " + Q(dir_ / "none.json")));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir_ / "bk2"));  // the user's folder stays
  EXPECT_TRUE(fs::is_empty(dir_ / "bk2"));
}

// "image cleanup --unused-for 0" removed every copy of an image.
TEST_F(UserMixupsTest, ImageCleanupNeverRemovesTheLastReadyCopy) {
  const std::string db = dir_ / "catalog.db";
  auto image = [&](const std::string& args) { return Barge("image " + args + " --catalog " + Q(db)); };
  RunOk(image("add base --source " + Q(disk_) + " --disk " + Q(dir_ / "disk0")));
  std::string out = RunOk(image("cleanup --unused-for 0"));
  EXPECT_NE(out.find("last ready copy"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir_ / "disk0/base.raw"));
  RunOk(image("sync base --disks " + Q(dir_ / "disk1")));
  out = RunOk(image("cleanup --unused-for 0 --dry-run"));
  EXPECT_NE(out.find("would remove"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir_ / "disk0/base.raw"));
  EXPECT_TRUE(fs::exists(dir_ / "disk1/base.raw"));
  out = RunOk(image("cleanup --unused-for 0"));
  EXPECT_NE(out.find("removed "), std::string::npos) << out;
  EXPECT_NE(out.find("last ready copy"), std::string::npos) << out;
  EXPECT_NE(fs::exists(dir_ / "disk0/base.raw"), fs::exists(dir_ / "disk1/base.raw"));  // exactly one left
}

// A failed "image add" left a failed row (and the image) in the catalog.
TEST_F(UserMixupsTest, FailedImageAddLeavesNoCatalogRow) {
  const std::string db = dir_ / "catalog.db";
  auto image = [&](const std::string& args) { return Barge("image " + args + " --catalog " + Q(db)); };
  CommandResult r = Sh(image("add base --source " + Q(disk_) + " --disk " + Q(dir_ / "disk0") +
                              " --expected-sha512 " + std::string(128, 'a')));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mismatch"), std::string::npos) << r.output;
  r = Sh(image("status base"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no image 'base'"), std::string::npos) << r.output;
  EXPECT_EQ(RunOk(image("status")), "");
  EXPECT_FALSE(fs::exists(dir_ / "disk0/base.raw"));
  RunOk(image("add base --source " + Q(disk_) + " --disk " + Q(dir_ / "disk0")));
}

// An explicit --catalog in a missing folder silently made a new catalog.
TEST_F(UserMixupsTest, ExplicitCatalogInAMissingFolderIsAnError) {
  const std::string db = dir_ / "typo/catalog.db";
  CommandResult r = Sh(Barge("image status --catalog " + Q(db)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(dir_ / "typo" + ": the folder of --catalog"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "typo"));
  r = Sh(Barge("image status --catalog " + Q(dir_.path().string())));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("names a folder"), std::string::npos) << r.output;
}

// "verify --compress" and friends were accepted and ignored.
TEST_F(UserMixupsTest, OptionsThatMeanNothingForACommandAreRefused) {
  const std::string chain = TwoPointChain();
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {"verify " + Q(chain) + " --compress zstd", "--compress does not apply to verify: verify only reads"},
           {"verify " + Q(chain) + " --cluster-size 1M", "--cluster-size does not apply to verify"},
           {"restore " + Q(chain) + " --to " + Q(dir_ / "r.raw") + " --cluster-size 1M",
            "--cluster-size does not apply to restore: a restore keeps the chain's cluster size"},
           {"restore " + Q(chain) + " --to " + Q(dir_ / "r.raw") + " --compress zstd", "--compress needs -O qcow2"},
           {"merge " + Q(chain) + " --through latest --compress zstd", "--compress does not apply to merge"},
           {"convert -f raw " + Q(disk_) + " " + Q(dir_ / "c.raw") + " --cluster-size 1M",
            "--cluster-size needs -O qcow2"},
           {"replicate " + Q(disk_) + " --to " + Q(dir_ / "rep.raw") + " --compress zstd",
            "--compress applies to qcow2 copies"},
           {"verify " + Q(chain) + " --all --at 0", "--at and --all exclude each other"},
           {"verify " + Q(chain) + " --against-format raw", "--against-format needs --against"},
           {"convert -f raw " + Q(disk_) + " " + Q(dir_ / "c.qcow2") + " -O qcow2 --backing-format raw",
            "--backing-format needs --backing"},
           {"backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") +
                " --name d --incremental --dirty-extents x.json --cluster-size 1M",
            "--cluster-size does not apply to an incremental"},
       }) {
    CommandResult r = Sh(Barge(c.args));
    EXPECT_EQ(r.exit_code, 64) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(dir_ / "r.raw"));
  EXPECT_FALSE(fs::exists(dir_ / "c.raw"));
  EXPECT_FALSE(fs::exists(dir_ / "rep.raw"));
  std::string help = RunOk(Barge("verify --help"));
  EXPECT_EQ(help.find("--compress"), std::string::npos) << help;
}

// "restore --at 2026-11-24T01:05:49-05:00" restored the oldest point;
// "...Zjunk" was accepted. The chosen point is printed.
TEST_F(UserMixupsTest, RestoreAtTimePicksTheNewestPointBeforeTheInstantAndSaysWhich) {
  const std::string chain = TwoPointChain();
  const std::vector<std::string> ids = PointIds(chain);
  ASSERT_EQ(ids.size(), 2u);
  // Far in the future, written with an offset: the newest point.
  std::string out = RunOk(Barge("restore " + Q(chain) + " --at 2999-01-01T01:05:49-05:00 --to " +
                                Q(dir_ / "r.raw")));
  EXPECT_NE(out.find("restored point " + ids[1] + " (position 1, taken "), std::string::npos) << out;
  CommandResult r = Sh(Barge("restore " + Q(chain) + " --at 2999-01-01T01:05:49Zjunk --to " + Q(dir_ / "j.raw")));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_NE(r.output.find("junk"), std::string::npos) << r.output;
  r = Sh(Barge("restore " + Q(chain) + " --at '2000-01-01 00:00:00Z' --to " + Q(dir_ / "old.raw")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no backup started at or before"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the oldest, " + ids[0]), std::string::npos) << r.output;
  out = RunOk(Barge("restore " + Q(chain) + " --at 0 --to " + Q(dir_ / "r0.raw")));
  EXPECT_NE(out.find("restored point " + ids[0] + " (position 0"), std::string::npos) << out;
  out = RunOk(Barge("verify " + Q(chain) + " --at " + ids[0]));
  EXPECT_NE(out.find("verified " + ids[0] + " (position 0"), std::string::npos) << out;
  // A merge keeps ids; positions are indexes in what is left.
  out = RunOk(Barge("merge " + Q(chain) + " --through 1 --dry-run"));
  EXPECT_NE(out.find("nothing to merge"), std::string::npos) << out;  // both are fulls
}

}  // namespace
}  // namespace barge::testing
