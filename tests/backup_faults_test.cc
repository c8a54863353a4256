// Backup jobs that fail: injected sink faults (EIO, ENOSPC) on each output
// file and operation the backup uses, a source read error mid-stream (both
// injected by the Env the job runs on, tests/testing/env_wrappers.h), a
// real full filesystem (tmpfs) refused by the space estimate, and a second
// backup of a chain folder that is being written. Each failure must give a
// clear error, leave nothing that looks finished, and let a re-run succeed.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "blockio/fault.h"
#include "pipeline/backup.h"
#include "pipeline/restore.h"
#include "tests/testing/cli_testing.h"
#include "tests/testing/env_wrappers.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using ::barge::testing::Barge;
using ::barge::testing::CommandResult;
using ::barge::testing::FaultFilesEnv;
using ::barge::testing::RunOk;
using ::barge::testing::ShellQuote;
using ::barge::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

// Every entry of a folder except the chain lock file.
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (name != ".lock") out.push_back(name);
  }
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + " ";
  return s;
}

class BackupFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    disk_ = dir_ / "vm.raw";
    // Random (stored raw) and compressible halves: both write paths.
    std::vector<std::byte> bytes = testing::RandomBytes(8 * kMiB, 11);
    for (uint64_t i = 4 * kMiB; i < 8 * kMiB; ++i) bytes[i] = std::byte("compressible "[i % 13]);
    testing::WriteFile(disk_, bytes);
    target_ = dir_ / "backups";
    chain_ = target_ + "/vm";
  }

  BackupRequest Request() const {
    BackupRequest req;
    req.source.location = disk_;
    req.source.format = "raw";
    req.target_dir = target_;
    req.copy.threads = 2;
    req.copy.memory_bytes = 8 * kMiB;
    req.copy.chunk_bytes = 256 << 10;  // several chunks, so faults land mid-stream
    return req;
  }

  // A re-run without faults succeeds and verifies against the source.
  void ExpectRerunSucceeds() {
    auto again = RunBackup(PosixEnv(), Request());
    ASSERT_TRUE(again.ok()) << again.error().ToString();
    VerifyRequest v;
    v.path = chain_;
    v.against.location = disk_;
    v.against.format = "raw";
    auto verified = RunVerify(PosixEnv(), v);
    ASSERT_TRUE(verified.ok()) << verified.error().ToString();
    ASSERT_TRUE(verified->ok()) << verified->failure->ToString();
    EXPECT_TRUE(verified->against_checked);
    for (const auto& name : Leftovers(chain_)) {
      EXPECT_FALSE(name.ends_with(".barge-tmp")) << name;
    }
  }

  TempDir dir_;
  std::string disk_, target_, chain_;
};

// The output file a sink the backup opens is for: every output is written
// under its temporary name ".NAME.barge-tmp" (pipeline/staged_file.h).
std::string OutputName(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.starts_with(".") && name.ends_with(".barge-tmp")) name = name.substr(1, name.size() - 11);
  return name;
}

struct SinkFault {
  std::string file;  // ".qcow2", ".digests" or ".json": which output file
  FaultOp op;
  uint64_t nth;      // fail this call of `op` on that file and every later one
  int err;
};

std::string SinkFaultName(const ::testing::TestParamInfo<SinkFault>& info) {
  std::string file = info.param.file.substr(1);
  return file + "_" + std::string(FaultOpName(info.param.op)) + std::to_string(info.param.nth) + "_" +
         (info.param.err == ENOSPC ? "ENOSPC" : "EIO");
}

class BackupSinkFaultTest : public BackupFaultsTest,
                            public ::testing::WithParamInterface<SinkFault> {};

