// Issue 18: the smaller CLI findings, through the real binary. Each test is
// named after the defect and checks the exit code, the message and what
// the command printed.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/testing/cli_testing.h"
#include "tests/testing/testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;

class CliFindingsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    disk_ = dir_ / "disk.raw";
    WriteFile(disk_, RandomBytes(4 * kMiB, 18));
  }
  // A full and `incrementals` incrementals of disk_ into TARGET/d (extents
  // from a file): returns the chain folder.
  std::string Chain(int incrementals) {
    const std::string target = dir_ / "bk";
    RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name d --compress none"));
    const std::string extents = dir_ / "extents.json";
    WriteExtentsFile(extents, {{0, 64 << 10}}, 4 * kMiB);
    for (int i = 0; i < incrementals; ++i) {
      RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) +
                  " --name d --incremental --dirty-extents " + Q(extents)));
    }
    return target + "/d";
  }
  TempDir dir_;
  std::string disk_;
};

// `barge list TARGET` of a policy target (chains at TARGET/<policy>/<source>/)
// said "no backups".
TEST_F(CliFindingsTest, ListOfAPolicyTargetListsTheChainFoldersBelow) {
  const std::string target = dir_ / "t";
  fs::create_directories(target);
  WriteFile(dir_ / "other.raw", RandomBytes(2 * kMiB, 19));
  const std::string policy = dir_ / "nightly.yaml";
  WriteText(policy, "name: nightly\nsources:\n  - image: " + disk_ + "\n  - image: " + (dir_ / "other.raw") +
                        "\ntargets: [" + target + "]\nfree_space_multiple: 0\n");
  const std::string catalog = "--catalog " + Q(dir_ / "catalog.db");
  RunOk(Barge("run --policy " + Q(policy) + " --force " + catalog));
  ASSERT_TRUE(fs::is_directory(target + "/nightly/disk")) << RunOk("find " + Q(target));
  CommandResult r = Sh(Barge("list " + Q(target)));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(Has(r.output, "no backups")) << r.output;
  EXPECT_TRUE(Has(r.output, "2 chain folders below it")) << r.output;
  EXPECT_TRUE(Has(r.output, "nightly/disk ")) << r.output;
  EXPECT_TRUE(Has(r.output, "nightly/other ")) << r.output;

  nlohmann::json list = RunResult(Barge("list --json " + Q(target)));
  ASSERT_EQ(list["points"].size(), 0u) << list.dump();
  const auto& folders = list["chain_folders"];
  ASSERT_EQ(folders.size(), 2u) << list.dump();
  EXPECT_EQ(folders[0]["path"], target + "/nightly/disk");
  EXPECT_EQ(folders[1]["path"], target + "/nightly/other");
  // The same facts `list` of the folder itself gives.
  nlohmann::json disk_list = RunResult(Barge("list --json " + Q(target + "/nightly/disk")));
  EXPECT_EQ(folders[0]["points"], disk_list["points"].size());
  EXPECT_EQ(folders[0]["latest"], disk_list["points"].back()["id"]);
  EXPECT_EQ(folders[0]["image_bytes"], disk_list["image_bytes"]);
  EXPECT_TRUE(disk_list["chain_folders"].empty());
  // The policy folder alone: its source folders, one level down.
  nlohmann::json policy_list = RunResult(Barge("list --json " + Q(target + "/nightly")));
  ASSERT_EQ(policy_list["chain_folders"].size(), 2u);
}

