// Issue 12, "Interrupts and leftovers": SIGINT and SIGTERM during every
// long-running command (backup, restore, convert, replicate, merge, verify,
// image add, image sync) remove its temporaries, release its locks and exit
// 130/143; the next run on the same folder sweeps a killed run's leftovers.
// The commands read a slow source (nbdkit's delay filter) or are caught
// mid-write (stopped once their temporary has data, signalled, continued),
// so the signal always lands while they work.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <thread>

#include "tests/testing/barge_child.h"
#include "tests/testing/cli_testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;


using Child = ::barge::testing::BargeChild;

// Files a run leaves that it should not: temporaries, staged merge files.
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.ends_with(".barge-tmp") || name.ends_with(".merge-new")) found.push_back(it->path().string());
  }
  return found;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// True when nobody holds an flock on `path` (a missing file is free too).
bool LockFree(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

bool HasData(const std::string& path) {
  std::error_code ec;
  return fs::file_size(path, ec) > 0 && !ec;
}

// Any file under `dir` whose name ends with `suffix` holds data.
bool AnyWithData(const std::string& dir, const std::string& suffix) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().ends_with(suffix) && HasData(it->path().string())) return true;
  }
  return false;
}

class InterruptTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("nbdkit");
    disk_ = dir_ / "disk.raw";
    WriteFile(disk_, RandomBytes(64 * kMiB, 21));
  }
  int sig() const { return GetParam(); }
  int expected_exit() const { return 128 + GetParam(); }
  // disk_ served slowly: every read waits `delay`.
  std::unique_ptr<SocketServer> SlowSource(const std::string& delay = "300ms") {
    std::string sock = dir_ / "slow.sock";
    auto server = std::make_unique<SocketServer>(
        "nbdkit --foreground --exit-with-parent --unix " + Q(sock) + " --filter=delay file " + Q(disk_) +
            " rdelay=" + delay,
        sock);
    EXPECT_TRUE(server->WaitReady());
    return server;
  }
  // Starts `args`, signals it after `delay` (or when `ready`), and checks
  // the exit code, the message and that `dir` holds no leftovers.
  void Interrupt(const std::vector<std::string>& args, const std::function<bool()>& ready,
                 const std::string& what) {
    const std::string log = dir_ / "log.txt";
    Child child(args, log);
    ASSERT_TRUE(child.SignalWhen(ready, sig())) << what << " ended before the signal:\n"
                                               << RunOk("cat " + Q(log));
    int code = child.Wait();
    std::string out = RunOk("cat " + Q(log));
    EXPECT_EQ(code, expected_exit()) << what << "\n" << out;
    EXPECT_NE(out.find("interrupted"), std::string::npos) << what << "\n" << out;
    EXPECT_TRUE(Leftovers(dir_.path().string()).empty()) << what << "\n" << Join(Leftovers(dir_.path().string()));
  }
  std::function<bool()> After(std::chrono::milliseconds delay) {
    auto start = Clock::now();
    return [start, delay] { return Clock::now() - start >= delay; };
  }

  TempDir dir_;
  std::string disk_;
};

TEST_P(InterruptTest, BackupOfASlowSource) {
  auto nbd = SlowSource();
  Interrupt({"backup", "--source", nbd->uri(), "--target", dir_ / "bk", "--name", "d"},
            [&] { return AnyWithData(dir_ / "bk/d", ".qcow2.barge-tmp"); }, "backup");
  EXPECT_TRUE(LockFree(dir_ / "bk/d/.lock"));
  // A failed first backup leaves no chain folder.
  EXPECT_FALSE(fs::exists(dir_ / "bk/d"));
}

