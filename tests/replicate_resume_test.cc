// Issue 20, "a dropped connection costs nothing", for replicate and the
// image catalog's syncs: a replicate killed (SIGKILL) after about half its
// data was written resumes on the next run of the same replicate from what
// the copies hold, checked against the digests of its resume journal: it
// reads little more than the rest (counted by nbdkit's log filter and by
// barge's bytes_read), and each copy is byte for byte the one an
// uninterrupted run writes, with the source's SHA-512 in its record. A
// damaged cluster of a staged copy is copied again; a changed source or
// --no-resume starts over. An image sync killed mid-send resumes on the
// next sync.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tests/testing/barge_child.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/resume_testing.h"

namespace barge::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kDiskBytes = 32 * kMiB;
constexpr uint64_t kCluster = 64 << 10;

using Child = ::barge::testing::BargeChild;

std::string Sha512Of(const std::string& path) {
  auto r = Sh("sha512sum " + Q(path));
  return r.stdout_text.substr(0, 128);
}

class ReplicateResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_TOOL("nbdkit");
    BARGE_REQUIRE_TOOL("qemu-img");
    disk_ = dir_ / "disk.raw";
    WriteFile(disk_, RandomBytes(kDiskBytes, 21));
    fs::create_directories(out_);
  }

  // Serves `file` on one socket path (the source's location stays the same
  // across servers): slowly (`delay` per read) or through the log filter.
  std::unique_ptr<SocketServer> Serve(const std::string& file, const std::string& delay, const std::string& log = "") {
    fs::remove(sock_);
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

  std::string Uri() const { return "nbd+unix:///?socket=" + sock_; }

  std::vector<std::string> ReplicateArgs(const std::vector<std::string>& to, const std::vector<std::string>& more = {}) {
    std::vector<std::string> a = {"replicate", Uri(), "--json"};
    for (const auto& t : to) {
      a.push_back("--to");
      a.push_back(t);
    }
    a.insert(a.end(), more.begin(), more.end());
    return a;
  }

  // Runs `args` and SIGKILLs it once the resume journal of `copy` holds
  // about `fraction` of the disk's clusters.
  void KillWhenWritten(const std::vector<std::string>& args, const std::string& copy, double fraction) {
    const std::string journal = fs::path(copy).parent_path() / ("." + fs::path(copy).filename().string() +
                                                                ".barge-resume");
    Child child(args, dir_ / "killed.log");
    uint64_t want = static_cast<uint64_t>(static_cast<double>(kDiskBytes / kCluster) * fraction) * kJournalEntryBytes;
    ASSERT_TRUE(child.WaitFor([&] { return FileSize(journal) > want + 1024; }))
        << "the replicate ended before it was killed:\n"
        << Slurp(dir_ / "killed.log");
    child.Kill();
    ASSERT_GT(FileSize(journal), 0u);
  }

  TempDir dir_;
  std::string disk_;
  std::string sock_ = dir_ / "nbd.sock";
  std::string out_ = dir_ / "out";
};

TEST_F(ReplicateResumeTest, KilledRawReplicateResumesAndReadsOnlyTheRest) {
  const std::string a = out_ + "/a.raw", b = out_ + "/b.raw";
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenWritten(ReplicateArgs({a, b}), a, 0.5);
  }
  EXPECT_FALSE(fs::exists(a));
  const std::string log = dir_ / "nbdkit.log";
  auto logged = Serve(disk_, "", log);
  auto run = Sh(JoinArgs(ReplicateArgs({a, b})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  ASSERT_TRUE(result.contains("resume")) << result.dump();
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>()) << result.dump();
  uint64_t staged = result["resume"]["staged_bytes"].get<uint64_t>();
  EXPECT_GE(staged, kDiskBytes * 2 / 5);
  uint64_t read = result["bytes_read"].get<uint64_t>();
  EXPECT_EQ(read, kDiskBytes - staged);
  EXPECT_LT(read, kDiskBytes * 6 / 10);
  logged.reset();  // flushes the log
  EXPECT_LE(BytesReadInLog(log), kDiskBytes * 6 / 10);
  EXPECT_GT(BytesReadInLog(log), 0u);
  // Both copies equal the source, and the SHA-512 (taken partly from what
  // the copies held) is the source's.
  EXPECT_EQ(Sh("cmp " + Q(a) + " " + Q(disk_)).exit_code, 0);
  EXPECT_EQ(Sh("cmp " + Q(b) + " " + Q(disk_)).exit_code, 0);
  EXPECT_EQ(result["sha512"], Sha512Of(disk_));
  EXPECT_EQ(ReadJson(a + ".sha512.json")["sha512"], Sha512Of(disk_));
  EXPECT_TRUE(Leftovers(out_).empty()) << Leftovers(out_).front();
}

