// Issue 20, "a dropped connection costs nothing": a backup killed (SIGKILL)
// or failed (its NBD server gone for good) after about half its data was
// staged resumes on the next run of the same backup from what was staged,
// checked against its digests: it reads little more than the rest (counted
// by nbdkit's log filter and by barge), and the point equals the source
// (qemu-img compare), verifies, checks clean, and is byte for byte the file
// an uninterrupted run writes. A damaged staged cluster is copied again; a
// changed source size or another --compress starts over.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "tests/testing/barge_child.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/resume_testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kDiskBytes = 32 * kMiB;
constexpr uint64_t kCluster = 64 << 10;

using Child = ::barge::testing::BargeChild;

class BackupResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("nbdkit");
    BARGE_REQUIRE_TOOL("qemu-img");
    disk_ = dir_ / "disk.raw";
    WriteFile(disk_, RandomBytes(kDiskBytes, 20));
  }

  // Serves `file` on one socket path (the disk's identity stays the same
  // across servers): slowly (`delay` per read) or through the log filter.
  std::unique_ptr<SocketServer> Serve(const std::string& file, const std::string& delay, const std::string& log = "") {
    fs::remove(sock_);  // a stopped server's socket file stays
    std::string filters = delay.empty() ? "" : " --filter=delay";
    if (!log.empty()) filters += " --filter=log";
    std::string args = delay.empty() ? "" : " rdelay=" + delay;
    if (!log.empty()) args += " logfile=" + Q(log);
    auto server = std::make_unique<SocketServer>("nbdkit --foreground --exit-with-parent --unix " + Q(sock_) +
                                                     filters + " file " + Q(file) + args,
                                                 sock_);
    EXPECT_TRUE(server->WaitReady());
    return server;
  }

  std::vector<std::string> BackupArgs(const std::string& uri, const std::vector<std::string>& more = {}) {
    std::vector<std::string> a = {"backup", "--source", uri, "--target", target_, "--name", "d", "--json"};
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  // Runs `args` and SIGKILLs it once its resume journal holds about
  // `fraction` of `clusters` clusters (checkpoints land every few MiB).
  void KillWhenStaged(const std::vector<std::string>& args, uint64_t clusters, double fraction) {
    const std::string journal = target_ + "/d/.backup.barge-resume";
    Child child(args, dir_ / "killed.log");
    uint64_t want = static_cast<uint64_t>(static_cast<double>(clusters) * fraction) * kJournalEntryBytes;
    ASSERT_TRUE(child.WaitFor([&] { return FileSize(journal) > want + 1024; }))
        << "the backup ended before it was killed:\n"
        << Slurp(dir_ / "killed.log");
    child.Kill();
    ASSERT_GT(FileSize(journal), 0u);
  }

  // The chain's one point's image.
  std::string PointImage() {
    auto ids = PointIds(target_ + "/d");
    EXPECT_EQ(ids.size(), 1u);
    return ids.empty() ? "" : target_ + "/d/" + ids.back() + ".qcow2";
  }

  void ExpectGoodPoint(const std::string& image, const std::string& source) {
    EXPECT_EQ(Sh("qemu-img compare -f qcow2 -F raw " + Q(image) + " " + Q(source)).exit_code, 0);
    auto check = Sh("qemu-img check " + Q(image));
    EXPECT_EQ(check.exit_code, 0) << check.output;
    auto verify = Sh(Barge("verify " + Q(target_ + "/d")));
    EXPECT_EQ(verify.exit_code, 0) << verify.output;
    EXPECT_TRUE(Leftovers(target_).empty()) << Leftovers(target_).front();
  }

  TempDir dir_;
  std::string disk_;
  std::string sock_ = dir_ / "nbd.sock";
  std::string target_ = dir_ / "t";
};

TEST_F(BackupResumeTest, KilledRunResumesAndReadsOnlyTheRest) {
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.5);
  }
  const std::string log = dir_ / "nbdkit.log";
  auto logged = Serve(disk_, "", log);
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  ASSERT_TRUE(result.contains("resume")) << result.dump();
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>());
  EXPECT_EQ(result["resume"]["problem"], "");
  uint64_t staged = result["resume"]["staged_bytes"].get<uint64_t>();
  EXPECT_GE(staged, kDiskBytes * 2 / 5);
  // What the resumed run read: barge's count and the server's agree, and
  // stay near the unstaged rest (the target is <= 55% at half staged).
  uint64_t read = result["bytes_read"].get<uint64_t>();
  EXPECT_EQ(read, kDiskBytes - staged);
  EXPECT_LT(read, kDiskBytes * 6 / 10);
  logged.reset();  // flushes the log
  EXPECT_LE(BytesReadInLog(log), kDiskBytes * 6 / 10);
  EXPECT_GT(BytesReadInLog(log), 0u);
  std::string image = PointImage();
  ExpectGoodPoint(image, disk_);

  // Byte for byte what an uninterrupted run writes (the writer is
  // deterministic for the same data and options).
  std::string other = dir_ / "u";
  auto whole = Sh(Barge("backup --source " + Q(disk_) + " --source-format raw --target " + Q(other) + " --name d"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  auto ids = PointIds(other + "/d");
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(Sh("cmp " + Q(image) + " " + Q(other + "/d/" + ids[0] + ".qcow2")).exit_code, 0);
  EXPECT_EQ(result["image_digest"],
            "xxh3-128:" + ReadJson(other + "/d/" + ids[0] + ".json")["image_digest"]["value"].get<std::string>());
}

TEST_F(BackupResumeTest, TextOutputSaysItResumed) {
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.5);
  }
  auto fast = Serve(disk_, "");
  auto run = Sh(Barge("backup --source " + Q("nbd+unix:///?socket=" + sock_) + " --target " + Q(target_) +
                      " --name d"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Has(run.stdout_text, "resuming from ")) << run.output;
  EXPECT_TRUE(Has(run.stdout_text, "(resumed: ")) << run.output;
}