// `restore` took only a chain folder; a point's own image or manifest
// (which `verify` and `list` take) was "no chain folder".
TEST_F(CliFindingsTest, RestoreTakesAPointsImageOrManifest) {
  const std::string chain = Chain(1);
  nlohmann::json list = RunResult(Barge("list --json " + Q(chain)));
  ASSERT_EQ(list["points"].size(), 2u);
  const std::string full_id = list["points"][0]["id"];
  // The full's image: that point, not the latest.
  nlohmann::json r = RunResult(Barge("restore --json " + Q(chain + "/" + full_id + ".qcow2") + " --to " +
                                     Q(dir_ / "r0.raw")));
  EXPECT_EQ(r["id"], full_id);
  EXPECT_EQ(r["position"], 0);
  RunOk("qemu-img compare -q -f raw -F raw " + Q(dir_ / "r0.raw") + " " + Q(disk_));
  // The incremental's manifest.
  const std::string inc_id = list["points"][1]["id"];
  r = RunResult(Barge("restore --json " + Q(chain + "/" + inc_id + ".json") + " --to " + Q(dir_ / "r1.raw")));
  EXPECT_EQ(r["id"], inc_id);
  // --at that names another point than the file is refused.
  CommandResult bad = Sh(Barge("restore " + Q(chain + "/" + inc_id + ".json") + " --at 0 --to " +
                               Q(dir_ / "r2.raw")));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(Has(bad.output, "--at conflicts with the backup the path names")) << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "r2.raw"));
}

// verify --against another source exited 1; the docs say a mismatch is 2.
TEST_F(CliFindingsTest, VerifyAgainstADifferentSourceIsAMismatchExit2) {
  const std::string chain = Chain(0);
  WriteFile(dir_ / "other.raw", RandomBytes(4 * kMiB, 99));
  CommandResult r = Sh(Barge("verify --json " + Q(chain) + " --against " + Q(dir_ / "other.raw")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  nlohmann::json e = ErrorOf(r.stdout_text);
  EXPECT_EQ(e["exit_code"], 2);
  // No damage to the backup: the error names the source, not Corruption.
  EXPECT_EQ(e["code"], "InvalidArgument");
  EXPECT_EQ(e["file"], dir_ / "other.raw");
  EXPECT_TRUE(Has(e.value("message", ""), "the backup itself verified")) << r.output;
  EXPECT_TRUE(e.contains("offset")) << r.output;  // the first cluster that differs
  // Another size is a mismatch too.
  WriteFile(dir_ / "small.raw", RandomBytes(2 * kMiB, 98));
  EXPECT_EQ(Sh(Barge("verify " + Q(chain) + " --against " + Q(dir_ / "small.raw"))).exit_code, 2);
  // The source itself: 0; one that cannot be read: 1.
  RunOk(Barge("verify " + Q(chain) + " --against " + Q(disk_)));
  EXPECT_EQ(Sh(Barge("verify " + Q(chain) + " --against " + Q(dir_ / "absent.raw"))).exit_code, 1);
}

// verify --all stopped at the first failing point: the points that passed
// and the ones not checked were not named.
TEST_F(CliFindingsTest, VerifyAllReportsEveryPoint) {
  const std::string chain = Chain(2);
  // A second chain in the same folder (a forced full) and its incremental.
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") + " --name d --compress none"));
  nlohmann::json list = RunResult(Barge("list --json " + Q(chain)));
  ASSERT_EQ(list["points"].size(), 4u);
  std::vector<std::string> ids;
  for (const auto& p : list["points"]) ids.push_back(p["id"]);
  // Damage the first incremental: its digest table goes.
  fs::remove(chain + "/" + ids[1] + ".digests");

  CommandResult r = Sh(Barge("verify --json " + Q(chain) + " --all"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  nlohmann::json result = ResultOf(r.stdout_text);
  EXPECT_EQ(result["ok"], false) << r.stdout_text;
  const auto& points = result["points"];
  ASSERT_EQ(points.size(), 4u) << r.stdout_text;
  EXPECT_EQ(points[0]["result"], "passed");
  EXPECT_EQ(points[1]["result"], "failed");
  EXPECT_TRUE(Has(points[1].value("error", ""), ids[1])) << points[1].dump();
  EXPECT_EQ(points[2]["result"], "skipped");
  EXPECT_EQ(points[2]["failed_layer"], ids[1]);
  EXPECT_EQ(points[3]["result"], "passed");  // the second chain does not read through it
  EXPECT_EQ(result["verified"], nlohmann::json::array({ids[0], ids[3]}));
  EXPECT_EQ(result["clusters_checked"], 2 * 64);  // two 4 MiB points of 64 KiB clusters
  EXPECT_GT(result["bytes_read"].get<uint64_t>(), 0u);
  nlohmann::json e = ErrorOf(r.stdout_text);
  EXPECT_EQ(e["exit_code"], 2);

  r = Sh(Barge("verify " + Q(chain) + " --all"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Has(r.stdout_text, "verified " + ids[0])) << r.output;
  EXPECT_TRUE(Has(r.stdout_text, "FAILED " + ids[1])) << r.output;
  EXPECT_TRUE(Has(r.stdout_text, "skipped " + ids[2])) << r.output;
  EXPECT_TRUE(Has(r.stdout_text, "reads through " + ids[1] + ", which failed")) << r.output;
  EXPECT_TRUE(Has(r.stdout_text, "verified " + ids[3])) << r.output;
  EXPECT_TRUE(Has(r.stdout_text, "2 of 4 points verified, 1 FAILED, 1 skipped")) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, "barge: Corruption: ")) << r.output;
  // The checked points keep their records; the skipped one has none.
  nlohmann::json after = RunResult(Barge("list --json " + Q(chain)));
  EXPECT_EQ(after["points"][0]["last_verification"]["result"], "ok");
  EXPECT_EQ(after["points"][1]["last_verification"]["result"], "failed");
  EXPECT_TRUE(after["points"][2]["last_verification"].is_null());
  EXPECT_EQ(after["points"][3]["last_verification"]["result"], "ok");
}

// snapshot rename to a name over 255 bytes or not UTF-8 exited 1 (create:
// 64); an extra argument was "unknown command".
TEST_F(CliFindingsTest, SnapshotRenameRefusesABadNameAsUsage) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string image = dir_ / "s.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " 1M");
  RunOk(Barge("snapshot create " + Q(image) + " --name a"));
  CommandResult r = Sh(Barge("snapshot rename " + Q(image) + " a " + std::string(256, 'x')));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.output, "longer than 255 bytes")) << r.output;
  r = Sh(Barge("snapshot rename " + Q(image) + " a $(printf 'b\\377')"));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.output, "not valid UTF-8")) << r.output;
  r = Sh(Barge("snapshot rename " + Q(image) + " a b c"));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.output, "unexpected extra argument 'c'")) << r.output;
  EXPECT_FALSE(Has(r.output, "unknown command")) << r.output;
  // Nothing was renamed; a good name still is.
  EXPECT_TRUE(Has(RunOk("qemu-img snapshot -l " + Q(image)), " a ")) << RunOk("qemu-img snapshot -l " + Q(image));
  RunOk(Barge("snapshot rename " + Q(image) + " a b"));
  // Any command with one word too many.
  r = Sh(Barge("info " + Q(image) + " extra"));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.output, "unexpected extra argument 'extra'")) << r.output;
  // An unknown short option is named, not the value after it.
  r = Sh(Barge("replicate " + Q(image) + " --to " + Q(dir_ / "c.qcow2") + " -O raw"));
  EXPECT_EQ(r.exit_code, 64) << r.output;
  EXPECT_TRUE(Has(r.output, "unknown option -O")) << r.output;
}

