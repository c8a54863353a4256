// barge image add/sync/status/cleanup/rescan through the real CLI: a
// backing image added on one disk, delivered to four more with at most three
// concurrent sends per ready copy, status per disk, cleanup that keeps used
// copies and removes unused ones only after the interval, and a catalog
// rebuilt from the disks. Across processes: a sync killed mid-send is marked
// interrupted and redone; a second sync of the same image is refused while
// syncs of different images run side by side.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <filesystem>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "tests/testing/cli_testing.h"

namespace barge {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Barge;
using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

struct Catalog {
  TempDir dir;
  std::string db = dir / "catalog.db";
  std::string src = dir / "src.raw";
  Catalog() { testing::WriteFile(src, testing::RandomBytes(24 * kMiB, 5)); }
  std::string Disk(int i) const { return dir / ("disk" + std::to_string(i)); }
  std::string Cmd(const std::string& args) const {
    return Barge() + " image " + args + " --catalog " + ShellQuote(db);
  }
};

TEST(ImageCatalogCliTest, AddSyncStatusCleanupRescan) {
  BARGE_REQUIRE_TOOL("qemu-img");
  Catalog c;
  json added = testing::RunResult(c.Cmd("add base --json --source " + ShellQuote(c.src) + " --disk " +
                                       ShellQuote(c.Disk(0))))["copy"];
  EXPECT_EQ(added["state"], "ready") << added.dump();
  std::string first = added["path"];
  // A copy keeps its source's extension (issue 18): the file says its format.
  EXPECT_EQ(first, fs::canonical(c.Disk(0)).string() + "/base.raw");

  std::string disks = c.Disk(1) + "," + c.Disk(2) + "," + c.Disk(3) + "," + c.Disk(4);
  json sync = testing::RunResult(c.Cmd("sync base --json --disks " + ShellQuote(disks)));
  ASSERT_EQ(sync["copies"].size(), 4u) << sync.dump();
  for (const auto& cp : sync["copies"]) {
    EXPECT_EQ(cp["state"], "ready") << cp.dump();
    RunOk("cmp " + ShellQuote(c.src) + " " + ShellQuote(cp["path"].get<std::string>()));
  }
  // Four disks, one ready copy: it serves three at once; the fourth waits
  // and goes to the copy with the fewest active sends (a new one).
  int first_max = 0, total = 0;
  for (const auto& s : sync["senders"]) {
    EXPECT_LE(s["max_concurrent"].get<int>(), 3) << s.dump();
    total += s["sends"].get<int>();
    if (s["sender"] == first) {
      first_max = s["max_concurrent"];
      EXPECT_EQ(s["sends"], 3);
    }
  }
  EXPECT_EQ(first_max, 3) << sync.dump();
  EXPECT_EQ(total, 4);

  json status = testing::RunResult(c.Cmd("status base --json"))["images"];
  ASSERT_EQ(status.size(), 1u);
  EXPECT_EQ(status[0]["copies"].size(), 5u);
  for (const auto& cp : status[0]["copies"]) EXPECT_EQ(cp["state"], "ready");
  EXPECT_EQ(status[0]["senders"].size(), 2u) << status.dump();

  // A VM disk on disk1 uses the copy there as its backing file.
  RunOk("qemu-img create -q -f qcow2 -b base.raw -F raw " + ShellQuote(c.Disk(1) + "/vm.qcow2"));
  json clean = testing::RunResult(c.Cmd("cleanup --json --unused-for 1h"));
  EXPECT_TRUE(clean["removed"].empty()) << clean.dump();
  EXPECT_EQ(clean["in_use"].size(), 1u);
  EXPECT_EQ(clean["waiting"].size(), 4u);
  {
    // While another process holds the image's lock (a sync sending from
    // these copies), cleanup removes nothing of that image.
    std::string lock = c.dir / "locks/images/base.lock";
    int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
    json held = testing::RunResult(c.Cmd("cleanup --json --unused-for 0"));
    ::close(fd);
    EXPECT_TRUE(held["removed"].empty()) << held.dump();
    EXPECT_EQ(held["busy"].size(), 4u) << held.dump();
    for (int i : {0, 2, 3, 4}) EXPECT_TRUE(fs::exists(c.Disk(i) + "/base.raw"));
  }
  clean = testing::RunResult(c.Cmd("cleanup --json --unused-for 0"));
  EXPECT_EQ(clean["removed"].size(), 4u) << clean.dump();
  EXPECT_EQ(clean["in_use"].size(), 1u);
  EXPECT_TRUE(fs::exists(c.Disk(1) + "/base.raw"));
  for (int i : {0, 2, 3, 4}) {
    EXPECT_FALSE(fs::exists(c.Disk(i) + "/base.raw"));
    EXPECT_FALSE(fs::exists(c.Disk(i) + "/base.raw.sha512.json"));
  }
  RunOk("qemu-img compare -q " + ShellQuote(c.Disk(1) + "/vm.qcow2") + " " + ShellQuote(c.src));

  // The catalog is rebuilt from the disks.
  fs::remove(c.db);
  fs::remove(c.db + "-wal");
  fs::remove(c.db + "-shm");
  status = testing::RunResult(c.Cmd("rescan --json --disks " + ShellQuote(c.Disk(1) + "," + c.Disk(2))))["images"];
  ASSERT_EQ(status.size(), 1u) << status.dump();
  ASSERT_EQ(status[0]["copies"].size(), 1u);
  EXPECT_EQ(status[0]["name"], "base");  // the file's extension is the source's, not the name's
  EXPECT_EQ(status[0]["copies"][0]["path"], fs::canonical(c.Disk(1)).string() + "/base.raw");
  EXPECT_EQ(status[0]["copies"][0]["state"], "ready");
  EXPECT_EQ(status[0]["sha512"], RunOk("sha512sum " + ShellQuote(c.src)).substr(0, 128));
}

// A failed add reports why and leaves no catalog row (issue 12): the image
// is not in the catalog until an add succeeds.
TEST(ImageCatalogCliTest, WrongChecksumIsFailedWithMessage) {
  Catalog c;
  auto r = testing::Run(c.Cmd("add base --source " + ShellQuote(c.src) + " --disk " + ShellQuote(c.Disk(0)) +
                     " --expected-sha512 " + std::string(128, 'a')));
  EXPECT_EQ(r.exit_code, 2) << r.output;  // the content is not what was expected
  EXPECT_NE(r.output.find("mismatch"), std::string::npos) << r.output;
  r = testing::Run(c.Cmd("status base"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no image 'base'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(c.Disk(0) + "/base.raw"));
  // Sync has nothing to send from.
  EXPECT_NE(testing::Run(c.Cmd("sync base --disks " + ShellQuote(c.Disk(1)))).exit_code, 0);
}

// Found by the reliability campaign (issue 13): a copy that failed for
// want of space failed `image add` and `image sync` with IoError, and
// sync's error named no file. Each disk here is a tmpfs too small for the
// image: the error is NoSpace and names the copy on that disk.
TEST(ImageCatalogCliTest, Issue13FullDiskFailsWithNoSpaceNamingTheCopy) {
  Catalog c;
  std::vector<std::string> mounted;
  for (int i : {0, 1, 2}) {
    fs::create_directories(c.Disk(i));
    if (i == 0) continue;  // disk0 holds the first copy
    if (::mount("tmpfs", c.Disk(i).c_str(), "tmpfs", 0, "size=4m") != 0) {
      for (const auto& m : mounted) ::umount2(m.c_str(), MNT_DETACH);
      GTEST_SKIP() << "cannot mount a tmpfs (needs root): " << std::strerror(errno);
    }
    mounted.push_back(c.Disk(i));
  }
  RunOk(c.Cmd("add base --source " + ShellQuote(c.src) + " --disk " + ShellQuote(c.Disk(0))));
  for (const std::string& args : {"add other --source " + ShellQuote(c.src) + " --disk " + ShellQuote(c.Disk(1)),
                                  "sync base --disks " + ShellQuote(c.Disk(1) + "," + c.Disk(2))}) {
    auto r = testing::Run(c.Cmd(args + " --json"));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    json error;
    std::stringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == "error") error = j;
    }
    ASSERT_TRUE(error.is_object()) << r.output;
    EXPECT_EQ(error.value("code", ""), "NoSpace") << error.dump();
    EXPECT_TRUE(error.value("file", "").starts_with(c.Disk(1))) << error.dump();
  }
  for (const auto& m : mounted) ::umount2(m.c_str(), MNT_DETACH);
}

