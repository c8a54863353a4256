// barge export: a point served over NBD through nbdkit and barge's plugin,
// checked with nbdcopy, qemu-img, qemu-io and nbdinfo (docs/export.md).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "testing/cli_testing.h"
#include "testing/hostile_tmp.h"

namespace barge {
namespace {

using nlohmann::json;
using testing::Barge;
using testing::Has;
using testing::Q;
using testing::RunOk;
using testing::TempDir;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kDiskBytes = 8 * kMiB;

// `barge export ... --json` in the background: stdout and stderr to files,
// stopped by PID. `wrap` turns the barge command into the one run (which
// must exec barge in the end: the PID is barge's).
class Export {
 public:
  Export(const TempDir& tmp, const std::string& args,
         const std::function<std::string(const std::string&)>& wrap = nullptr)
      : out_(tmp / "export.out"), err_(tmp / "export.err") {
    std::string barge = Barge("export " + args + " --json");
    if (wrap) barge = wrap(barge);
    const std::string command = "exec " + barge + " >" + Q(out_) + " 2>" + Q(err_);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Export() {
    if (pid_ > 0) Stop();
  }

  // The ready event (null when barge ended first or 30 s passed).
  json WaitReady() {
    for (int i = 0; i < 1500; ++i) {
      for (const json& e : EventsSoFar()) {
        if (e.value("event", "") == "ready") return e;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return nullptr;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return nullptr;
  }

  // SIGTERM to barge; its exit code.
  int Stop(int sig = SIGTERM) {
    if (pid_ <= 0) return exit_code_;
    ::kill(pid_, sig);
    int status = 0;
    for (int i = 0; i < 1000; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = 0;
    return exit_code_ = -1;
  }

  std::vector<json> EventsSoFar() const {
    std::vector<json> events;
    std::string text = fs::exists(out_) ? testing::Slurp(out_) : "";
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
      events.push_back(json::parse(text.substr(start, nl - start), nullptr, false));
    }
    return events;
  }
  std::string Stderr() const { return fs::exists(err_) ? testing::Slurp(err_) : ""; }
  int exit_code() const { return exit_code_; }
  int pid() const { return pid_; }

 private:
  std::string out_, err_;
  pid_t pid_ = 0;
  int exit_code_ = -1;
};

// The folders in `dir` whose name starts with `prefix`.
std::vector<std::string> ExportRunDirs(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with(prefix) && e.is_directory()) found.push_back(e.path().string());
  }
  return found;
}

bool ProcessGone(int64_t pid) { return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

std::string Sha256Of(const std::string& dir) {
  return RunOk("cd " + Q(dir) + " && sha256sum *.qcow2 *.digests *.json");
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"nbdkit", "nbdcopy", "nbdinfo", "qemu-img", "qemu-io"}) BARGE_REQUIRE_TOOL(tool);
    // 8 MiB: data in [0, 3 MiB) and [6 MiB, 7 MiB), a hole between; an
    // incremental rewrites [1 MiB, 2 MiB).
    disk_ = tmp_ / "disk.raw";
    std::vector<std::byte> bytes(kDiskBytes);
    auto a = testing::RandomBytes(3 * kMiB, 1), b = testing::RandomBytes(kMiB, 2);
    std::copy(a.begin(), a.end(), bytes.begin());
    std::copy(b.begin(), b.end(), bytes.begin() + 6 * kMiB);
    testing::WriteFile(disk_, bytes);
    fs::resize_file(disk_, kDiskBytes);
    const std::string backup = Barge("backup --compress none --source " + Q(disk_) + " --target " + Q(tmp_ / "bk") +
                                     " --name d");
    RunOk(backup);
    auto c = testing::RandomBytes(kMiB, 3);
    std::copy(c.begin(), c.end(), bytes.begin() + kMiB);
    testing::WriteFile(disk_, bytes);
    testing::WriteExtentsFile(tmp_ / "changed.json", {{kMiB, kMiB}}, kDiskBytes);
    RunOk(backup + " --incremental --dirty-extents " + Q(tmp_ / "changed.json"));
    chain_ = tmp_ / "bk/d";
    ids_ = testing::PointIds(chain_);
    ASSERT_EQ(ids_.size(), 2u);
    socket_ = tmp_ / "nbd.sock";
  }