TEST_P(BackupSinkFaultTest, FailsCleanlyAndRerunSucceeds) {
  const SinkFault& f = GetParam();
  bool wrapped = false;
  FaultFilesEnv env(PosixEnv(), [&](const std::string& path, FaultInjector& faults) {
    if (OutputName(path).ends_with(f.file)) {
      wrapped = true;
      faults.AddRule(FaultRule::NthAndAfter(f.op, f.nth, f.err));
    }
  });
  auto r = RunBackup(env, Request());
  ASSERT_TRUE(wrapped);
  ASSERT_FALSE(r.ok()) << "the fault never fired";
  const Error& e = r.error();
  EXPECT_EQ(e.code(), f.err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIoError) << e.ToString();
  EXPECT_EQ(e.errno_value(), f.err) << e.ToString();
  EXPECT_NE(e.ToString().find(f.file), std::string::npos) << "names the file: " << e.ToString();
  EXPECT_NE(e.message().find("backup: "), std::string::npos) << e.ToString();
  EXPECT_TRUE(Leftovers(chain_).empty()) << Join(Leftovers(chain_));
  ExpectRerunSucceeds();
}

INSTANTIATE_TEST_SUITE_P(
    EveryFileAndOp, BackupSinkFaultTest,
    ::testing::Values(SinkFault{".qcow2", FaultOp::kWrite, 1, EIO},  // the first write
                      SinkFault{".qcow2", FaultOp::kWrite, 2, EIO},  // mid-stream (appends go out 4 MiB at a time)
                      SinkFault{".qcow2", FaultOp::kWrite, 2, ENOSPC},
                      SinkFault{".qcow2", FaultOp::kFlush, 1, EIO},
                      SinkFault{".qcow2", FaultOp::kFlush, 1, ENOSPC},
                      SinkFault{".digests", FaultOp::kWrite, 1, ENOSPC},
                      SinkFault{".digests", FaultOp::kFlush, 1, EIO},
                      SinkFault{".json", FaultOp::kWrite, 1, EIO},
                      SinkFault{".json", FaultOp::kWrite, 1, ENOSPC},
                      SinkFault{".json", FaultOp::kFlush, 1, EIO}),
    SinkFaultName);

// The backup's sinks see only writes and flushes: sparse qcow2 needs no
// zero requests (unallocated clusters read as zero) and the file grows by
// writes. If that changes, the new operation belongs in the table above.
// Forwards to a FaultSink it owns and adds its call counts to `totals`
// when destroyed (RunBackup closes its sinks before returning).
class CountingSink final : public BlockSink {
 public:
  CountingSink(std::unique_ptr<FaultSink> inner, std::array<uint64_t, kFaultOpCount>& totals)
      : inner_(std::move(inner)), totals_(totals) {}
  ~CountingSink() override {
    for (size_t i = 0; i < kFaultOpCount; ++i) totals_[i] += inner_->faults().calls(FaultOp(i));
  }
  const std::string& name() const override { return inner_->name(); }
  uint64_t size_bytes() const override { return inner_->size_bytes(); }
  SinkCapabilities capabilities() const override { return inner_->capabilities(); }
  Status WriteAt(uint64_t o, std::span<const std::byte> d) override { return inner_->WriteAt(o, d); }
  Status WriteZeroes(uint64_t o, uint64_t n) override { return inner_->WriteZeroes(o, n); }
  Status Trim(uint64_t o, uint64_t n) override { return inner_->Trim(o, n); }
  Status Flush() override { return inner_->Flush(); }
  Status Truncate(uint64_t s) override { return inner_->Truncate(s); }

 private:
  std::unique_ptr<FaultSink> inner_;
  std::array<uint64_t, kFaultOpCount>& totals_;
};