// A 24-byte file was a 24 B raw disk; qemu-img sees a 512 B one (whole
// sectors, the tail reading as zeros).
TEST_F(CliFindingsTest, ARawFileOfPartSectorsIsSizedAsQemuImgSizesIt) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string tiny = dir_ / "tiny.raw";
  WriteFile(tiny, RandomBytes(24, 7));
  auto qemu = nlohmann::json::parse(RunOk("qemu-img info --output=json -f raw " + Q(tiny)));
  ASSERT_EQ(qemu["virtual-size"], 512);
  nlohmann::json info = RunResult(Barge("info --json " + Q(tiny)));
  EXPECT_EQ(info["virtual_size"], qemu["virtual-size"]) << info.dump();
  EXPECT_EQ(info["file_size"], 24);
  // A backup of it restores to what qemu-img convert makes of it.
  RunOk(Barge("backup --source " + Q(tiny) + " --target " + Q(dir_ / "bk") + " --name tiny"));
  RunOk(Barge("restore " + Q(dir_ / "bk/tiny") + " --to " + Q(dir_ / "r.raw")));
  RunOk("qemu-img convert -f raw -O raw " + Q(tiny) + " " + Q(dir_ / "q.raw"));
  EXPECT_EQ(fs::file_size(dir_ / "r.raw"), 512u);
  RunOk("cmp " + Q(dir_ / "r.raw") + " " + Q(dir_ / "q.raw"));
  RunOk("qemu-img compare -q -f raw -F raw " + Q(tiny) + " " + Q(dir_ / "r.raw"));
  // 1000 bytes: 1024, as qemu-img.
  WriteFile(tiny, RandomBytes(1000, 8));
  EXPECT_EQ(RunResult(Barge("info --json " + Q(tiny)))["virtual_size"], 1024);
}