  std::string Uri() const { return "nbd+unix:///?socket=" + socket_; }

  TempDir tmp_;
  std::string disk_, chain_, socket_;
  std::vector<std::string> ids_;
};

TEST_F(ExportTest, ServesThePointVerifiedWithHolesAndStopsOnSigterm) {
  Export ex(tmp_, Q(chain_) + " --socket " + Q(socket_));
  json ready = ex.WaitReady();
  ASSERT_FALSE(ready.is_null()) << ex.Stderr();
  EXPECT_EQ(ready.at("command"), "export");
  EXPECT_EQ(ready.at("uri"), Uri());
  EXPECT_EQ(ready.at("id"), ids_.back());
  EXPECT_EQ(ready.at("writable"), false);
  const int64_t nbdkit_pid = ready.at("nbdkit_pid");

  // The whole export equals the restored point and the disk, through two
  // clients.
  RunOk(Barge("restore " + Q(chain_) + " --to " + Q(tmp_ / "restored.raw") + " --no-sync"));
  RunOk("nbdcopy " + Q(Uri()) + " " + Q(tmp_ / "nbdcopy.raw"));
  RunOk("qemu-img convert -f raw -O raw " + Q(Uri()) + " " + Q(tmp_ / "convert.raw"));
  RunOk("cmp " + Q(tmp_ / "restored.raw") + " " + Q(tmp_ / "nbdcopy.raw"));
  RunOk("cmp " + Q(tmp_ / "restored.raw") + " " + Q(tmp_ / "convert.raw"));
  RunOk("cmp " + Q(disk_) + " " + Q(tmp_ / "nbdcopy.raw"));
  // The zeros between 3 MiB and 6 MiB are reported as a hole or zero
  // extent (nbdcopy and qemu-img skip them).
  const std::string map = RunOk("nbdinfo --map --json " + Q(Uri()));
  bool hole = false;
  for (const json& e : json::parse(map)) {
    if (e.at("offset") <= 3 * kMiB && e.at("offset").get<uint64_t>() + e.at("length").get<uint64_t>() >= 6 * kMiB) {
      hole = (e.at("type").get<int>() & 3) != 0;  // NBD_STATE_HOLE, NBD_STATE_ZERO
    }
  }
  EXPECT_TRUE(hole) << map;
  // Read-only.
  auto w = testing::Run("qemu-io -f raw " + Q(Uri()) + " -c 'write -P 0x11 0 64k'");
  EXPECT_TRUE(w.exit_code != 0 || Has(w.output, "failed") || Has(w.output, "read-only") || Has(w.output, "Read-only"))
      << w.output;

  // SIGTERM: barge stops nbdkit by its PID, removes the socket, says so.
  EXPECT_EQ(ex.Stop(SIGTERM), 143) << ex.Stderr();
  EXPECT_TRUE(ProcessGone(nbdkit_pid));
  EXPECT_FALSE(fs::exists(socket_));
  auto events = ex.EventsSoFar();
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[events.size() - 2].at("event"), "result");
  EXPECT_EQ(events[events.size() - 2].at("stopped_by"), "SIGTERM");
  EXPECT_EQ(events.back().at("event"), "error");
  EXPECT_EQ(events.back().at("exit_code"), 143);
  // The export's lock file is gone with it.
  for (const auto& e : fs::directory_iterator(chain_)) {
    EXPECT_FALSE(e.path().filename().string().starts_with(".export-")) << e.path();
  }
}