// Wraps every sink opened for a backup output (a temporary) in a
// CountingSink whose FaultSink fails zeroing, trimming and truncation.
class CountingEnv final : public EnvWrapper {
 public:
  CountingEnv(Env& target, std::array<uint64_t, kFaultOpCount>& totals, int& files)
      : EnvWrapper(target), totals_(totals), files_(files) {}
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& o) override {
    BARGE_ASSIGN_OR_RETURN(auto sink, target().OpenSink(path, mode, o));
    if (OutputName(path) == path.substr(path.find_last_of('/') + 1)) return sink;  // not an output
    auto fault = std::make_unique<FaultSink>(std::move(sink));
    for (FaultOp op : {FaultOp::kZero, FaultOp::kTrim, FaultOp::kTruncate}) {
      fault->faults().AddRule(FaultRule::Always(op, EIO));
    }
    ++files_;
    return std::unique_ptr<BlockSink>(std::make_unique<CountingSink>(std::move(fault), totals_));
  }

 private:
  std::array<uint64_t, kFaultOpCount>& totals_;
  int& files_;
};

// The backup's sinks see only writes and flushes: sparse qcow2 needs no
// zero requests (unallocated clusters read as zero) and the file grows by
// writes. If that changes, the new operation belongs in the table above.
TEST_F(BackupFaultsTest, BackupUsesOnlyWriteAndFlush) {
  for (bool incremental : {false, true}) {
    SCOPED_TRACE(incremental);
    std::array<uint64_t, kFaultOpCount> totals{};
    int files = 0;
    BackupRequest req = Request();
    if (incremental) {
      req.incremental = true;
      req.dirty_ranges = RangeList{{0, 2 * kMiB}};
    }
    CountingEnv env(PosixEnv(), totals, files);
    auto r = RunBackup(env, req);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_EQ(files, 3);  // image, digest table, manifest
    EXPECT_GT(totals[size_t(FaultOp::kWrite)], 3u);
    EXPECT_GE(totals[size_t(FaultOp::kFlush)], 3u);
    EXPECT_EQ(totals[size_t(FaultOp::kZero)], 0u);
    EXPECT_EQ(totals[size_t(FaultOp::kTrim)], 0u);
    EXPECT_EQ(totals[size_t(FaultOp::kTruncate)], 0u);
  }
}

TEST_F(BackupFaultsTest, SourceReadErrorMidStream) {
  // A read well inside the disk, and the 3rd read call, whichever it is.
  for (FaultRule rule : {FaultRule::InRange(FaultOp::kRead, 5 * kMiB + 4096, 1, EIO),
                         FaultRule::Nth(FaultOp::kRead, 3, EIO)}) {
    SCOPED_TRACE(rule.nth_call);
    bool wrapped = false;
    FaultFilesEnv env(PosixEnv(), {}, [&](const std::string& path, FaultInjector& faults) {
      if (path != disk_) return;
      faults.AddRule(rule);
      wrapped = true;
    });
    auto r = RunBackup(env, Request());
    ASSERT_TRUE(wrapped);
    ASSERT_FALSE(r.ok());
    const Error& e = r.error();
    EXPECT_EQ(e.code(), ErrorCode::kIoError) << e.ToString();
    EXPECT_EQ(e.errno_value(), EIO) << e.ToString();
    EXPECT_NE(e.ToString().find("read"), std::string::npos) << e.ToString();
    EXPECT_NE(e.ToString().find("vm.raw"), std::string::npos) << e.ToString();
    EXPECT_NE(e.message().find("backup: "), std::string::npos) << e.ToString();
    EXPECT_TRUE(Leftovers(chain_).empty()) << Join(Leftovers(chain_));
  }
  ExpectRerunSucceeds();
}