TEST_P(InterruptTest, ConvertAndReplicateOfASlowSource) {
  auto nbd = SlowSource();
  Interrupt({"convert", nbd->uri(), dir_ / "out.raw"}, [&] { return HasData(dir_ / ".out.raw.barge-tmp"); },
            "convert");
  EXPECT_FALSE(fs::exists(dir_ / "out.raw"));
  Interrupt({"replicate", nbd->uri(), "--to", dir_ / "a.raw", "--to", dir_ / "b.raw"},
            [&] { return HasData(dir_ / ".a.raw.barge-tmp"); }, "replicate");
  EXPECT_FALSE(fs::exists(dir_ / "a.raw"));
}

TEST_P(InterruptTest, VerifyAgainstASlowSource) {
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(dir_ / "bk") + " --name d"));
  auto nbd = SlowSource();
  Interrupt({"verify", dir_ / "bk/d", "--against", nbd->uri()}, After(std::chrono::milliseconds(500)), "verify");
  EXPECT_TRUE(LockFree(dir_ / "bk/d/.lock"));
}

TEST_P(InterruptTest, RestoreAndMergeCaughtMidWrite) {
  // A chain of a full and an incremental, both the whole disk.
  const std::string bk = dir_ / "bk";
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(bk) + " --name d --compress none"));
  std::string extents = dir_ / "all.json";
  {
    std::string text = R"({"format":"barge-extents","version":1,"virtual_size":)" + std::to_string(64 * kMiB) +
                       R"(,"extents":[{"offset":0,"length":)" + std::to_string(64 * kMiB) + "}]}";
    std::vector<std::byte> bytes(text.size());
    std::memcpy(bytes.data(), text.data(), text.size());
    WriteFile(extents, bytes);
  }
  RunOk(Barge("backup --source " + Q(disk_) + " --target " + Q(bk) +
              " --name d --compress none --incremental --dirty-extents " + Q(extents)));
  const std::string chain = bk + "/d";
  std::vector<std::string> before;
  for (const auto& e : fs::directory_iterator(chain)) before.push_back(e.path().filename().string());
  std::sort(before.begin(), before.end());

  Interrupt({"restore", chain, "--to", dir_ / "r.raw", "--threads", "1", "--memory", "4M"},
            [&] { return HasData(dir_ / ".r.raw.barge-tmp"); }, "restore");
  EXPECT_FALSE(fs::exists(dir_ / "r.raw"));
  Interrupt({"merge", chain, "--through", "latest", "--threads", "1", "--memory", "4M"},
            [&] { return AnyWithData(chain, ".merge-new.barge-tmp"); }, "merge");
  EXPECT_TRUE(LockFree(chain + "/.lock"));
  // The folder is as it was: both points, nothing staged.
  std::vector<std::string> after;
  for (const auto& e : fs::directory_iterator(chain)) after.push_back(e.path().filename().string());
  std::sort(after.begin(), after.end());
  EXPECT_EQ(after, before);
  RunOk(Barge("verify --all " + Q(chain)));
}

TEST_P(InterruptTest, ImageAddAndSync) {
  const std::string db = dir_ / "catalog.db";
  {
    auto nbd = SlowSource();
    Interrupt({"image", "add", "base", "--source", nbd->uri(), "--disk", dir_ / "disk0", "--catalog", db},
              [&] { return HasData(dir_ / "disk0/.base.barge-tmp"); }, "image add");
    EXPECT_TRUE(LockFree(dir_ / "locks/images/base.lock"));
    // A failed add leaves no row: the image is not in the catalog.
    EXPECT_EQ(::barge::testing::Run(Barge("image status base --catalog " + Q(db))).exit_code, 1);
  }
  RunOk(Barge("image add base --source " + Q(disk_) + " --disk " + Q(dir_ / "disk0") + " --catalog " + Q(db)));
  Interrupt({"image", "sync", "base", "--disks", dir_ / "disk1", "--catalog", db, "--threads", "1", "--memory",
             "4M", "--verify"},
            [&] { return HasData(dir_ / "disk1/.base.raw.barge-tmp"); }, "image sync");
  EXPECT_TRUE(LockFree(dir_ / "locks/images/base.lock"));
  EXPECT_FALSE(fs::exists(dir_ / "disk1/base.raw"));  // the source's extension
  // The next sync delivers it.
  RunOk(Barge("image sync base --disks " + Q(dir_ / "disk1") + " --catalog " + Q(db)));
  RunOk("cmp " + Q(disk_) + " " + Q(dir_ / "disk1/base.raw"));
}