// The PID file of an export whose barge was killed outright (SIGKILL: its
// cleanup never ran) is swept by the next export; a live process's stays.
TEST_F(ExportTest, AKilledExportsPidFileIsSweptByTheNext) {
  const char* tmp_env = std::getenv("TMPDIR");
  const fs::path tmp = tmp_env != nullptr && tmp_env[0] != '\0' ? tmp_env : "/tmp";
  Export killed(tmp_, Q(chain_) + " --socket " + Q(socket_));
  ASSERT_FALSE(killed.WaitReady().is_null()) << killed.Stderr();
  const std::vector<std::string> run_dirs =
      ExportRunDirs(tmp.string(), ".barge-export-" + std::to_string(killed.pid()) + "-");
  ASSERT_EQ(run_dirs.size(), 1u);
  const fs::path left = run_dirs[0];
  EXPECT_TRUE(fs::exists(left / "nbdkit.pid"));
  killed.Stop(SIGKILL);
  ASSERT_TRUE(fs::exists(left)) << "nothing left to sweep";
  fs::remove(socket_);  // the killed run's, left too
  const fs::path live = tmp / (".barge-export-" + std::to_string(::getpid()) + "-live");
  fs::create_directory(live);

  TempDir next_out;  // its own output files: the killed run's ready event is in tmp_'s
  Export next(next_out, Q(chain_) + " --socket " + Q(socket_));
  ASSERT_FALSE(next.WaitReady().is_null()) << next.Stderr();
  EXPECT_FALSE(fs::exists(left));
  EXPECT_TRUE(fs::exists(live));
  fs::remove(live);
  EXPECT_EQ(next.Stop(SIGTERM), 143) << next.Stderr();
}