TEST_F(BackupResumeTest, DamagedStagedClusterIsCopiedAgain) {
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.5);
  }
  // Random data is stored raw, in guest order after the header's cluster:
  // guest cluster 100 lies at host cluster 101.
  std::string staged;
  for (const auto& e : fs::directory_iterator(target_ + "/d")) {
    if (e.path().filename().string().ends_with(".qcow2.barge-tmp")) staged = e.path().string();
  }
  ASSERT_FALSE(staged.empty());
  ASSERT_GT(FileSize(staged), 102 * kCluster);
  ASSERT_EQ(Sh("printf 'XXXX' | dd of=" + Q(staged) + " bs=1 seek=" + std::to_string(101 * kCluster + 5000) +
               " conv=notrunc status=none")
                .exit_code,
            0);
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>());
  EXPECT_EQ(result["resume"]["staged_bytes"], 100 * kCluster);
  EXPECT_TRUE(Has(result["resume"]["problem"].get<std::string>(), "cluster 100")) << result.dump();
  ExpectGoodPoint(PointImage(), disk_);
}

TEST_F(BackupResumeTest, OtherCompressionOrSizeStartsOver) {
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.3);
  }
  {
    auto fast = Serve(disk_, "");
    auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_, {"--compress", "none"})));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    nlohmann::json result = ResultOf(run.stdout_text);
    EXPECT_FALSE(result["resume"]["resumed"].get<bool>());
    EXPECT_TRUE(Has(result["resume"]["problem"].get<std::string>(), "compression")) << result.dump();
    EXPECT_EQ(result["bytes_read"], kDiskBytes);
    ExpectGoodPoint(PointImage(), disk_);
  }
  // A grown source: another chain folder, killed, then the disk grows.
  target_ = dir_ / "t2";
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.3);
  }
  ASSERT_EQ(::truncate(disk_.c_str(), static_cast<off_t>(kDiskBytes + kMiB)), 0);
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_FALSE(result["resume"]["resumed"].get<bool>());
  EXPECT_TRUE(Has(result["resume"]["problem"].get<std::string>(), "size changed")) << result.dump();
  ExpectGoodPoint(PointImage(), disk_);
}

TEST_F(BackupResumeTest, FailedRunWhoseServerWentAwayResumes) {
  {
    auto slow = Serve(disk_, "150ms");
    const std::string journal = target_ + "/d/.backup.barge-resume";
    Child child(BackupArgs("nbd+unix:///?socket=" + sock_), dir_ / "failed.log");
    ASSERT_TRUE(child.WaitFor([&] { return FileSize(journal) > 200 * kJournalEntryBytes; }))
        << Slurp(dir_ / "failed.log");
    slow.reset();  // the connection is lost for good
    EXPECT_NE(child.Wait(), 0);
    std::string out = Slurp(dir_ / "failed.log");
    EXPECT_TRUE(Has(out, "the next run of this backup resumes from it")) << out;
  }
  EXPECT_GT(FileSize(target_ + "/d/.backup.barge-resume"), 0u);
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>());
  EXPECT_LT(result["bytes_read"].get<uint64_t>(), kDiskBytes);
  ExpectGoodPoint(PointImage(), disk_);
}