// KeepStaged::kWhenDisconnected (a vm backup's setting): a failed source
// read keeps the staged image and journal only when the error is the kind
// a lost connection gives (an I/O error marked retryable: ETIMEDOUT here),
// not when the source answered with an error (EIO); without the setting,
// both keep them, as `barge backup` does.
TEST_F(BackupFaultsTest, KeepOnlyWhenDisconnectedKeepsOnlyAfterALostSource) {
  struct Case {
    int err;
    bool only_when_disconnected;
    bool kept;
  };
  for (Case c : {Case{EIO, true, false}, Case{ETIMEDOUT, true, true}, Case{EIO, false, true}}) {
    SCOPED_TRACE(std::to_string(c.err) + (c.only_when_disconnected ? " only when disconnected" : ""));
    fs::remove_all(target_);
    FaultFilesEnv env(PosixEnv(), {}, [&](const std::string& path, FaultInjector& faults) {
      if (path == disk_) faults.AddRule(FaultRule::InRange(FaultOp::kRead, 6 * kMiB, 1, c.err));
    });
    BackupRequest req = Request();
    req.resume = true;
    req.keep_staged = c.only_when_disconnected ? BackupRequest::KeepStaged::kWhenDisconnected
                                               : BackupRequest::KeepStaged::kAfterSourceFailure;
    auto r = RunBackup(env, req);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::kIoError) << r.error().ToString();
    const bool journal = fs::exists(chain_ + "/.backup.barge-resume");
    EXPECT_EQ(journal, c.kept) << r.error().ToString() << "; left: " << Join(Leftovers(chain_));
    EXPECT_EQ(r.error().ToString().find("the next run of this backup resumes") != std::string::npos, c.kept)
        << r.error().ToString();
    if (!c.kept) EXPECT_TRUE(Leftovers(chain_).empty()) << Join(Leftovers(chain_));
  }
  fs::remove_all(target_);
  ExpectRerunSucceeds();
}

// A faulted incremental leaves the chain as it was: the full still restores
// and a re-run of the incremental succeeds.
TEST_F(BackupFaultsTest, FailedIncrementalLeavesChainIntact) {
  auto full = RunBackup(PosixEnv(), Request());
  ASSERT_TRUE(full.ok()) << full.error().ToString();
  BackupRequest inc = Request();
  inc.incremental = true;
  inc.dirty_ranges = RangeList{{0, 1 * kMiB}, {6 * kMiB, 64 << 10}};
  FaultFilesEnv env(PosixEnv(), [&](const std::string& path, FaultInjector& faults) {
    if (OutputName(path).ends_with(".json")) faults.AddRule(FaultRule::Always(FaultOp::kFlush, ENOSPC));
  });
  auto failed = RunBackup(env, inc);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.error().code(), ErrorCode::kNoSpace) << failed.error().ToString();
  std::vector<std::string> left = Leftovers(chain_);
  EXPECT_EQ(left.size(), 3u) << Join(left);  // the full's three files only
  for (const auto& name : left) EXPECT_EQ(name.rfind("0000-", 0), 0u) << name;
  auto ok = RunBackup(PosixEnv(), inc);
  ASSERT_TRUE(ok.ok()) << ok.error().ToString();
  EXPECT_EQ(ok->manifest.id.rfind("0001-", 0), 0u) << ok->manifest.id;
  VerifyRequest v;
  v.path = chain_;
  v.all_points = true;
  auto verified = RunVerify(PosixEnv(), v);
  ASSERT_TRUE(verified.ok()) << verified.error().ToString();
  ASSERT_TRUE(verified->ok()) << verified->failure->ToString();
  EXPECT_EQ(verified->Count(VerifyOutcome::State::kPassed), 2u);
}

// A real full filesystem: a 4 MiB tmpfs cannot hold a 16 MiB random disk.
// The space estimate refuses before anything is written.
class BackupTmpfsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (mounted_) ::umount2(mount_.c_str(), MNT_DETACH);
  }
  TempDir dir_;
  std::string mount_;
  bool mounted_ = false;
};