TEST_F(ReplicateResumeTest, KilledQcow2ReplicateIsByteIdenticalAndVerifies) {
  const std::string a = out_ + "/a.qcow2";
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenWritten(ReplicateArgs({a}, {"--format", "qcow2", "--compress", "zstd"}), a, 0.5);
  }
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(ReplicateArgs({a}, {"--format", "qcow2", "--compress", "zstd", "--verify"})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>()) << result.dump();
  EXPECT_LT(result["bytes_read"].get<uint64_t>(), kDiskBytes * 6 / 10);
  EXPECT_TRUE(result["destinations"][0]["verified"].get<bool>());
  EXPECT_EQ(Sh("qemu-img compare -f qcow2 -F raw " + Q(a) + " " + Q(disk_)).exit_code, 0);
  auto check = Sh("qemu-img check " + Q(a));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  // Byte for byte what an uninterrupted run writes from the same data.
  const std::string whole = dir_ / "whole.qcow2";
  auto u = Sh(Barge("replicate " + Q(Uri()) + " --to " + Q(whole) + " --format qcow2 --compress zstd"));
  ASSERT_EQ(u.exit_code, 0) << u.output;
  EXPECT_EQ(Sh("cmp " + Q(a) + " " + Q(whole)).exit_code, 0);
  EXPECT_EQ(result["sha512"], Sha512Of(disk_));
  EXPECT_TRUE(Leftovers(out_).empty()) << Leftovers(out_).front();
}

TEST_F(ReplicateResumeTest, DamagedStagedClusterIsCopiedAgain) {
  const std::string a = out_ + "/a.raw";
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenWritten(ReplicateArgs({a}), a, 0.5);
  }
  const std::string staged = out_ + "/.a.raw.barge-tmp";
  ASSERT_GT(FileSize(staged), 101 * kCluster);
  ASSERT_EQ(Sh("printf 'XXXX' | dd of=" + Q(staged) + " bs=1 seek=" + std::to_string(100 * kCluster + 5000) +
               " conv=notrunc status=none")
                .exit_code,
            0);
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(ReplicateArgs({a})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>());
  EXPECT_EQ(result["resume"]["staged_bytes"], 100 * kCluster);
  EXPECT_TRUE(Has(result["resume"]["problem"].get<std::string>(), "cluster 100")) << result.dump();
  EXPECT_EQ(Sh("cmp " + Q(a) + " " + Q(disk_)).exit_code, 0);
  EXPECT_EQ(result["sha512"], Sha512Of(disk_));
}