// nbdkit's PID file is in a fresh folder of the export's own in the shared
// temporary folder (0700, root's, gone at the end). Links a local user
// (nobody) planted under the names barge once used there
// (.barge-export-PID.pid, for the next PIDs, pointing at a root-owned file)
// are neither followed (nbdkit writes its PID file with O_TRUNC) nor
// removed.
TEST_F(ExportTest, NamesPlantedInASharedTemporaryFolderAreNeverUsed) {
  testing::HostileTmp hostile(tmp_);
  hostile.PlantForNextPids(
      300, [](int) { return std::vector<std::string>{}; },
      [](int pid) { return std::vector<std::string>{".barge-export-" + std::to_string(pid) + ".pid"}; });
  Export ex(tmp_, Q(chain_) + " --socket " + Q(socket_));
  ASSERT_FALSE(ex.WaitReady().is_null()) << ex.Stderr();
  const std::vector<std::string> run_dirs =
      ExportRunDirs(hostile.shared(), ".barge-export-" + std::to_string(ex.pid()) + "-");
  ASSERT_EQ(run_dirs.size(), 1u) << "no run folder of the export's own";
  struct stat st;
  ASSERT_EQ(::lstat(run_dirs[0].c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_TRUE(fs::exists(run_dirs[0] + "/nbdkit.pid"));
  RunOk("nbdcopy " + Q(Uri()) + " " + Q(tmp_ / "copy.raw"));
  RunOk("cmp " + Q(disk_) + " " + Q(tmp_ / "copy.raw"));
  EXPECT_EQ(ex.Stop(SIGTERM), 143) << ex.Stderr();
  EXPECT_FALSE(fs::exists(run_dirs[0]));
  EXPECT_EQ(hostile.VictimText(), testing::HostileTmp::kVictimText);
  hostile.ExpectPlantedUntouched();
  EXPECT_EQ(hostile.NotNobodys(), std::vector<std::string>{});
}

TEST_F(ExportTest, AnOlderPointByPosition) {
  Export ex(tmp_, Q(chain_) + " --at 0 --socket " + Q(socket_));
  json ready = ex.WaitReady();
  ASSERT_FALSE(ready.is_null()) << ex.Stderr();
  EXPECT_EQ(ready.at("id"), ids_.front());
  RunOk(Barge("restore " + Q(chain_) + " --at 0 --to " + Q(tmp_ / "p0.raw") + " --no-sync"));
  RunOk("nbdcopy " + Q(Uri()) + " " + Q(tmp_ / "e0.raw"));
  RunOk("cmp " + Q(tmp_ / "p0.raw") + " " + Q(tmp_ / "e0.raw"));
}

TEST_F(ExportTest, ADamagedClusterFailsItsReadsWithEioAndNamesFileAndOffset) {
  // A data cluster of the incremental layer (guest 1 MiB, uncompressed).
  const std::string layer = testing::ManifestPath(chain_, ids_.back());
  const std::string image = layer.substr(0, layer.size() - 5) + ".qcow2";
  json map = json::parse(RunOk("qemu-img map --output=json -f qcow2 " + Q(image)));
  int64_t host = -1;
  for (const json& e : map) {
    if (e.at("start") == kMiB && e.at("depth") == 0 && e.contains("offset")) host = e.at("offset");
  }
  ASSERT_GE(host, 0) << map.dump();
  {
    auto bytes = testing::ReadFile(image);
    bytes[host + 100] ^= std::byte{0x5a};
    testing::WriteFile(image, bytes);
  }
  // Structure is fine, so the export starts; the damage shows on reading.
  Export ex(tmp_, Q(chain_) + " --socket " + Q(socket_));
  ASSERT_FALSE(ex.WaitReady().is_null()) << ex.Stderr();
  auto bad = testing::Run("qemu-io -r -f raw " + Q(Uri()) + " -c 'read 1M 4k'");
  EXPECT_TRUE(Has(bad.output, "Input/output error")) << bad.output;
  auto good = testing::Run("qemu-io -r -f raw " + Q(Uri()) + " -c 'read -P 0 4M 64k' -c 'read 0 1M' -c 'read 1088k 64k'");
  EXPECT_FALSE(Has(good.output, "error")) << good.output;
  EXPECT_FALSE(Has(good.output, "fail")) << good.output;
  auto copy = testing::Run("nbdcopy " + Q(Uri()) + " " + Q(tmp_ / "whole.raw"));
  EXPECT_NE(copy.exit_code, 0) << copy.output;
  const std::string log = ex.Stderr();
  EXPECT_TRUE(Has(log, image)) << log;
  EXPECT_TRUE(Has(log, "guest offset 0x100000")) << log;
  EXPECT_TRUE(Has(log, "Corruption")) << log;
}

// Issue 36 §4: nbdkit 1.32 aborted as a whole (`raw_send_socket: sock >=
// 0`) when a client hung up with several reads in flight, ending the export
// for every client. 20 clients killed mid-read in a row while another keeps
// reading whole copies: the export, its nbdkit and the reader's data
// survive.
TEST_F(ExportTest, ClientsKilledMidReadLeaveTheExportServingTheOthers) {
  const std::string big = tmp_ / "big.raw";
  testing::WriteFile(big, testing::RandomBytes(64 * kMiB, 7));
  RunOk(Barge("backup --compress none --source " + Q(big) + " --target " + Q(tmp_ / "bk") + " --name big"));
  Export ex(tmp_, Q(tmp_ / "bk/big") + " --socket " + Q(socket_));
  json ready = ex.WaitReady();
  ASSERT_FALSE(ready.is_null()) << ex.Stderr();
  const int64_t nbdkit_pid = ready.at("nbdkit_pid");

  const std::string uri = Q(Uri());
  const std::string stop = tmp_ / "stop-reading";
  const std::string script =
      "cd " + Q(tmp_.path().string()) + "\n" +
      "reader() { n=0; while [ ! -e " + Q(stop) + " ]; do\n"
      "  nbdcopy --connections=1 " + uri + " long.raw || exit 1\n"
      "  cmp -s long.raw " + Q(big) + " || exit 2\n"
      "  n=$((n+1)); done; [ $n -gt 0 ] || exit 3; }\n"
      "reader & L=$!\n"
      "for i in $(seq 20); do\n"
      "  nbdcopy --connections=1 --requests=64 --request-size=65536 " + uri + " null: & C=$!\n"
      "  sleep 0.0$((5 + i % 5))\n"  // 50 to 90 ms: a 64 MiB copy takes longer
      "  kill -9 $C; wait $C\n"
      "done\n"
      "touch " + Q(stop) + "; wait $L; echo reader=$?\n";
  auto r = testing::Run("bash -c " + Q(script));
  EXPECT_TRUE(Has(r.output, "reader=0")) << r.output << ex.Stderr();
  EXPECT_EQ(ex.pid() > 0 && ::kill(ex.pid(), 0) == 0, true) << "the export ended: " << ex.Stderr();
  EXPECT_FALSE(ProcessGone(nbdkit_pid)) << ex.Stderr();
  EXPECT_FALSE(Has(ex.Stderr(), "Assertion")) << ex.Stderr();
  // Still serving the point, whole.
  RunOk("nbdcopy " + uri + " " + Q(tmp_ / "after.raw"));
  RunOk("cmp " + Q(big) + " " + Q(tmp_ / "after.raw"));
  EXPECT_EQ(ex.Stop(), 143) << ex.Stderr();
}

TEST_F(ExportTest, WritableKeepsWritesInAThrowawayOverlay) {
  const std::string before = Sha256Of(chain_);
  {
    Export ex(tmp_, Q(chain_) + " --writable --socket " + Q(socket_));
    json ready = ex.WaitReady();
    ASSERT_FALSE(ready.is_null()) << ex.Stderr();
    EXPECT_EQ(ready.at("writable"), true);
    auto w = testing::Run("qemu-io -f raw " + Q(Uri()) + " -c 'write -P 0xab 64k 128k' -c 'read -P 0xab 64k 128k'");
    EXPECT_EQ(w.exit_code, 0) << w.output;
    EXPECT_FALSE(Has(w.output, "fail")) << w.output;
    EXPECT_FALSE(Has(w.output, "Pattern verification failed")) << w.output;
    EXPECT_EQ(ex.Stop(), 143);
  }
  EXPECT_EQ(Sha256Of(chain_), before);
  RunOk(Barge("verify " + Q(chain_)));
}

TEST_F(ExportTest, MergeAndForgetAreRefusedWhileExporting) {
  Export ex(tmp_, Q(chain_) + " --socket " + Q(socket_));
  ASSERT_FALSE(ex.WaitReady().is_null()) << ex.Stderr();
  auto merge = testing::Run(Barge("merge " + Q(chain_) + " --through latest"));
  EXPECT_EQ(merge.exit_code, 4) << merge.output;
  EXPECT_TRUE(Has(merge.output, "exported")) << merge.output;
  auto forget = testing::Run(Barge("forget " + Q(chain_) + " --keep-last 1"));
  EXPECT_EQ(forget.exit_code, 4) << forget.output;
  EXPECT_EQ(testing::PointIds(chain_), ids_);
  // A second export of the same chain may run beside the first.
  Export second(tmp_, Q(chain_) + " --at 0 --socket " + Q(tmp_ / "second.sock"));
  EXPECT_FALSE(second.WaitReady().is_null()) << second.Stderr();
  EXPECT_EQ(second.Stop(), 143);
  EXPECT_EQ(ex.Stop(), 143);
  // Once it ended, the merge runs.
  RunOk(Barge("merge " + Q(chain_) + " --through latest"));
}

// A chain folder the export may not write is served with nothing written
// there (issue 36): a read-only view of it (a bind mount remounted
// read-only, EROFS, in a mount namespace of the export's own, gone with
// it), and root's chain read by nobody (EACCES). Merge and forget through
// the writable folder are refused meanwhile; a backup goes on.
TEST_F(ExportTest, AReadOnlyChainIsServedAndKeepsMergeOff) {
  for (const char* tool : {"unshare", "setpriv", "mount"}) BARGE_REQUIRE_TOOL(tool);
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a bind mount, another user)";
  auto expect_no_export_lock = [&] {
    for (const auto& e : fs::directory_iterator(chain_)) {
      EXPECT_FALSE(e.path().filename().string().starts_with(".export-")) << e.path();
    }
  };
  const std::string ro = tmp_ / "ro";
  fs::create_directories(ro);
  const std::string mount =
      "mount --bind " + Q(tmp_ / "bk") + " " + Q(ro) + " && mount -o remount,bind,ro " + Q(ro) + " && exec ";
  {
    Export ex(tmp_, Q(ro + "/d") + " --socket " + Q(socket_), [&](const std::string& barge) {
      return "unshare --mount --propagation private sh -c " + Q(mount + barge);
    });
    json ready = ex.WaitReady();
    ASSERT_FALSE(ready.is_null()) << ex.Stderr();
    EXPECT_EQ(ready.at("id"), ids_.back());
    RunOk("nbdcopy " + Q(Uri()) + " " + Q(tmp_ / "ro.raw"));
    RunOk("cmp " + Q(disk_) + " " + Q(tmp_ / "ro.raw"));
    expect_no_export_lock();
    auto merge = testing::Run(Barge("merge " + Q(chain_) + " --through latest"));
    EXPECT_EQ(merge.exit_code, 4) << merge.output;
    EXPECT_TRUE(Has(merge.output, "exported")) << merge.output;
    auto forget = testing::Run(Barge("forget " + Q(chain_) + " --keep-last 1"));
    EXPECT_EQ(forget.exit_code, 4) << forget.output;
    EXPECT_EQ(testing::PointIds(chain_), ids_);
    // Backups only add files: they go on.
    RunOk(Barge("backup --compress none --source " + Q(disk_) + " --target " + Q(tmp_ / "bk") +
                " --name d --incremental --dirty-extents " + Q(tmp_ / "changed.json")));
    EXPECT_EQ(ex.Stop(), 143) << ex.Stderr();
  }
  ids_ = testing::PointIds(chain_);
  ASSERT_EQ(ids_.size(), 3u);

  // Root's chain, readable by everyone (0755 folders, 0644 files), served
  // to nobody, who may write none of it.
  for (const std::string& d : {tmp_.path().string(), tmp_ / "bk", chain_}) fs::permissions(d, fs::perms(0755));
  for (const auto& e : fs::directory_iterator(chain_)) fs::permissions(e.path(), fs::perms(0644));
  const std::string nobodys = tmp_ / "nobodys";
  fs::create_directories(nobodys);
  RunOk("chown nobody " + Q(nobodys));
  const std::string socket = nobodys + "/nbd.sock";
  {
    TempDir out;  // its own output files: the first export's ready event is in tmp_'s
    Export ex(out, Q(chain_) + " --at 0 --socket " + Q(socket), [&](const std::string& barge) {
      return "setpriv --reuid=nobody --regid=65534 --clear-groups " + barge;
    });
    json ready = ex.WaitReady();
    ASSERT_FALSE(ready.is_null()) << ex.Stderr();
    EXPECT_EQ(ready.at("id"), ids_.front());
    EXPECT_TRUE(Has(RunOk("nbdinfo --size " + Q("nbd+unix:///?socket=" + socket)), std::to_string(kDiskBytes)));
    expect_no_export_lock();
    auto merge = testing::Run(Barge("merge " + Q(chain_) + " --through latest"));
    EXPECT_EQ(merge.exit_code, 4) << merge.output;
    EXPECT_EQ(ex.Stop(), 143) << ex.Stderr();
  }
  // Once they ended, the merge runs.
  RunOk(Barge("merge " + Q(chain_) + " --through latest"));
}

// A folder that holds no backup (barge export /etc) is refused before
// anything is written in it: no lock file is left there (issue 36).
TEST_F(ExportTest, AFolderThatIsNoChainGetsNoLockFile) {
  const std::string folder = tmp_ / "etc";
  fs::create_directories(folder);
  testing::WriteText(folder + "/hosts", "127.0.0.1 localhost\n");
  auto r = testing::Run(Barge("export " + Q(folder) + " --socket " + Q(socket_)));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(Has(r.output, "not a chain folder")) << r.output;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"hosts"});
  EXPECT_FALSE(fs::exists(socket_));
}