// --dirty-extents from a pipe recorded "extents:/dev/fd/63"; a folder was
// "not a regular file or block device".
TEST_F(CliFindingsTest, ExtentsFromAPipeAndAFolder) {
  const std::string target = dir_ / "bk";
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name d"));
  const std::string extents = dir_ / "extents.json";
  WriteExtentsFile(extents, {{0, 64 << 10}}, 4 * kMiB);
  // bash for <(...): /bin/sh may lack process substitution.
  CommandResult r = Sh("bash -c " + Q(Barge("backup --json --source " + Q(disk_) + " --target " + Q(target) +
                                            " --name d --incremental --dirty-extents <(cat " + Q(extents) + ")")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json made = ResultOf(r.stdout_text);
  nlohmann::json list = RunResult(Barge("list --json " + Q(target + "/d")));
  const auto& inc = list["points"][1];
  EXPECT_EQ(inc["dirty_source"], "extents:pipe") << inc.dump();
  EXPECT_EQ(inc["reason"], "changed blocks from extents read from a pipe") << inc.dump();
  EXPECT_FALSE(Has(inc.dump(), "/dev/fd/")) << inc.dump();
  // A file is still named.
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name d --incremental --dirty-extents " +
              Q(extents)));
  list = RunResult(Barge("list --json " + Q(target + "/d")));
  EXPECT_EQ(list["points"][2]["dirty_source"], "extents:" + extents);

  r = Sh(Barge("backup --source " + Q(disk_) + " --target " + Q(target) + " --name d --incremental --dirty-extents " +
               Q(dir_.path().string())));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, dir_.path().string() + ": a folder, not an extents file")) << r.output;
  EXPECT_FALSE(Has(r.output, "not a regular file")) << r.output;
}

// Every subcommand's --help repeated the exit code table.
TEST_F(CliFindingsTest, TheExitCodeTableIsInTheTopHelpOnly) {
  EXPECT_TRUE(Has(RunOk(Barge("--help")), "Exit codes:"));
  for (const char* command : {"list", "verify", "backup", "snapshot rename", "snapshot", "runs list"}) {
    std::string help = RunOk(Barge(std::string(command) + " --help"));
    EXPECT_FALSE(Has(help, "Exit codes:")) << command << ":\n" << help;
  }
  // The man page keeps it.
  EXPECT_TRUE(Has(RunOk(Barge("man")), "EXIT STATUS"));
}

// The user configuration barge reads from the environment is listed in the
// top --help (issue 19) as in the man page's ENVIRONMENT, and only there.
TEST_F(CliFindingsTest, TheEnvironmentIsInTheTopHelpAndTheManPage) {
  std::string help = RunOk(Barge("--help"));
  std::string man = RunOk(Barge("man"));
  EXPECT_TRUE(Has(help, "Environment:")) << help;
  EXPECT_TRUE(Has(man, ".SH ENVIRONMENT")) << man;
  for (const char* var : {"BARGE_CATALOG", "BARGE_LIBVIRT_URI", "XDG_STATE_HOME", "BARGE_NO_URING"}) {
    EXPECT_TRUE(Has(help, var)) << var << ":\n" << help;
    EXPECT_TRUE(Has(man, var)) << var;
  }
  EXPECT_FALSE(Has(RunOk(Barge("vm backup --help")), "Environment:"));
}