TEST_F(ReplicateResumeTest, ChangedSourceOrNoResumeStartsOver) {
  const std::string a = out_ + "/a.raw";
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenWritten(ReplicateArgs({a}), a, 0.3);
  }
  {
    auto fast = Serve(disk_, "");
    auto run = Sh(JoinArgs(ReplicateArgs({a}, {"--no-resume"})));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    nlohmann::json result = ResultOf(run.stdout_text);
    EXPECT_FALSE(result["resume"]["resumed"].get<bool>());
    EXPECT_EQ(result["resume"]["problem"], "resuming is off");
    EXPECT_EQ(result["bytes_read"], kDiskBytes);
    EXPECT_EQ(Sh("cmp " + Q(a) + " " + Q(disk_)).exit_code, 0);
    EXPECT_TRUE(Leftovers(out_).empty()) << Leftovers(out_).front();
  }
  // The source grew since the copy was cut: its staged part is not reused.
  const std::string c = out_ + "/c.raw";
  {
    auto slow = Serve(disk_, "150ms");
    KillWhenWritten(ReplicateArgs({c}), c, 0.3);
  }
  ASSERT_EQ(::truncate(disk_.c_str(), static_cast<off_t>(kDiskBytes + kMiB)), 0);
  auto fast = Serve(disk_, "");
  auto run = Sh(JoinArgs(ReplicateArgs({c})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  EXPECT_FALSE(result["resume"]["resumed"].get<bool>());
  EXPECT_TRUE(Has(result["resume"]["problem"].get<std::string>(), "size changed")) << result.dump();
  EXPECT_EQ(Sh("cmp " + Q(c) + " " + Q(disk_)).exit_code, 0);
}

// An NBD export as a target, beside a file: a replicate killed at about
// half resumes both from what they hold (the export read back over NBD
// against the journal kept in --state-dir) and reads only the rest; the
// export's old bytes never survive (zeros written where the source has
// them), and a second run needs no --force (the journal names the export).
TEST_F(ReplicateResumeTest, KilledReplicateToNbdTargetResumes) {
  // The source: random data with 4 MiB of zeros in the middle.
  {
    std::vector<std::byte> bytes = RandomBytes(kDiskBytes, 23);
    std::fill(bytes.begin() + 12 * kMiB, bytes.begin() + 16 * kMiB, std::byte{0});
    WriteFile(disk_, bytes);
  }
  // The target export: a file of other bytes, served by nbdkit.
  const std::string target = dir_ / "target.raw";
  WriteFile(target, RandomBytes(kDiskBytes, 77));
  const std::string target_sock = dir_ / "target.sock";
  SocketServer target_server("nbdkit --foreground --exit-with-parent --unix " + Q(target_sock) + " file " + Q(target),
                             target_sock);
  ASSERT_TRUE(target_server.WaitReady());
  const std::string nbd_target = target_server.uri();
  const std::string state = dir_ / "state";
  const std::string a = out_ + "/a.raw";
  {
    auto slow = Serve(disk_, "150ms");
    // Holds data: --force for the first run.
    KillWhenWritten(ReplicateArgs({a, nbd_target}, {"--state-dir", state, "--force"}), a, 0.5);
  }
  // The export's journal is in the state folder, keyed by the URI.
  std::vector<std::string> journals = Leftovers(state);
  ASSERT_EQ(journals.size(), 1u);
  EXPECT_TRUE(journals.front().ends_with(".barge-resume")) << journals.front();
  const std::string log = dir_ / "nbdkit.log";
  auto logged = Serve(disk_, "", log);
  auto run = Sh(JoinArgs(ReplicateArgs({a, nbd_target}, {"--state-dir", state, "--verify"})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  nlohmann::json result = ResultOf(run.stdout_text);
  ASSERT_TRUE(result.contains("resume")) << result.dump();
  EXPECT_TRUE(result["resume"]["resumed"].get<bool>()) << result.dump();
  uint64_t staged = result["resume"]["staged_bytes"].get<uint64_t>();
  EXPECT_GE(staged, kDiskBytes * 2 / 5);
  EXPECT_EQ(result["bytes_read"].get<uint64_t>(), kDiskBytes - staged);
  logged.reset();
  EXPECT_LE(BytesReadInLog(log), kDiskBytes * 6 / 10);
  ASSERT_EQ(result["destinations"].size(), 2u);
  EXPECT_EQ(result["destinations"][1]["path"], nbd_target);
  EXPECT_EQ(result["destinations"][1]["state"], "ready");
  EXPECT_TRUE(result["destinations"][1]["verified"].get<bool>());
  EXPECT_EQ(result["sha512"], Sha512Of(disk_));
  EXPECT_EQ(Sh("cmp " + Q(a) + " " + Q(disk_)).exit_code, 0);
  EXPECT_EQ(Sh("cmp " + Q(target) + " " + Q(disk_)).exit_code, 0);
  // The record is in the state folder; no journal is left anywhere.
  EXPECT_TRUE(Leftovers(state).empty()) << Leftovers(state).front();
  EXPECT_TRUE(Leftovers(out_).empty()) << Leftovers(out_).front();
  int records = 0;
  for (const auto& e : fs::directory_iterator(state)) {
    if (!e.path().string().ends_with(".sha512.json")) continue;
    ++records;
    nlohmann::json record = ReadJson(e.path().string());
    EXPECT_EQ(record["sha512"], Sha512Of(disk_));
    EXPECT_EQ(record["format"], "raw");
  }
  EXPECT_EQ(records, 1);
  // Written again without --force: the record names the export.
  auto fast = Serve(disk_, "");
  auto again = Sh(JoinArgs(ReplicateArgs({nbd_target}, {"--state-dir", state})));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  // A qcow2 copy cannot go to an export.
  auto qcow2 = Sh(JoinArgs(ReplicateArgs({nbd_target}, {"--state-dir", state, "--format", "qcow2"})));
  EXPECT_EQ(qcow2.exit_code, 1) << qcow2.output;
  EXPECT_TRUE(Has(qcow2.stderr_text, "use --format raw")) << qcow2.stderr_text;
}

// A sync killed while it sends a copy: the next sync (from whichever ready
// copy) resumes that send from what the copy's temporary holds.
TEST_F(ReplicateResumeTest, KilledImageSyncResumesOnTheNextSync) {
  const std::string catalog = dir_ / "catalog.db";
  const std::string d1 = dir_ / "d1", d2 = dir_ / "d2";
  fs::create_directories(d1);
  fs::create_directories(d2);
  // The first copy comes from the slow server; d2's is sent from d1's.
  {
    auto fast = Serve(disk_, "");
    auto add = Sh(Barge("image add base --source " + Q(Uri()) + " --disk " + Q(d1) + " --catalog " + Q(catalog)));
    ASSERT_EQ(add.exit_code, 0) << add.output;
  }
  const std::string copy1 = d1 + "/base";
  ASSERT_TRUE(fs::exists(copy1));
  // Killed once the send to d2 has journaled a checkpoint (a local copy is
  // quick: one thread; skipped when it ends first).
  const std::string journal = d2 + "/.base.barge-resume";
  {
    Child child({"image", "sync", "base", "--disks", d2, "--catalog", catalog, "--threads", "1"},
                dir_ / "sync.log");
    bool seen = child.WaitFor([&] { return FileSize(journal) > 1024; });
    if (!seen) GTEST_SKIP() << "the sync finished before it could be killed:\n" << Slurp(dir_ / "sync.log");
    child.Kill();
  }
  // Recovery (status marks the send interrupted) spares the journaled
  // temporary for the next sync.
  auto recovered = Sh(Barge("image status base --catalog " + Q(catalog)));
  ASSERT_EQ(recovered.exit_code, 0) << recovered.output;
  EXPECT_TRUE(Has(recovered.stdout_text, "interrupted")) << recovered.output;
  EXPECT_TRUE(fs::exists(d2 + "/.base.barge-tmp"));
  ASSERT_GT(FileSize(journal), 0u);
  auto sync = Sh(Barge("image sync base --disks " + Q(d2) + " --catalog " + Q(catalog)));
  ASSERT_EQ(sync.exit_code, 0) << sync.output;
  EXPECT_EQ(Sh("cmp " + Q(d2 + "/base") + " " + Q(disk_)).exit_code, 0);
  EXPECT_TRUE(Leftovers(d2).empty()) << Leftovers(d2).front();
  auto status = Sh(Barge("image status base --json --catalog " + Q(catalog)));
  EXPECT_TRUE(Has(status.stdout_text, "ready")) << status.output;
}

}  // namespace
}  // namespace barge::testing