// barge killed outright (SIGKILL: no cleanup of its own): its nbdkit ends
// with it (--exit-with-parent), and the socket nbdkit leaves blocks no
// restart on the same path; a live export's socket still refuses one
// (issue 36).
TEST_F(ExportTest, AKilledExportEndsItsNbdkitAndItsSocketBlocksNoRestart) {
  Export killed(tmp_, Q(chain_) + " --socket " + Q(socket_));
  json ready = killed.WaitReady();
  ASSERT_FALSE(ready.is_null()) << killed.Stderr();
  const int64_t nbdkit_pid = ready.at("nbdkit_pid");
  killed.Stop(SIGKILL);
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = ProcessGone(nbdkit_pid);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone) << "nbdkit " << nbdkit_pid << " outlived barge";
  EXPECT_TRUE(fs::exists(socket_)) << "nothing left to test";

  TempDir next_out;
  Export next(next_out, Q(chain_) + " --socket " + Q(socket_));
  ASSERT_FALSE(next.WaitReady().is_null()) << next.Stderr();
  EXPECT_EQ(RunOk("nbdinfo --size " + Q(Uri())), std::to_string(kDiskBytes) + "\n");
  // The live export's socket is no stale one.
  auto third = testing::Run(Barge("export " + Q(chain_) + " --socket " + Q(socket_)));
  EXPECT_EQ(third.exit_code, 1) << third.output;
  EXPECT_TRUE(Has(third.output, "already at the socket path")) << third.output;
  EXPECT_EQ(RunOk("nbdinfo --size " + Q(Uri())), std::to_string(kDiskBytes) + "\n");
  EXPECT_EQ(next.Stop(SIGTERM), 143) << next.Stderr();
}