// replicate of a qcow2 whose bitmap name is not UTF-8 failed after the copy.
TEST_F(CliFindingsTest, ReplicateRefusesANonUtf8BitmapBeforeTheCopy) {
  BARGE_REQUIRE_TOOL("qemu-img");
  const std::string image = dir_ / "b.qcow2";
  RunOk("qemu-img create -q -f qcow2 " + Q(image) + " 4M");
  RunOk("qemu-img bitmap --add " + Q(image) + " \"$(printf 'cbt\\377')\"");
  const std::string copy = dir_ / "out/b.qcow2";
  fs::create_directories(dir_ / "out");
  CommandResult r = Sh(Barge("replicate " + Q(image) + " --to " + Q(copy)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "not valid UTF-8")) << r.output;
  EXPECT_TRUE(Has(r.output, image + ": ")) << r.output;
  // Refused before anything was written: no copy, no temporary.
  EXPECT_TRUE(fs::is_empty(dir_ / "out")) << RunOk("ls -a " + Q(dir_ / "out"));
  // Raw output drops bitmaps: that still works.
  RunOk(Barge("replicate " + Q(image) + " --to " + Q(dir_ / "out/b.raw") + " --format raw"));
}

// SIGINT during a backup's free-space estimate (an NBD source that answers
// its extent queries slowly) ended the run only after the 30 s grace.
TEST_F(CliFindingsTest, SigintStopsTheBackupEstimatePromptly) {
  BARGE_REQUIRE_TOOL("nbdkit");
  const std::string sock = dir_ / "nbd.sock";
  // 64 GiB: 64 extent queries of 1 GiB, each delayed 1 s.
  SocketServer server("nbdkit --exit-with-parent -f -U " + Q(sock) + " --filter=delay memory 64G delay-extents=1",
                      sock);
  ASSERT_TRUE(server.WaitReady());
  const std::string uri = server.uri();
  const std::string pidfile = dir_ / "pid";
  const auto start = std::chrono::steady_clock::now();
  CommandResult r = Sh("sh -c " + Q("echo $$ > " + Q(pidfile) + "; exec " +
                                    Barge("backup --source " + Q(uri) + " --target " + Q(dir_ / "bk") +
                                          " --name n")) +
                       " & sleep 3; kill -INT $(cat " + Q(pidfile) + "); wait $!");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_LT(seconds, 15) << r.output;
  EXPECT_TRUE(Has(r.output, "interrupted")) << r.output;
}

// SIGINT during `bench` ended it only after the 30 s grace.
TEST_F(CliFindingsTest, SigintStopsBenchPromptly) {
  const std::string pidfile = dir_ / "pid";
  const auto start = std::chrono::steady_clock::now();
  // A disk large enough that generating and measuring it takes far longer
  // than the second the signal waits.
  CommandResult r = Sh("sh -c " + Q("echo $$ > " + Q(pidfile) + "; exec " +
                                    Barge("bench --size 4G --workdir " + Q(dir_.path().string()))) +
                       " & sleep 2; kill -INT $(cat " + Q(pidfile) + "); wait $!");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_LT(seconds, 15) << r.output;
  // The scratch folder is gone.
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    EXPECT_FALSE(e.path().filename().string().starts_with("barge-bench-")) << e.path();
  }
}

// barge ignores SIGPIPE (a killed libvirtd or NBD server must end in an
// error line, not a silent death), so `barge ... | head` printed
// "barge: IoError: <stdout>: ... (Broken pipe)" and exited 1. A reader that
// stopped reading ends barge quietly by SIGPIPE, as before; a stdout that
// cannot be written for another reason (a full disk) is still an error.
TEST_F(CliFindingsTest, AReaderThatStopsReadingEndsBargeQuietly) {
  const std::string err = dir_ / "stderr.txt";
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);  // the reader is gone before barge writes
  const std::string bin = BargeBinary();
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(e, STDERR_FILENO);
    ::signal(SIGPIPE, SIG_DFL);
    ::execl(bin.c_str(), bin.c_str(), "--help", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(fds[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGPIPE) << "status " << status;
  EXPECT_EQ(Slurp(err), "");

  auto full = Sh(Barge("--help") + " > /dev/full");
  EXPECT_EQ(full.exit_code, 1) << full.output;
  EXPECT_NE(full.stderr_text.find("barge: IoError: <stdout>: the output could not be written"), std::string::npos)
      << full.output;
}

}  // namespace
}  // namespace barge::testing