TEST_F(BackupTmpfsTest, SpaceEstimateRefusesBeforeWriting) {
  mount_ = dir_ / "small";
  fs::create_directories(mount_);
  if (::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=4M") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  mounted_ = true;
  std::string disk = dir_ / "big.raw";
  testing::WriteFile(disk, testing::RandomBytes(16 * kMiB, 12));
  CommandResult r = testing::Run(Barge("backup --source " + ShellQuote(disk) + " --target " + ShellQuote(mount_) +
                              " --name big"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("NoSpace"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("needs up to"), std::string::npos) << r.output;
  // Nothing was written: no files, and the filesystem is as empty as before.
  EXPECT_TRUE(Leftovers(mount_ + "/big").empty()) << Join(Leftovers(mount_ + "/big"));
  struct statvfs st;
  ASSERT_EQ(::statvfs(mount_.c_str(), &st), 0);
  EXPECT_LE((st.f_blocks - st.f_bfree) * st.f_frsize, 64u << 10);

  // A disk that fits goes through on the same filesystem.
  std::string small = dir_ / "small.raw";
  testing::WriteFile(small, testing::RandomBytes(256 << 10, 13));
  RunOk(Barge("backup --source " + ShellQuote(small) + " --target " + ShellQuote(mount_) + " --name small"));
  RunOk(Barge("verify " + ShellQuote(mount_ + "/small") + " --against " + ShellQuote(small)));
}

// The same refusal through the library, with the code and the message.
TEST_F(BackupTmpfsTest, SpaceEstimateErrorIsNoSpace) {
  mount_ = dir_ / "small";
  fs::create_directories(mount_);
  if (::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=1M") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  mounted_ = true;
  std::string disk = dir_ / "big.raw";
  testing::WriteFile(disk, testing::RandomBytes(4 * kMiB, 14));
  BackupRequest req;
  req.source.location = disk;
  req.target_dir = mount_;
  auto r = RunBackup(PosixEnv(), req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNoSpace) << r.error().ToString();
  EXPECT_EQ(r.error().path(), mount_ + "/big");
}

TEST_F(BackupFaultsTest, SecondBackupOfLockedChainFailsAtOnce) {
  fs::create_directories(chain_);
  int fd = ::open((chain_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  auto start = std::chrono::steady_clock::now();
  CommandResult r = testing::Run(Barge("backup --source " + ShellQuote(disk_) + " --target " + ShellQuote(target_)));
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("another barge job is writing this chain folder"), std::string::npos) << r.output;
  EXPECT_LT(seconds, 5.0) << "must not wait for the lock";
  EXPECT_TRUE(Leftovers(chain_).empty()) << Join(Leftovers(chain_));
  ::close(fd);
  RunOk(Barge("backup --source " + ShellQuote(disk_) + " --target " + ShellQuote(target_)));
}

// Two real jobs: a slowed backup holds the folder while the CLI tries.
TEST_F(BackupFaultsTest, ConcurrentBackupOfSameChainFails) {
  std::atomic<bool> reading{false};
  FaultFilesEnv slow(PosixEnv(), {}, [&](const std::string& path, FaultInjector& faults) {
    if (path != disk_) return;
    faults.SetDelay(FaultOp::kRead, std::chrono::milliseconds(60));
    reading = true;
  });
  Result<BackupResult> first = Error::Cancelled("not run");
  std::thread worker([&] { first = RunBackup(slow, Request()); });
  // The source is opened before the chain lock is taken: wait for the lock.
  auto chain_locked = [&] {
    LockOptions probe;
    probe.create = false;
    auto lock = PosixEnv().LockFile(chain_ + "/.lock", probe);
    return !lock.ok() && lock.error().code() == ErrorCode::kBusy;
  };
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((!reading || !chain_locked()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CommandResult r = testing::Run(Barge("backup --source " + ShellQuote(disk_) + " --target " + ShellQuote(target_)));
  worker.join();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("another barge job"), std::string::npos) << r.output;
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  EXPECT_EQ(first->manifest.id.rfind("0000-", 0), 0u);
  // Exactly one backup landed.
  EXPECT_EQ(Leftovers(chain_).size(), 3u) << Join(Leftovers(chain_));
}

}  // namespace
}  // namespace barge::pipeline