TEST_F(ExportTest, TlsWithAPskIsRequiredAndTheKeyNeverPrinted) {
  const std::string psk = tmp_ / "keys.psk";
  const std::string key = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  testing::WriteText(psk, "alice:" + key + "\n");
  Export ex(tmp_, Q(chain_) + " --socket " + Q(socket_) + " --tls-psk-file " + Q(psk));
  json ready = ex.WaitReady();
  ASSERT_FALSE(ready.is_null()) << ex.Stderr();
  EXPECT_EQ(ready.at("uri"), "nbds+unix:///?socket=" + socket_);
  // Without TLS: refused. With the key: the point.
  auto plain = testing::Run("nbdinfo --size " + Q(Uri()));
  EXPECT_NE(plain.exit_code, 0) << plain.output;
  const std::string tls_uri = "nbds+unix://alice@/?socket=" + socket_ + "&tls-psk-file=" + psk;
  EXPECT_EQ(RunOk("nbdinfo --size " + Q(tls_uri)), std::to_string(kDiskBytes) + "\n");
  EXPECT_EQ(ex.Stop(), 143);
  for (const json& e : ex.EventsSoFar()) EXPECT_FALSE(Has(e.dump(), key)) << e.dump();
  EXPECT_FALSE(Has(ex.Stderr(), key));
}

