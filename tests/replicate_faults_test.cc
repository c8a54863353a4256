// RunReplicate with one bad destination: a failing sink (fault injection
// by the Env the job runs on), a stalled one, and a full filesystem (a small
// tmpfs, when this test may mount one). The bad one is reported failed and
// leaves nothing behind; the others are ready and identical to the source.
#include <gtest/gtest.h>

#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "blockio/env.h"
#include "blockio/fault.h"
#include "blockio/fault_env.h"
#include "pipeline/endpoints.h"
#include "pipeline/replicate.h"
#include "tests/testing/env_wrappers.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::RunOk;
using testing::ShellQuote;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

using SinkWrap = std::function<std::unique_ptr<BlockSink>(std::unique_ptr<BlockSink>)>;

// Runs a job with the sink of one destination wrapped: the sink opened
// under its temporary name (pipeline/staged_file.h), which is where the
// copy is written. Everything else passes through.
class WrapDestinationEnv final : public EnvWrapper {
 public:
  WrapDestinationEnv(std::string destination, SinkWrap wrap)
      : EnvWrapper(PosixEnv()), temp_(TempPathFor(destination)), wrap_(std::move(wrap)) {}
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& o) override {
    BARGE_ASSIGN_OR_RETURN(auto sink, target().OpenSink(path, mode, o));
    if (path != temp_) return sink;
    return wrap_(std::move(sink));
  }

 private:
  std::string temp_;
  SinkWrap wrap_;
};

std::string MakeSource(const TempDir& dir, uint64_t size) {
  std::string path = dir / "src.raw";
  testing::WriteFile(path, testing::RandomBytes(size, 42));
  return path;
}

ReplicateOptions SmallOptions() {
  ReplicateOptions o;
  o.copy.memory_bytes = 16 * kMiB;
  o.copy.threads = 2;
  o.copy.compression = formats::Compression::kNone;
  o.format = ReplicaFormat::kRaw;
  o.verify = true;
  return o;
}

void ExpectReadyAndEqual(const ReplicaResult& r, const std::string& src) {
  EXPECT_EQ(r.state, ReplicaState::kReady) << (r.error ? r.error->ToString() : "");
  EXPECT_TRUE(fs::exists(r.path + ".sha512.json"));
  RunOk("cmp " + ShellQuote(src) + " " + ShellQuote(r.path));
}

void ExpectFailedAndGone(const ReplicaResult& r) {
  EXPECT_EQ(r.state, ReplicaState::kFailed);
  EXPECT_TRUE(r.error.has_value());
  EXPECT_FALSE(fs::exists(r.path));
  EXPECT_FALSE(fs::exists(r.path + ".sha512.json"));
  EXPECT_FALSE(fs::exists(TempPathFor(r.path)));
}

