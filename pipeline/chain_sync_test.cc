// SyncChain on real folders: a copy that DST's check finds damaged is
// removed again (manifest first), and diverged chains are refused. The CLI
// cases (copy, resume, locks, another disk) are tests/sync_test.cc.
#include "pipeline/chain_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/backup.h"
#include "pipeline/chain.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A backup of `raw` into `target`/d.
void BackUp(const std::string& raw, const std::string& target) {
  BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = target;
  req.disk_name = "d";
  req.copy.memory_bytes = 8 << 20;
  req.copy.threads = 2;
  auto r = RunBackup(PosixEnv(), req);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
}

// Forwards to a sink, flipping one bit of the byte written at `at`.
class FlippingSink final : public BlockSink {
 public:
  FlippingSink(std::unique_ptr<BlockSink> inner, uint64_t at) : inner_(std::move(inner)), at_(at) {}
  const std::string& name() const override { return inner_->name(); }
  uint64_t size_bytes() const override { return inner_->size_bytes(); }
  SinkCapabilities capabilities() const override { return inner_->capabilities(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    if (at_ < offset || at_ >= offset + data.size()) return inner_->WriteAt(offset, data);
    std::vector<std::byte> copy(data.begin(), data.end());
    copy[at_ - offset] ^= std::byte{0x20};
    return inner_->WriteAt(offset, copy);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length) override { return inner_->WriteZeroes(offset, length); }
  Status Flush() override { return inner_->Flush(); }
  Status Truncate(uint64_t size) override { return inner_->Truncate(size); }

 private:
  std::unique_ptr<BlockSink> inner_;
  uint64_t at_;
};

// Damages every staged image written under `dir` (a bad disk or store).
class DamagingEnv final : public EnvWrapper {
 public:
  DamagingEnv(Env& target, std::string dir, uint64_t at) : EnvWrapper(target), dir_(std::move(dir)), at_(at) {}
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override {
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, EnvWrapper::OpenSink(path, mode, options));
    if (path.rfind(dir_ + "/", 0) != 0 || path.find(".qcow2.barge-tmp") == std::string::npos) return sink;
    return std::unique_ptr<BlockSink>(std::make_unique<FlippingSink>(std::move(sink), at_));
  }

 private:
  std::string dir_;
  uint64_t at_;
};

// Counts the bytes read from sources opened under `dir`.
class CountingEnv final : public EnvWrapper {
 public:
  CountingEnv(Env& target, std::string dir) : EnvWrapper(target), dir_(std::move(dir)) {}
  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& options) override {
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> source, EnvWrapper::OpenSource(path, options));
    if (path.rfind(dir_ + "/", 0) != 0) return source;
    return std::unique_ptr<BlockSource>(std::make_unique<Counted>(std::move(source), read_));
  }
  uint64_t read() const { return read_.load(); }

 private:
  class Counted final : public BlockSource {
   public:
    Counted(std::unique_ptr<BlockSource> inner, std::atomic<uint64_t>& read) : inner_(std::move(inner)), read_(read) {}
    const std::string& name() const override { return inner_->name(); }
    uint64_t size_bytes() const override { return inner_->size_bytes(); }
    SourceCapabilities capabilities() const override { return inner_->capabilities(); }
    Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
      read_ += out.size();
      return inner_->ReadAt(offset, out);
    }

   private:
    std::unique_ptr<BlockSource> inner_;
    std::atomic<uint64_t>& read_;
  };
  std::string dir_;
  std::atomic<uint64_t> read_{0};
};

// DST's check of an incremental's copy reads that point's own image, not
// the disk through every layer again.
TEST(ChainSyncTest, CheckOfACopyReadsItsOwnLayerOnly) {
  TempDir tmp;
  const std::string raw = tmp / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes(8 << 20, 13));
  BackUp(raw, tmp / "a");
  ASSERT_TRUE(SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d").ok());
  // 64 KiB changed, backed up as an incremental of those clusters.
  {
    std::vector<std::byte> data = testing::ReadFile(raw);
    std::fill(data.begin() + (1 << 20), data.begin() + (1 << 20) + 65536, std::byte{0x5a});
    testing::WriteFile(raw, data);
  }
  BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = tmp / "a";
  req.disk_name = "d";
  req.incremental = true;
  req.dirty_ranges = RangeList{{1 << 20, 65536}};
  req.dirty_description = "test";
  req.copy.memory_bytes = 8 << 20;
  req.copy.threads = 2;
  auto b = RunBackup(PosixEnv(), req);
  ASSERT_TRUE(b.ok()) << b.error().ToString();
  CountingEnv env(PosixEnv(), tmp / "b/d");
  auto r = SyncChain(env, tmp / "a/d", tmp / "b/d");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->copied, 1u);
  // The new point's image is about 64 KiB and metadata; the disk is 8 MiB.
  EXPECT_LT(env.read(), uint64_t{2} << 20) << env.read() << " bytes read from DST";
}

TEST(ChainSyncTest, CopiesAndSkips) {
  TempDir tmp;
  const std::string raw = tmp / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 7));
  BackUp(raw, tmp / "a");
  std::vector<std::string> seen;
  SyncOptions options;
  options.on_point = [&](const SyncChainResult&, const SyncedPoint& p) {
    seen.push_back(std::string(p.copied ? "copied " : "skipped ") + p.id);
  };
  auto r = SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d", options);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->copied, 1u);
  EXPECT_TRUE(r->points.at(0).verified);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].rfind("copied ", 0), 0u) << seen[0];
  r = SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d", options);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->copied, 0u);
  EXPECT_EQ(r->skipped, 1u);
  EXPECT_EQ(r->bytes_copied, 0u);
}

TEST(ChainSyncTest, DamagedCopyIsRemovedManifestFirst) {
  TempDir tmp;
  const std::string raw = tmp / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 8));
  BackUp(raw, tmp / "a");
  // Point 0 copied whole; point 1's image damaged on its way to DST.
  ASSERT_TRUE(SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d").ok());
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 9));
  BackUp(raw, tmp / "a");
  const auto src = LoadChainFolder(PosixEnv(), tmp / "a/d");
  ASSERT_TRUE(src.ok());
  const uint64_t image_size = fs::file_size(src->PathOf(src->latest().manifest.image));
  const std::vector<std::string> before = Names(tmp / "b/d");
  DamagingEnv env(PosixEnv(), tmp / "b/d", image_size / 2);
  auto r = SyncChain(env, tmp / "a/d", tmp / "b/d");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << r.error().ToString();
  EXPECT_NE(r.error().ToString().find("does not verify; removed"), std::string::npos) << r.error().ToString();
  EXPECT_EQ(Names(tmp / "b/d"), before);
  // Undamaged, the next sync copies it.
  auto again = SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d");
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  EXPECT_EQ(again->copied, 1u);
}

TEST(ChainSyncTest, DivergedChainsAreRefused) {
  TempDir tmp;
  const std::string raw = tmp / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 10));
  BackUp(raw, tmp / "a");
  ASSERT_TRUE(SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d").ok());
  // Each folder gets its own point 1, of other contents.
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 11));
  BackUp(raw, tmp / "a");
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 12));
  BackUp(raw, tmp / "b");
  const std::vector<std::string> before = Names(tmp / "b/d");
  auto r = SyncChain(PosixEnv(), tmp / "a/d", tmp / "b/d");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << r.error().ToString();
  EXPECT_NE(r.error().ToString().find("diverged"), std::string::npos) << r.error().ToString();
  EXPECT_EQ(Names(tmp / "b/d"), before);
}

}  // namespace
}  // namespace barge::pipeline