TEST_F(ExportTest, ADamagedChainIsRefusedBeforeServing) {
  const std::string layer = testing::ManifestPath(chain_, ids_.back());
  const std::string image = layer.substr(0, layer.size() - 5) + ".qcow2";
  {
    auto bytes = testing::ReadFile(image);
    bytes[0] = std::byte{'X'};  // the qcow2 magic
    testing::WriteFile(image, bytes);
  }
  auto r = testing::Run(Barge("export " + Q(chain_) + " --socket " + Q(socket_) + " --json"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(Has(r.stderr_text, image)) << r.output;
  EXPECT_FALSE(Has(r.stdout_text, "\"ready\"")) << r.output;
  EXPECT_FALSE(fs::exists(socket_));
}

TEST_F(ExportTest, UsageErrors) {
  EXPECT_EQ(testing::Run(Barge("export " + Q(chain_))).exit_code, 64);
  EXPECT_EQ(testing::Run(Barge("export " + Q(chain_) + " --socket a --listen 127.0.0.1:1")).exit_code, 64);
  EXPECT_EQ(testing::Run(Barge("export " + Q(chain_) + " --listen nope")).exit_code, 1);
  EXPECT_EQ(testing::Run(Barge("export " + Q(tmp_ / "none") + " --socket " + Q(socket_))).exit_code, 1);
}

}  // namespace
}  // namespace barge