// A background barge process (stdout and stderr on /dev/null), killed and
// reaped by the destructor if the test did not wait for it (a failed ASSERT
// must not leave a stopped process behind).
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Waits (up to 60 s) until the process has written to the temporary of
  // `copy_path` (".NAME.barge-tmp"), then stops it (SIGSTOP): the send is
  // caught in the middle whatever the machine's speed. False if the process
  // ended first.
  bool StopMidSend(const std::string& copy_path) {
    fs::path p(copy_path);
    std::string temp = (p.parent_path() / ("." + p.filename().string() + ".barge-tmp")).string();
    for (int i = 0; i < 60000; ++i) {
      std::error_code ec;
      uintmax_t size = fs::file_size(temp, ec);
      if (!ec && size > 0) return ::kill(pid_, SIGSTOP) == 0;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }
  void Signal(int sig) { ::kill(pid_, sig); }
  // Exit code, or 128 + signal.
  int Wait() {
    int status = 0;
    pid_t pid = std::exchange(pid_, -1);
    if (::waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
};

// A 256 MiB image beside the small one: big enough that a throttled send
// (one thread, small buffers, a verifying re-read) takes a while.
struct BigCatalog : Catalog {
  std::string big_src = dir / "big.raw";
  BigCatalog() {
    testing::WriteFile(big_src, testing::RandomBytes(256 * kMiB, 7));
    RunOk(Cmd("add big --source " + ShellQuote(big_src) + " --disk " + ShellQuote(Disk(0))));
  }
  // Disk i, created, as the catalog names it (canonical path).
  std::string DiskKey(int i) const {
    fs::create_directories(Disk(i));
    return fs::canonical(Disk(i)).string();
  }
  std::vector<std::string> SlowSync(const std::string& name, const std::string& disks) const {
    return {testing::BargeBinary(), "image", "sync", name, "--disks", disks, "--catalog", db,
            "--threads", "1", "--memory", "8M", "--verify"};
  }
};

json CopyOn(const json& status, const std::string& disk) {
  for (const auto& cp : status[0]["copies"]) {
    if (cp["disk"] == disk) return cp;
  }
  return json();
}

// A killed send's temporary is kept only when its resume journal
// (`.NAME.barge-resume`, docs/formats/resume.md) is beside it.
void ExpectOnlyJournaledTemporaries(const std::string& disk) {
  const std::string suffix = ".barge-tmp";
  for (const auto& e : fs::directory_iterator(disk)) {
    std::string name = e.path().filename().string();
    if (!name.ends_with(suffix)) continue;
    std::string journal = name.substr(0, name.size() - suffix.size()) + ".barge-resume";
    EXPECT_TRUE(fs::exists(e.path().parent_path() / journal)) << e.path() << " has no journal";
  }
}

TEST(ImageCatalogCliTest, KilledSyncIsInterruptedAndRedone) {
  BigCatalog c;
  std::string disk = c.DiskKey(1);
  std::string copy = disk + "/big.raw";
  std::string temp = disk + "/.big.raw.barge-tmp";

  Child sync(c.SlowSync("big", disk));
  ASSERT_TRUE(sync.StopMidSend(copy)) << "the sync finished before it could be caught mid-send";

  // While its process lives (stopped here), the copy stays in progress,
  // owned by it, and its temporary stays: only gone owners are recovered.
  json status = testing::RunResult(c.Cmd("status big --json"))["images"];
  json cp = CopyOn(status, disk);
  EXPECT_EQ(cp["state"], "in-progress") << status.dump();
  EXPECT_EQ(cp.value("owner", "").rfind("pid=" + std::to_string(sync.pid()) + " ", 0), 0u) << cp.dump();
  EXPECT_TRUE(fs::exists(temp));

  sync.Signal(SIGKILL);
  ASSERT_EQ(sync.Wait(), 128 + SIGKILL);

  status = testing::RunResult(c.Cmd("status big --json"))["images"];
  cp = CopyOn(status, disk);
  EXPECT_EQ(cp["state"], "failed") << status.dump();
  EXPECT_EQ(cp.value("message", ""), "interrupted (the sending process is gone)") << cp.dump();
  EXPECT_FALSE(cp.contains("owner")) << cp.dump();
  EXPECT_FALSE(fs::exists(copy));
  // A temporary stays only with a resume journal beside it, for the next sync.
  ExpectOnlyJournaledTemporaries(disk);

  // The next sync sends it again (resuming what the temporary holds).
  json result = testing::RunResult(c.Cmd("sync big --json --disks " + ShellQuote(disk)));
  ASSERT_EQ(result["copies"].size(), 1u) << result.dump();
  EXPECT_EQ(result["copies"][0]["state"], "ready") << result.dump();
  RunOk("cmp " + ShellQuote(c.big_src) + " " + ShellQuote(copy));
  status = testing::RunResult(c.Cmd("status big --json"))["images"];
  for (const auto& each : status[0]["copies"]) EXPECT_EQ(each["state"], "ready") << status.dump();
}

TEST(ImageCatalogCliTest, RescanKeepsALiveSyncAndRecoversAKilledOne) {
  BigCatalog c;
  std::string disk = c.DiskKey(1);
  Child sync(c.SlowSync("big", disk));
  ASSERT_TRUE(sync.StopMidSend(disk + "/big.raw")) << "the sync finished before it could be caught mid-send";
  // The live sync's row has no file or record yet; rescan keeps it.
  json status = testing::RunResult(c.Cmd("rescan --json --disks " + ShellQuote(disk)))["images"];
  EXPECT_EQ(CopyOn(status, disk)["state"], "in-progress") << status.dump();
  EXPECT_TRUE(fs::exists(disk + "/.big.raw.barge-tmp"));
  sync.Signal(SIGKILL);
  ASSERT_EQ(sync.Wait(), 128 + SIGKILL);
  // Once it is gone, rescan rebuilds the disk from its records: there is
  // none, so no row. Its temporary stays only with a resume journal.
  status = testing::RunResult(c.Cmd("rescan --json --disks " + ShellQuote(disk)))["images"];
  EXPECT_TRUE(CopyOn(status, disk).is_null()) << status.dump();
  ExpectOnlyJournaledTemporaries(disk);
}

TEST(ImageCatalogCliTest, SecondSyncOfAnImageIsRefusedOthersRunAlongside) {
  BigCatalog c;
  RunOk(c.Cmd("add small --source " + ShellQuote(c.src) + " --disk " + ShellQuote(c.Disk(0))));
  std::string disks = c.DiskKey(1) + "," + c.DiskKey(2);
  Child first(c.SlowSync("big", disks));
  ASSERT_TRUE(first.StopMidSend(c.DiskKey(1) + "/big.raw")) << "the sync finished before it could be caught mid-send";

  // The same image: refused at once, whatever the disks.
  auto t0 = std::chrono::steady_clock::now();
  auto busy = testing::Run(c.Cmd("sync big --disks " + ShellQuote(c.Disk(3))));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(busy.exit_code, 0);
  EXPECT_NE(busy.output.find("an image sync of big is already running"), std::string::npos) << busy.output;
  EXPECT_FALSE(fs::exists(c.Disk(3) + "/big.raw"));

  // Another image: runs to the end while the first is still mid-send.
  json other = testing::RunResult(c.Cmd("sync small --json --disks " + ShellQuote(disks)));
  ASSERT_EQ(other["copies"].size(), 2u) << other.dump();
  for (const auto& cp : other["copies"]) EXPECT_EQ(cp["state"], "ready") << cp.dump();

  first.Signal(SIGCONT);
  EXPECT_EQ(first.Wait(), 0);
  json status = testing::RunResult(c.Cmd("status --json"))["images"];
  ASSERT_EQ(status.size(), 2u) << status.dump();
  for (const auto& image : status) {
    EXPECT_EQ(image["copies"].size(), 3u) << image.dump();
    for (const auto& cp : image["copies"]) EXPECT_EQ(cp["state"], "ready") << cp.dump();
    // Each sender within the 3-send limit.
    for (const auto& s : image["senders"]) EXPECT_LE(s["max_concurrent"].get<int>(), 3) << image.dump();
  }
  for (int i : {1, 2}) {
    RunOk("cmp " + ShellQuote(c.big_src) + " " + ShellQuote(c.Disk(i) + "/big.raw"));
    RunOk("cmp " + ShellQuote(c.src) + " " + ShellQuote(c.Disk(i) + "/small.raw"));
  }
  // With the first done, the image syncs again.
  RunOk(c.Cmd("sync big --disks " + ShellQuote(c.Disk(3))));
}

}  // namespace
}  // namespace barge