// Replicates an 8 MiB random source to a.raw, b.raw and c.raw, raw then
// qcow2, with destination `bad` wrapped by `wrap`; `check` judges each run
// (the bad copy and the two good ones) with the source's path.
void ReplicateWithOneBadDestination(
    size_t bad, const SinkWrap& wrap,
    const std::function<void(ReplicaFormat, const ReplicateResult&, const std::vector<std::string>&,
                             const std::string&)>& check) {
  TempDir dir;
  std::string src = MakeSource(dir, 8 * kMiB);
  SourceSpec spec;
  spec.location = src;
  auto opened = OpenSource(PosixEnv(), spec);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::vector<std::string> dests = {dir / "a.raw", dir / "b.raw", dir / "c.raw"};
  for (auto fmt : {ReplicaFormat::kRaw, ReplicaFormat::kQcow2}) {
    for (const auto& d : dests) fs::remove(d), fs::remove(d + ".sha512.json");
    ReplicateOptions o = SmallOptions();
    o.format = fmt;
    WrapDestinationEnv env(dests[bad], wrap);
    auto r = RunReplicate(env, *opened->image, dests, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    check(fmt, *r, dests, src);
  }
}

TEST(ReplicateFaultsTest, FailingSinkFailsOnlyItsDestination) {
  auto failing = [](std::unique_ptr<BlockSink> sink) -> std::unique_ptr<BlockSink> {
    auto f = std::make_unique<FaultSink>(std::move(sink));
    f->faults().AddRule(FaultRule::NthAndAfter(FaultOp::kWrite, 3));
    return f;
  };
  ReplicateWithOneBadDestination(1, failing, [](ReplicaFormat fmt, const ReplicateResult& r,
                                                const std::vector<std::string>& dests, const std::string& src) {
    EXPECT_FALSE(r.all_ok());
    ExpectFailedAndGone(r.replicas[1]);
    EXPECT_EQ(r.replicas[1].error->code(), ErrorCode::kIoError);
    for (size_t i : {0u, 2u}) {
      if (fmt == ReplicaFormat::kRaw) {
        ExpectReadyAndEqual(r.replicas[i], src);
      } else {
        EXPECT_EQ(r.replicas[i].state, ReplicaState::kReady);
        if (testing::HaveTool("qemu-img")) {
          RunOk("qemu-img check -q " + ShellQuote(dests[i]));
          RunOk("qemu-img compare -q -F raw " + ShellQuote(dests[i]) + " " + ShellQuote(src));
        }
      }
    }
  });
}

// Forwards everything but flips one bit of the first write at or past 64 KiB
// (data in a raw copy; the first data cluster in a qcow2 one, whose header
// cluster comes first): the copy looks written and flushed fine, only
// --verify's re-read can catch it.
class BitFlipSink : public BlockSink {
 public:
  explicit BitFlipSink(std::unique_ptr<BlockSink> inner) : owned_(std::move(inner)), inner_(*owned_) {}
  const std::string& name() const override { return inner_.name(); }
  uint64_t size_bytes() const override { return inner_.size_bytes(); }
  SinkCapabilities capabilities() const override { return inner_.capabilities(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    if (flipped_ || data.empty() || offset < kFirstDataOffset) return inner_.WriteAt(offset, data);
    flipped_ = true;
    std::vector<std::byte> copy(data.begin(), data.end());
    copy[copy.size() / 2] ^= std::byte{0x10};
    return inner_.WriteAt(offset, copy);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length) override { return inner_.WriteZeroes(offset, length); }
  Status Trim(uint64_t offset, uint64_t length) override { return inner_.Trim(offset, length); }
  Status Flush() override { return inner_.Flush(); }
  Status Truncate(uint64_t size_bytes) override { return inner_.Truncate(size_bytes); }

 private:
  static constexpr uint64_t kFirstDataOffset = 64 << 10;
  std::unique_ptr<BlockSink> owned_;
  BlockSink& inner_;
  bool flipped_ = false;
};

TEST(ReplicateFaultsTest, VerifyCatchesACopyCorruptedOnTheWay) {
  auto flipping = [](std::unique_ptr<BlockSink> sink) -> std::unique_ptr<BlockSink> {
    return std::make_unique<BitFlipSink>(std::move(sink));
  };
  ReplicateWithOneBadDestination(2, flipping, [](ReplicaFormat fmt, const ReplicateResult& r,
                                                 const std::vector<std::string>&, const std::string& src) {
    ExpectFailedAndGone(r.replicas[2]);
    ASSERT_TRUE(r.replicas[2].error.has_value());
    EXPECT_EQ(r.replicas[2].error->code(), ErrorCode::kCorruption) << r.replicas[2].error->ToString();
    EXPECT_NE(r.replicas[2].error->ToString().find("verify"), std::string::npos);
    EXPECT_EQ(r.replicas[0].state, ReplicaState::kReady);
    EXPECT_EQ(r.replicas[1].state, ReplicaState::kReady);
    if (fmt == ReplicaFormat::kRaw) ExpectReadyAndEqual(r.replicas[0], src);
  });
}

TEST(ReplicateFaultsTest, StalledDestinationFailsWithoutHoldingOthers) {
  TempDir dir;
  std::string src = MakeSource(dir, 4 * kMiB);
  SourceSpec spec;
  spec.location = src;
  auto opened = OpenSource(PosixEnv(), spec);
  ASSERT_TRUE(opened.ok());
  std::vector<std::string> dests = {dir / "a.raw", dir / "slow.raw", dir / "c.raw"};
  ReplicateOptions o = SmallOptions();
  o.copy.stall_timeout = std::chrono::milliseconds(300);
  WrapDestinationEnv env(dests[1], [](std::unique_ptr<BlockSink> sink) -> std::unique_ptr<BlockSink> {
    auto f = std::make_unique<FaultSink>(std::move(sink));
    f->faults().SetDelay(FaultOp::kWrite, std::chrono::milliseconds(900));
    return f;
  });
  std::vector<uint64_t> last(3, 0);
  o.progress = [&](size_t i, uint64_t done, uint64_t) { last[i] = done; };
  auto r = RunReplicate(env, *opened->image, dests, o);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ExpectFailedAndGone(r->replicas[1]);
  EXPECT_NE(r->replicas[1].error->ToString().find("stall"), std::string::npos)
      << r->replicas[1].error->ToString();
  ExpectReadyAndEqual(r->replicas[0], src);
  ExpectReadyAndEqual(r->replicas[2], src);
  EXPECT_EQ(last[0], 4 * kMiB);
  EXPECT_EQ(last[2], 4 * kMiB);
}

TEST(ReplicateFaultsTest, FullFilesystemFailsOnlyItsDestination) {
  TempDir dir;
  fs::path small = dir.path() / "small";
  fs::create_directories(small);
  if (::geteuid() != 0 || ::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=2m") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs here";
  }
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{small.string()};
  std::string src = MakeSource(dir, 8 * kMiB);
  SourceSpec spec;
  spec.location = src;
  auto opened = OpenSource(PosixEnv(), spec);
  ASSERT_TRUE(opened.ok());
  std::vector<std::string> dests = {dir / "a.raw", (small / "full.raw").string(), dir / "c.raw"};
  auto r = RunReplicate(PosixEnv(), *opened->image, dests, SmallOptions());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  ExpectFailedAndGone(r->replicas[1]);
  EXPECT_EQ(r->replicas[1].error->code(), ErrorCode::kNoSpace) << r->replicas[1].error->ToString();
  ExpectReadyAndEqual(r->replicas[0], src);
  ExpectReadyAndEqual(r->replicas[2], src);
}

// Issue 13 (found by the reliability campaign): a power loss between a
// copy's rename and its checksum record left a copy without a record, which
// the same command run again refused to replace ("exists and is not a
// matching copy", --force needed). The record now goes first: at every
// crash point, the plain re-run completes and both copies are ready.
TEST(ReplicateFaultsTest, Issue13RerunAfterPowerLossAtAnyBoundaryNeedsNoForce) {
  TempDir dir;
  std::string src = MakeSource(dir, 2 * kMiB);
  std::vector<std::string> dests = {dir / "a/base.raw", dir / "b/base.raw"};
  FaultEnv env(PosixEnv(), dir / "stash");
  auto replicate = [&](Env& e) -> Result<ReplicateResult> {
    SourceSpec spec;
    spec.location = src;
    auto opened = OpenSource(e, spec);
    if (!opened.ok()) return opened.error();
    return RunReplicate(e, *opened->image, dests, SmallOptions());
  };
  auto setup = [&]() -> Status {
    fs::remove_all(dir / "a");
    fs::remove_all(dir / "b");
    fs::create_directories(dir / "a");
    fs::create_directories(dir / "b");
    return OkStatus();
  };
  auto op = [&](Env& e) -> Status {
    auto r = replicate(e);
    if (!r.ok()) return r.error();
    return r->all_ok() ? OkStatus() : Status(Error::IoError("a copy failed"));
  };
  uint64_t points = 0;
  auto check = [&](const CrashPoint& p) {
    SCOPED_TRACE("crash after " + std::to_string(p.after_boundaries) + " of " + std::to_string(p.boundaries));
    ++points;
    for (const auto& d : dests) {
      // Never a record that describes a file it does not match.
      auto record = ReadReplicaRecord(PosixEnv(), d);
      if (record.ok() && fs::exists(d)) {
        EXPECT_TRUE(FileMatchesRecord(PosixEnv(), d, *record)) << d;
      }
    }
    auto again = replicate(PosixEnv());
    ASSERT_TRUE(again.ok()) << again.error().ToString();
    ASSERT_TRUE(again->all_ok());
    for (const auto& r : again->replicas) {
      // Written again, or reused (a copy that made it, with its record).
      EXPECT_NE(r.state, ReplicaState::kFailed) << r.error->ToString();
      EXPECT_TRUE(fs::exists(r.path + ".sha512.json"));
      RunOk("cmp " + ShellQuote(src) + " " + ShellQuote(r.path));
    }
  };
  auto runs = ForEachCrashPoint(env, setup, op, check);
  ASSERT_TRUE(runs.ok()) << runs.error().ToString();
  EXPECT_GT(points, 10u);
}

// Reading the copy back for --verify (under its temporary name) fails: the
// error names the destination, never the hidden temporary (issue 13; found
// by the reliability campaign at its default size, which fails opens too:
// replicate and image add named .NAME.barge-tmp).
TEST(ReplicateFaultsTest, Issue13VerifyOpenErrorNamesTheCopyNotItsTemporary) {
  TempDir dir;
  std::string src = MakeSource(dir, 2 * kMiB);
  SourceSpec spec;
  spec.location = src;
  auto opened = OpenSource(PosixEnv(), spec);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::vector<std::string> dests = {dir / "a.raw", dir / "b.raw"};
  for (auto fmt : {ReplicaFormat::kRaw, ReplicaFormat::kQcow2}) {
    for (const auto& d : dests) fs::remove(d), fs::remove(d + ".sha512.json");
    ReplicateOptions o = SmallOptions();
    o.format = fmt;
    testing::FailOpenEnv env(PosixEnv(), TempPathFor(dests[1]));
    auto r = RunReplicate(env, *opened->image, dests, o);
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    ExpectFailedAndGone(r->replicas[1]);
    ASSERT_TRUE(r->replicas[1].error.has_value());
    EXPECT_EQ(r->replicas[1].error->path(), dests[1]) << r->replicas[1].error->ToString();
    EXPECT_EQ(r->replicas[1].error->ToString().find("barge-tmp"), std::string::npos)
        << r->replicas[1].error->ToString();
    EXPECT_EQ(r->replicas[0].state, ReplicaState::kReady);
  }
}

}  // namespace
}  // namespace barge::pipeline
