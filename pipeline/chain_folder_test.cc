// ChainWriter: the chain-folder protocol backup and merge share (lock, load,
// sweep, stage, commit in order), on real folders.
#include "pipeline/chain_folder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "pipeline/backup.h"
#include "pipeline/merge_journal.h"
#include "tests/testing/testing.h"

namespace barge::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

void Put(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string Get(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

ChainWriterOptions ForBackup(const std::string& parent) {
  ChainWriterOptions o;
  o.job = "backup";
  o.create = true;
  o.parent_dir = parent;
  o.remove_leftovers = true;
  return o;
}

// One real point in `target`/d (a full backup of a small raw disk).
void BackUpOnce(const TempDir& tmp) {
  std::string raw = tmp / "disk.raw";
  testing::WriteFile(raw, testing::RandomBytes(1 << 20, 3));
  BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = tmp / "target";
  req.disk_name = "d";
  req.copy.memory_bytes = 8 << 20;
  req.copy.threads = 2;
  auto r = RunBackup(PosixEnv(), req);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
}

// Fails publishing (linking) one file by name, as a full disk would.
class FailLinkEnv final : public EnvWrapper {
 public:
  FailLinkEnv(Env& target, std::string name) : EnvWrapper(target), name_(std::move(name)) {}
  Status Link(const std::string& from, const std::string& to) override {
    if (fs::path(to).filename() == name_) return Error::NoSpace("no room for the link").set_path(to);
    return EnvWrapper::Link(from, to);
  }

 private:
  std::string name_;
};

TEST(ChainWriterTest, FirstPointIsPublishedInOrderAndTheFolderStays) {
  TempDir tmp;
  const std::string parent = tmp / "target", dir = parent + "/d";
  {
    auto w = ChainWriter::Open(PosixEnv(), dir, ForBackup(parent));
    ASSERT_TRUE(w.ok()) << w.error().ToString();
    EXPECT_TRUE((*w)->chain().empty());
    EXPECT_EQ((*w)->dir(), dir);
    auto sink = (*w)->StageImage("0000-x.qcow2");
    ASSERT_TRUE(sink.ok()) << sink.error().ToString();
    ASSERT_TRUE((*sink)->WriteAt(0, Bytes("image")).ok());
    ASSERT_TRUE((*w)->StageSmallFile("0000-x.digests", Bytes("digests")).ok());
    ASSERT_TRUE((*w)->StageSmallFile("0000-x.json", Bytes("{}")).ok());
    // Nothing is under a final name before the commit.
    EXPECT_FALSE(fs::exists(dir + "/0000-x.qcow2"));
    EXPECT_FALSE(fs::exists(dir + "/0000-x.json"));
    ASSERT_TRUE((*w)->Commit().ok());
  }
  EXPECT_EQ(Get(dir + "/0000-x.qcow2"), "image");
  EXPECT_EQ(Get(dir + "/0000-x.digests"), "digests");
  EXPECT_EQ(Get(dir + "/0000-x.json"), "{}");
  // The folder, its lock file and the files stay; no temporary is left.
  EXPECT_EQ(Names(dir), (std::vector<std::string>{".lock", "0000-x.digests", "0000-x.json", "0000-x.qcow2"}));
}

TEST(ChainWriterTest, FailedFirstPointLeavesNoFolderNoLockNoTemporary) {
  TempDir tmp;
  const std::string parent = tmp / "target", dir = parent + "/d";
  {
    auto w = ChainWriter::Open(PosixEnv(), dir, ForBackup(parent));
    ASSERT_TRUE(w.ok()) << w.error().ToString();
    EXPECT_TRUE(fs::exists(dir + "/.lock"));
    ASSERT_TRUE((*w)->StageImage("0000-x.qcow2").ok());
    ASSERT_TRUE((*w)->StageSmallFile("0000-x.digests", Bytes("digests")).ok());
    // Destroyed uncommitted: the job failed.
  }
  EXPECT_FALSE(fs::exists(parent));
}

TEST(ChainWriterTest, FailedCommitRemovesEveryPublishedFileAndTheFirstPointsFolder) {
  TempDir tmp;
  const std::string parent = tmp / "target", dir = parent + "/d";
  FailLinkEnv env(PosixEnv(), "0000-x.json");
  {
    auto w = ChainWriter::Open(env, dir, ForBackup(parent));
    ASSERT_TRUE(w.ok()) << w.error().ToString();
    ASSERT_TRUE((*w)->StageImage("0000-x.qcow2").ok());
    ASSERT_TRUE((*w)->StageSmallFile("0000-x.digests", Bytes("digests")).ok());
    ASSERT_TRUE((*w)->StageSmallFile("0000-x.json", Bytes("{}")).ok());
    Status s = (*w)->Commit();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code(), ErrorCode::kNoSpace);
    EXPECT_NE(s.error().ToString().find("backup"), std::string::npos) << s.error().ToString();
    // The image and digests were published, then removed again.
    EXPECT_EQ(Names(dir), std::vector<std::string>{".lock"});
  }
  EXPECT_FALSE(fs::exists(parent));
}

TEST(ChainWriterTest, LeftoversNoManifestNamesAreRemovedOthersKept) {
  TempDir tmp;
  BackUpOnce(tmp);
  const std::string dir = tmp / "target/d";
  const std::vector<std::string> before = Names(dir);
  for (const char* name : {"0007-x.qcow2", "0007-x.digests", "0007-x.verified"}) Put(dir + "/" + name, "left");
  Put(TempPathFor(dir + "/0007-x.qcow2"), "left");
  Put(dir + "/notes.txt", "mine");
  {
    auto w = ChainWriter::Open(PosixEnv(), dir, ForBackup(tmp / "target"));
    ASSERT_TRUE(w.ok()) << w.error().ToString();
    EXPECT_EQ((*w)->chain().points.size(), 1u);
    // Destroyed uncommitted on a chain with a point: nothing of it goes.
  }
  std::vector<std::string> want = before;
  want.push_back("notes.txt");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(Names(dir), want);
}

TEST(ChainWriterTest, WithoutRemoveLeftoversNothingIsSwept) {
  TempDir tmp;
  BackUpOnce(tmp);
  const std::string dir = tmp / "target/d";
  Put(dir + "/0007-x.qcow2", "left");
  ChainWriterOptions o;
  o.job = "merge";
  auto w = ChainWriter::Open(PosixEnv(), dir, o);
  ASSERT_TRUE(w.ok()) << w.error().ToString();
  EXPECT_TRUE(fs::exists(dir + "/0007-x.qcow2"));
}

TEST(ChainWriterTest, AnotherWriterIsBusyAndAHeldLockIsUsed) {
  TempDir tmp;
  BackUpOnce(tmp);
  const std::string dir = tmp / "target/d";
  auto first = ChainWriter::Open(PosixEnv(), dir, ChainWriterOptions{});
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  auto second = ChainWriter::Open(PosixEnv(), dir, ChainWriterOptions{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy);
  EXPECT_EQ(second.error().path(), dir);
  first->reset();

  auto lock = ChainLock::Acquire(PosixEnv(), dir);
  ASSERT_TRUE(lock.ok()) << lock.error().ToString();
  ChainWriterOptions held;
  held.held = &*lock;
  auto under = ChainWriter::Open(PosixEnv(), dir, held);
  ASSERT_TRUE(under.ok()) << under.error().ToString();
  EXPECT_EQ((*under)->chain().points.size(), 1u);
}

TEST(ChainWriterTest, MissingFolderIsNotFoundWithoutCreate) {
  TempDir tmp;
  auto w = ChainWriter::Open(PosixEnv(), tmp / "nope", ChainWriterOptions{});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(fs::exists(tmp / "nope"));
}

TEST(ChainWriterTest, ReplacementIsStagedUnderTheMergeNameAndSweepKeepsIt) {
  TempDir tmp;
  BackUpOnce(tmp);
  const std::string dir = tmp / "target/d";
  const std::string stale = TempPathFor(dir + "/0001-x.json");
  Put(stale, "stale");
  ChainWriterOptions o;
  o.job = "merge";
  auto w = ChainWriter::Open(PosixEnv(), dir, o);
  ASSERT_TRUE(w.ok()) << w.error().ToString();
  auto size = (*w)->StageReplacement("0000-x.json", Bytes("{\"new\":1}"));
  ASSERT_TRUE(size.ok()) << size.error().ToString();
  EXPECT_EQ(*size, 9u);
  EXPECT_EQ(Get(dir + "/" + MergeStagedName("0000-x.json")), "{\"new\":1}");
  (*w)->SweepTemporaries();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(dir + "/" + MergeStagedName("0000-x.json")));
}

}  // namespace
}  // namespace barge::pipeline