// A second signal while the job unwinds (here: waiting up to 2 s for the
// reads in flight) exits at once, with the same code, and the registered
// temporaries are removed on the way out.
TEST_P(InterruptTest, SecondSignalExitsAtOnceWithoutLeftovers) {
  auto nbd = SlowSource("2000ms");
  const std::string log = dir_ / "log.txt";
  // A small pool: each 2 s wave of reads holds a few chunks, so the copy
  // runs in many waves and a wave is in flight at almost every moment.
  Child child({"convert", nbd->uri(), dir_ / "out.raw", "--threads", "1", "--memory", "4M"}, log);
  // The first wave is written; 300 ms later the next wave is in flight
  // (issued as soon as the writes free its buffers) for another ~1.7 s.
  // Signalling at the first write could fall between two waves, with
  // nothing to wait for.
  std::optional<Clock::time_point> written;
  ASSERT_TRUE(child.SignalWhen(
      [&] {
        if (!written && HasData(dir_ / ".out.raw.barge-tmp")) written = Clock::now();
        return written && Clock::now() - *written >= std::chrono::milliseconds(300);
      },
      sig()));
  // The first signal was taken: the job is unwinding.
  ASSERT_TRUE(child.WaitFor([&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {}).find("interrupted") != std::string::npos;
  })) << RunOk("cat " + Q(log));
  auto second = Clock::now();
  ASSERT_TRUE(child.SignalWhen([] { return true; }, sig())) << RunOk("cat " + Q(log));
  EXPECT_EQ(child.Wait(), expected_exit()) << RunOk("cat " + Q(log));
  EXPECT_LT(Clock::now() - second, std::chrono::seconds(2)) << "did not exit at once";
  EXPECT_TRUE(Leftovers(dir_.path().string()).empty()) << Join(Leftovers(dir_.path().string()));
}

INSTANTIATE_TEST_SUITE_P(Signals, InterruptTest, ::testing::Values(SIGINT, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGINT ? "Sigint" : "Sigterm");
                         });

// A killed run's temporary (no process holds it) is swept by the next run
// of restore, convert or replicate into the same folder; a temporary a
// live writer holds is kept.
TEST(LeftoverSweepTest, NextRunSweepsStaleTemporariesButNotLiveOnes) {
  TempDir dir;
  const std::string disk = dir / "disk.raw";
  WriteFile(disk, RandomBytes(4 * kMiB, 22));
  RunOk(Barge("backup --source " + Q(disk) + " --target " + Q(dir / "bk") + " --name d"));
  fs::create_directories(dir / "out");
  const std::string stale = dir / "out/.killed.raw.barge-tmp";
  const std::string live = dir / "out/.live.raw.barge-tmp";
  for (const std::string& cmd :
       std::vector<std::string>{"restore " + Q(dir / "bk/d") + " --to " + Q(dir / "out/r.raw"),
                                "convert -f raw " + Q(disk) + " " + Q(dir / "out/c.raw"),
                                "replicate " + Q(disk) + " --to " + Q(dir / "out/p.raw")}) {
    WriteFile(stale, RandomBytes(4096, 1));
    WriteFile(live, RandomBytes(4096, 2));
    int fd = ::open(live.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    RunOk(Barge(cmd));
    EXPECT_FALSE(fs::exists(stale)) << cmd;
    EXPECT_TRUE(fs::exists(live)) << cmd;
    ::close(fd);
  }
}

}  // namespace
}  // namespace barge::testing