TEST_F(BackupResumeTest, IncrementalFromExtentsResumes) {
  {
    auto fast = Serve(disk_, "");
    auto full = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
    ASSERT_EQ(full.exit_code, 0) << full.output;
  }
  // Change 16 MiB in four places and say so in an extents file.
  std::vector<std::pair<uint64_t, uint64_t>> changed = {
      {0, 4 * kMiB}, {8 * kMiB, 4 * kMiB}, {16 * kMiB, 4 * kMiB}, {28 * kMiB, 4 * kMiB}};
  for (auto [offset, length] : changed) {
    std::vector<std::byte> bytes = RandomBytes(length, offset + 7);
    if (offset == 16 * kMiB) std::fill(bytes.begin(), bytes.begin() + kMiB, std::byte{0});  // became zero
    int fd = ::open(disk_.c_str(), O_WRONLY);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)), static_cast<ssize_t>(length));
    ::close(fd);
  }
  std::string extents = dir_ / "changes.json";
  WriteExtentsFile(extents, changed, kDiskBytes);
  std::vector<std::string> inc = {"--incremental", "--dirty-extents", extents};
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_, inc), 16 * kMiB / kCluster, 0.5);
  }
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_, inc)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>()) << result.dump();
  EXPECT_LT(result["bytes_read"].get<uint64_t>(), 16 * kMiB * 6 / 10);
  auto ids = PointIds(target_ + "/d");
  ASSERT_EQ(ids.size(), 2u);
  std::string image = target_ + "/d/" + ids[1] + ".qcow2";
  EXPECT_EQ(Sh("qemu-img compare -f qcow2 -F raw " + Q(image) + " " + Q(disk_)).exit_code, 0);
  EXPECT_EQ(Sh("qemu-img check " + Q(image)).exit_code, 0);
  auto verify = Sh(Barge("verify " + Q(target_ + "/d")));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_TRUE(Leftovers(target_).empty());
}

// Issue 36, item 2: a resumed point reads the rest of its work now, so it
// holds the source as of the resumed run, not of the killed one. Its time
// and id are the resumed run's: a restore at a time between the two runs
// gets the point before (whose data that time saw), not the resumed one.
TEST_F(BackupResumeTest, ResumedPointTakesTheResumedRunsTime) {
  auto utc = [] {
    std::time_t t = std::time(nullptr);
    std::tm tm;
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return std::string(buf);
  };
  std::string first_id;
  {
    auto fast = Serve(disk_, "");
    auto full = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
    ASSERT_EQ(full.exit_code, 0) << full.output;
    first_id = ResultOf(full.stdout_text)["id"].get<std::string>();
  }
  const std::string killed_at = utc();
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.3);
  }
  // The guest writes after the kill, where the killed run staged nothing
  // (the last MiB); names and times have one-second resolution.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string written_at = utc();
  std::vector<std::byte> bytes = RandomBytes(kMiB, 99);
  int fd = ::open(disk_.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(kDiskBytes - kMiB)),
            static_cast<ssize_t>(kMiB));
  ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));

  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  ASSERT_TRUE(result["resume"]["resumed"].get<bool>()) << result.dump();
  EXPECT_GE(result["resume"]["staged_bytes"].get<uint64_t>(), kDiskBytes / 5);
  const std::string started = result["started_at"].get<std::string>();
  EXPECT_GT(started, written_at) << "the killed run started at about " << killed_at;
  const std::string id = result["id"].get<std::string>();
  std::string compact;
  for (char c : started) {
    if (c != '-' && c != ':') compact += c;
  }
  EXPECT_EQ(id, "0001-" + compact);
  // Named after the resumed run: manifest, image and digest table.
  auto ids = PointIds(target_ + "/d");
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0], first_id);
  EXPECT_EQ(ids[1], id);
  EXPECT_EQ(ReadJson(ManifestPath(target_ + "/d", id))["started_at"], started);
  const std::string image = target_ + "/d/" + id + ".qcow2";
  ASSERT_TRUE(fs::exists(image));
  EXPECT_TRUE(fs::exists(target_ + "/d/" + id + ".digests"));
  EXPECT_EQ(Sh("qemu-img compare -f qcow2 -F raw " + Q(image) + " " + Q(disk_)).exit_code, 0);
  auto verify = Sh(Barge("verify " + Q(target_ + "/d")));
  EXPECT_EQ(verify.exit_code, 0) << verify.output;
  EXPECT_TRUE(Leftovers(target_).empty()) << Leftovers(target_).front();

  // A restore at the time of the write gets the point before it.
  const std::string out = dir_ / "at.raw";
  auto at = Sh(Barge("restore --json " + Q(target_ + "/d") + " --at " + written_at + " --to " + Q(out) +
                     " --no-sync"));
  ASSERT_EQ(at.exit_code, 0) << at.output;
  EXPECT_EQ(ResultOf(at.stdout_text)["id"], first_id) << at.output;
  const std::vector<std::byte> before = RandomBytes(kDiskBytes, 20);  // the disk as SetUp wrote it
  const std::string got = Slurp(out);
  EXPECT_TRUE(got.size() == before.size() && std::memcmp(got.data(), before.data(), got.size()) == 0);
  // list orders the points the same way, with the resumed run's time.
  auto list = Sh(Barge("list --json " + Q(target_ + "/d")));
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(Has(list.stdout_text, "\"" + started + "\"")) << list.output;
}

TEST_F(BackupResumeTest, NoResumeStartsOver) {
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenStaged(BackupArgs("nbd+unix:///?socket=" + sock_), kDiskBytes / kCluster, 0.3);
  }
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(BackupArgs("nbd+unix:///?socket=" + sock_, {"--no-resume"})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_FALSE(result["resume"]["resumed"].get<bool>());
  EXPECT_EQ(result["bytes_read"], kDiskBytes);
  ExpectGoodPoint(PointImage(), disk_);
}

}  // namespace
}  // namespace barge::testing
