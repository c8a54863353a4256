// FaultEnv over real files: each rule of the power-loss model, crash
// points, injected errors by kind and count, and concurrent writers.
#include "blockio/fault_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/testing.h"

namespace barge {
namespace {

const std::string kMissing = "<missing>";

std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// The file's contents as the disk has them (read around the FaultEnv).
std::string Contents(const std::string& path) {
  auto text = PosixEnv().ReadFile(path, 64 << 20);
  if (text.ok()) return *text;
  return text.error().code() == ErrorCode::kNotFound ? kMissing : text.error().ToString();
}

std::vector<std::byte> Bytes(const std::string& path) {
  std::string s = Contents(path);
  auto b = AsBytes(s);
  return {b.begin(), b.end()};
}

class FaultEnvTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(PosixEnv().CreateDir(work_).ok()); }

  std::string Path(const std::string& name) const { return work_ + "/" + name; }

  // Writes `text` at `offset` through the FaultEnv; flushes when asked.
  void Write(const std::string& path, SinkMode mode, uint64_t offset, std::string_view text,
             bool flush, const FileOptions& options = {}) {
    auto sink = env_.OpenSink(path, mode, options);
    ASSERT_TRUE(sink.ok()) << sink.error().ToString();
    ASSERT_TRUE((*sink)->WriteAt(offset, AsBytes(text)).ok());
    if (flush) {
      ASSERT_TRUE((*sink)->Flush().ok());
    }
  }

  // A file that is durable before the test's changes.
  void Durable(const std::string& path, std::string_view text) {
    ASSERT_TRUE(PosixEnv().WriteFileAtomic(path, text).ok());
  }

  std::vector<std::string> Stash() const {
    auto names = PosixEnv().ListDir(tmp_ / "stash");
    return names.ok() ? *names : std::vector<std::string>{"<error>"};
  }

  void PowerLoss() {
    Status s = env_.SimulatePowerLoss();
    ASSERT_TRUE(s.ok()) << s.error().ToString();
  }

  testing::TempDir tmp_;
  const std::string work_ = tmp_ / "work";
  FaultEnv env_{PosixEnv(), tmp_ / "stash"};
};

// ---- file data ----

TEST_F(FaultEnvTest, UnsyncedAppendIsDropped) {
  std::string f = Path("f");
  {
    auto sink = env_.OpenSink(f, SinkMode::kCreateNew);
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE((*sink)->WriteAt(0, AsBytes("durable")).ok());
    ASSERT_TRUE((*sink)->Flush().ok());
    ASSERT_TRUE((*sink)->WriteAt(7, AsBytes("+lost")).ok());
  }
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  EXPECT_EQ(Contents(f), "durable+lost");
  EXPECT_EQ(env_.unsynced_files(), 1u);
  PowerLoss();
  EXPECT_EQ(Contents(f), "durable");
  EXPECT_EQ(env_.unsynced_files(), 0u);
  EXPECT_TRUE(Stash().empty());
}

TEST_F(FaultEnvTest, SyncedDataAndNamesAreKept) {
  std::string f = Path("f");
  Write(f, SinkMode::kCreateNew, 0, "all of it", /*flush=*/true);
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  EXPECT_EQ(env_.unsynced_files(), 0u);
  EXPECT_EQ(env_.pending_name_changes(), 0u);
  EXPECT_TRUE(Stash().empty());  // nothing left to bring back: no pins
  PowerLoss();
  EXPECT_EQ(Contents(f), "all of it");
}

TEST_F(FaultEnvTest, OverwritesBelowTheSyncedSizeAreRestored) {
  std::string f = Path("image");
  std::vector<std::byte> original = testing::RandomBytes(64 << 10, 7);
  testing::WriteFile(f, original);  // durable: there before the FaultEnv saw it
  {
    auto sink = env_.OpenSink(f, SinkMode::kExisting);
    ASSERT_TRUE(sink.ok());
    BlockSink& s = **sink;
    std::vector<std::byte> junk(300, std::byte{0xAA});
    ASSERT_TRUE(s.WriteAt(100, junk).ok());
    ASSERT_TRUE(s.WriteAt(250, junk).ok());  // overlaps the first: saved once
    ASSERT_TRUE(s.WriteZeroes(4096, 8192).ok());
    ASSERT_TRUE(s.Trim(20480, 4096).ok());
    ASSERT_TRUE(s.Truncate(30000).ok());
    ASSERT_TRUE(s.WriteAt(40000, junk).ok());  // past the new size, below the synced one
    ASSERT_TRUE(s.Truncate(70000).ok());
    ASSERT_TRUE(s.WriteAt(69000, junk).ok());  // past the synced size: truncation drops it
  }
  EXPECT_NE(Bytes(f), original);
  PowerLoss();
  EXPECT_EQ(Bytes(f), original);
}

TEST_F(FaultEnvTest, FlushedOverwriteIsKeptAndLaterOnesDropped) {
  std::string f = Path("f");
  Durable(f, "0123456789");
  {
    auto sink = env_.OpenSink(f, SinkMode::kExisting);
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE((*sink)->WriteAt(2, AsBytes("ab")).ok());
    ASSERT_TRUE((*sink)->Flush().ok());
    ASSERT_TRUE((*sink)->WriteAt(2, AsBytes("XYZ")).ok());
  }
  PowerLoss();
  EXPECT_EQ(Contents(f), "01ab456789");
}

TEST_F(FaultEnvTest, TruncatingOpenIsUndone) {
  std::string f = Path("f");
  Durable(f, "the old contents");
  Write(f, SinkMode::kTruncate, 0, "new", /*flush=*/false);
  EXPECT_EQ(Contents(f), "new");
  PowerLoss();
  EXPECT_EQ(Contents(f), "the old contents");
}

TEST_F(FaultEnvTest, FlushWithoutSyncIsNotDurable) {
  FileOptions no_sync;
  no_sync.sync = false;
  std::string f = Path("f");
  Write(f, SinkMode::kCreateNew, 0, "cached only", /*flush=*/true, no_sync);
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  PowerLoss();
  EXPECT_EQ(Contents(f), "");  // the name is durable, the data is not

  std::string g = Path("g");
  Durable(g, "old");
  ASSERT_TRUE(env_.WriteFileAtomic(g, std::string_view("new"), /*sync=*/false).ok());
  EXPECT_EQ(Contents(g), "new");
  PowerLoss();
  EXPECT_EQ(Contents(g), "old");
}

// ---- names ----

TEST_F(FaultEnvTest, CreateWithoutFolderSyncIsUndone) {
  std::string f = Path("f");
  Write(f, SinkMode::kCreateNew, 0, "data", /*flush=*/true);  // data durable, name not
  {
    auto lock = env_.LockFile(Path(".lock"));  // LockFile creates its file
    ASSERT_TRUE(lock.ok());
  }
  ASSERT_TRUE(env_.CreateDir(Path("d")).ok());
  EXPECT_EQ(env_.pending_name_changes(), 3u);
  PowerLoss();
  EXPECT_EQ(Contents(f), kMissing);
  EXPECT_FALSE(PosixEnv().Exists(Path(".lock")));
  EXPECT_FALSE(PosixEnv().Exists(Path("d")));
  EXPECT_TRUE(Stash().empty());
}

TEST_F(FaultEnvTest, CreateAndFolderSyncKeepTheNameButNotUnsyncedData) {
  std::string f = Path("f");
  Write(f, SinkMode::kCreateNew, 0, "not flushed", /*flush=*/false);
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  PowerLoss();
  EXPECT_EQ(Contents(f), "");
}

TEST_F(FaultEnvTest, RenameOverAFileIsUndoneUnlessTheFolderIsSynced) {
  for (bool sync_folder : {false, true}) {
    SCOPED_TRACE(sync_folder ? "folder synced" : "folder not synced");
    std::string src = Path("src"), dst = Path("dst");
    Durable(dst, "old");
    Write(src, SinkMode::kCreateNew, 0, "new", /*flush=*/true);
    ASSERT_TRUE(env_.Rename(src, dst).ok());
    if (sync_folder) {
      ASSERT_TRUE(env_.SyncDir(work_).ok());
    }
    EXPECT_EQ(Contents(dst), "new");
    PowerLoss();
    EXPECT_EQ(Contents(dst), sync_folder ? "new" : "old");
    EXPECT_EQ(Contents(src), kMissing);  // its creation went with the rename
    EXPECT_TRUE(Stash().empty());
  }
}

TEST_F(FaultEnvTest, ReplacedFileIsStashedUntilTheFolderSync) {
  std::string src = Path("src"), dst = Path("dst");
  Durable(dst, "old");
  Write(src, SinkMode::kCreateNew, 0, "new", /*flush=*/true);
  ASSERT_TRUE(env_.Rename(src, dst).ok());
  EXPECT_EQ(Stash().size(), 2u);  // the replaced file, and the renamed one
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  EXPECT_TRUE(Stash().empty());  // gone for good with the sync
}

TEST_F(FaultEnvTest, UnlinkIsUndoneUnlessTheFolderIsSynced) {
  std::string f = Path("f");
  Durable(f, "keep me");
  ASSERT_TRUE(env_.Unlink(f).ok());
  EXPECT_FALSE(PosixEnv().Exists(f));
  PowerLoss();
  EXPECT_EQ(Contents(f), "keep me");

  ASSERT_TRUE(env_.Unlink(f).ok());
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  EXPECT_TRUE(Stash().empty());
  PowerLoss();
  EXPECT_EQ(Contents(f), kMissing);
  EXPECT_EQ(env_.Unlink(f).error().code(), ErrorCode::kNotFound);
}

TEST_F(FaultEnvTest, UnlinkedFileComesBackWithItsDurableData) {
  std::string f = Path("f");
  Durable(f, "durable");
  Write(f, SinkMode::kExisting, 0, "DUR", /*flush=*/false);
  ASSERT_TRUE(env_.Unlink(f).ok());
  PowerLoss();
  EXPECT_EQ(Contents(f), "durable");
}

TEST_F(FaultEnvTest, LinkIsUndoneUnlessTheFolderIsSynced) {
  std::string a = Path("a"), b = Path("b");
  Durable(a, "x");
  ASSERT_TRUE(env_.Link(a, b).ok());
  PowerLoss();
  EXPECT_EQ(Contents(b), kMissing);
  EXPECT_EQ(Contents(a), "x");
  ASSERT_TRUE(env_.Link(a, b).ok());
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  PowerLoss();
  EXPECT_EQ(Contents(b), "x");
}

// A symbolic link is a name like any other: its creation is undone unless
// the folder is synced, and an unsynced removal brings it back (as a link,
// still holding its text).
TEST_F(FaultEnvTest, SymlinkIsUndoneUnlessTheFolderIsSynced) {
  std::string a = Path("a"), l = Path("l");
  Durable(a, "x");
  ASSERT_TRUE(env_.CreateSymlink("a", l).ok());
  EXPECT_EQ(env_.boundaries(), 1u);
  EXPECT_EQ(env_.calls(EnvOp::kLink), 1u);
  PowerLoss();
  EXPECT_FALSE(PosixEnv().StatNoFollow(l).ok());
  EXPECT_EQ(Contents(a), "x");

  ASSERT_TRUE(env_.CreateSymlink("a", l).ok());
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  PowerLoss();
  auto text = env_.ReadLink(l);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "a");

  ASSERT_TRUE(env_.Unlink(l).ok());
  PowerLoss();
  auto st = PosixEnv().StatNoFollow(l);
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->is_symlink());
  EXPECT_EQ(Contents(l), "x");  // through the link
  EXPECT_EQ(Contents(a), "x");

  // A crash at the symlink boundary: it is made, then the machine dies.
  env_.CrashAfter(1);
  ASSERT_FALSE(env_.CreateSymlink("a", Path("m")).ok());
  EXPECT_TRUE(env_.crashed());
  PowerLoss();
  EXPECT_FALSE(PosixEnv().StatNoFollow(Path("m")).ok());
}

TEST_F(FaultEnvTest, FolderCreationIsUndoneUnlessItsParentIsSynced) {
  std::string deep = Path("a/b");
  ASSERT_TRUE(env_.CreateDirs(deep).ok());
  Write(deep + "/f", SinkMode::kCreateNew, 0, "x", /*flush=*/true);
  ASSERT_TRUE(env_.SyncDir(deep).ok());      // f's entry is durable in b,
  ASSERT_TRUE(env_.SyncDir(Path("a")).ok());  // b's in a, but a's is not
  PowerLoss();
  EXPECT_FALSE(PosixEnv().Exists(Path("a")));

  ASSERT_TRUE(env_.CreateDirs(deep).ok());
  Write(deep + "/f", SinkMode::kCreateNew, 0, "x", /*flush=*/true);
  ASSERT_TRUE(env_.SyncDir(deep).ok());
  ASSERT_TRUE(env_.SyncDir(Path("a")).ok());
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  PowerLoss();
  EXPECT_EQ(Contents(deep + "/f"), "x");
}

TEST_F(FaultEnvTest, RenamedAndRemovedFoldersComeBack) {
  ASSERT_TRUE(PosixEnv().CreateDirs(Path("d/sub")).ok());
  Durable(Path("d/f"), "in d");
  ASSERT_TRUE(PosixEnv().CreateDir(Path("empty")).ok());
  ASSERT_TRUE(env_.Rename(Path("d"), Path("e")).ok());
  Write(Path("e/new"), SinkMode::kCreateNew, 0, "x", /*flush=*/true);  // inside the moved folder
  ASSERT_TRUE(env_.RemoveDir(Path("empty")).ok());
  PowerLoss();
  EXPECT_EQ(Contents(Path("d/f")), "in d");
  EXPECT_TRUE(PosixEnv().Stat(Path("d/sub")).ok());
  EXPECT_FALSE(PosixEnv().Exists(Path("d/new")));
  EXPECT_FALSE(PosixEnv().Exists(Path("e")));
  auto empty = PosixEnv().Stat(Path("empty"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->is_directory());
}

TEST_F(FaultEnvTest, CrossFolderRenameIsDurablePerFolder) {
  ASSERT_TRUE(PosixEnv().CreateDir(Path("a")).ok());
  ASSERT_TRUE(PosixEnv().CreateDir(Path("b")).ok());
  Durable(Path("a/f"), "x");
  ASSERT_TRUE(env_.Rename(Path("a/f"), Path("b/f")).ok());
  ASSERT_TRUE(env_.SyncDir(Path("b")).ok());  // the new entry only
  PowerLoss();
  EXPECT_EQ(Contents(Path("a/f")), "x");  // the old entry was not removed durably
  EXPECT_EQ(Contents(Path("b/f")), "x");
}

TEST_F(FaultEnvTest, RemovedTreeComesBackUnlessSynced) {
  ASSERT_TRUE(PosixEnv().CreateDirs(Path("chain/sub")).ok());
  Durable(Path("chain/a"), "a");
  Durable(Path("chain/sub/b"), "b");
  ASSERT_TRUE(env_.RemoveTree(Path("chain")).ok());
  EXPECT_FALSE(PosixEnv().Exists(Path("chain")));
  PowerLoss();
  EXPECT_EQ(Contents(Path("chain/a")), "a");
  EXPECT_EQ(Contents(Path("chain/sub/b")), "b");

  ASSERT_TRUE(env_.RemoveTree(Path("chain")).ok());
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  PowerLoss();
  EXPECT_FALSE(PosixEnv().Exists(Path("chain")));
  EXPECT_TRUE(Stash().empty());
}

// ---- crash points ----

TEST_F(FaultEnvTest, CrashEndsEveryLaterCallAndDropsTheCleanup) {
  std::string f = Path("m.json");
  std::string temp = TempPathFor(f);
  Durable(f, "old");
  env_.CrashAfter(1);  // the temporary's Flush lands, then the machine dies
  Status s = env_.WriteFileAtomic(f, std::string_view("new"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::kIoError);
  EXPECT_NE(s.error().ToString().find("simulated power loss"), std::string::npos);
  EXPECT_TRUE(env_.crashed());
  EXPECT_TRUE(PosixEnv().Exists(temp));  // its unlink on the way out had no effect
  EXPECT_EQ(env_.Stat(f).error().message(), "simulated power loss");
  EXPECT_FALSE(env_.ListDir(work_).ok());
  EXPECT_FALSE(env_.OpenSource(f, {}).ok());
  PowerLoss();
  EXPECT_FALSE(env_.crashed());
  EXPECT_FALSE(PosixEnv().Exists(temp));  // never made durable
  EXPECT_EQ(Contents(f), "old");
  EXPECT_TRUE(env_.Stat(f).ok());  // alive again
}

TEST_F(FaultEnvTest, CrashAfterZeroDiesBeforeTheFirstBoundary) {
  std::string f = Path("f");
  env_.CrashAfter(0);
  auto sink = env_.OpenSink(f, SinkMode::kCreateNew);  // not a boundary
  ASSERT_TRUE(sink.ok());
  ASSERT_TRUE((*sink)->WriteAt(0, AsBytes("x")).ok());
  EXPECT_FALSE((*sink)->Flush().ok());
  EXPECT_FALSE((*sink)->WriteAt(1, AsBytes("y")).ok());
  EXPECT_EQ(env_.boundaries(), 1u);
  sink->reset();
  PowerLoss();
  EXPECT_EQ(Contents(f), kMissing);
}

TEST_F(FaultEnvTest, WriteFileAtomicSurvivesEveryCrashPoint) {
  std::string f = Path("m.json");
  for (bool had_old : {true, false}) {
    SCOPED_TRACE(had_old ? "replacing" : "creating");
    std::vector<CrashPoint> points;
    auto runs = ForEachCrashPoint(
        env_,
        [&]() -> Status {
          BARGE_RETURN_IF_ERROR(PosixEnv().RemoveTree(work_));
          BARGE_RETURN_IF_ERROR(PosixEnv().CreateDir(work_));
          if (!had_old) return OkStatus();
          return PosixEnv().WriteFileAtomic(f, std::string_view("old"));
        },
        [&](Env& env) { return env.WriteFileAtomic(f, std::string_view("new")); },
        [&](const CrashPoint& p) {
          points.push_back(p);
          SCOPED_TRACE("after boundary " + std::to_string(p.after_boundaries));
          std::string now = Contents(f);
          // Durable once the folder sync (the third boundary) landed.
          std::string expected = p.after_boundaries >= 3 ? "new" : had_old ? "old" : kMissing;
          EXPECT_EQ(now, expected);
          EXPECT_EQ(p.op_status.ok(), !p.crashed);
          auto names = PosixEnv().ListDir(work_);
          ASSERT_TRUE(names.ok());
          EXPECT_EQ(names->size(), now == kMissing ? 0u : 1u);  // no temporary left
          // The recovery step: the next write goes through.
          EXPECT_TRUE(PosixEnv().WriteFileAtomic(f, std::string_view("later")).ok());
        });
    ASSERT_TRUE(runs.ok()) << runs.error().ToString();
    EXPECT_EQ(*runs, 5u);  // the clean run, then after 0, 1 (flush), 2 (rename), 3 (sync-dir)
    ASSERT_EQ(points.size(), 5u);
    EXPECT_EQ(points[0].boundaries, 3u);
    EXPECT_FALSE(points[0].crashed);
    EXPECT_TRUE(points[1].crashed);
    EXPECT_EQ(points[4].after_boundaries, 3u);
  }
}

// A staged publish (write a temporary, flush, rename, sync the folder)
// never shows a partial file under the final name; without the flush it
// does, and the crash points find it.
TEST_F(FaultEnvTest, CrashPointsFindAPublishWithoutFlush) {
  std::string final_path = Path("backup.qcow2");
  std::vector<std::byte> data = testing::RandomBytes(1 << 20, 3);
  for (bool flush : {true, false}) {
    SCOPED_TRACE(flush ? "with flush" : "without flush");
    int partial = 0;
    auto runs = ForEachCrashPoint(
        env_,
        [&]() -> Status {
          BARGE_RETURN_IF_ERROR(PosixEnv().RemoveTree(work_));
          return PosixEnv().CreateDir(work_);
        },
        [&](Env& env) -> Status {
          std::string temp = TempPathFor(final_path);
          {
            BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink,
                                   env.OpenSink(temp, SinkMode::kCreateNew));
            for (size_t off = 0; off < data.size(); off += 256 << 10) {
              BARGE_RETURN_IF_ERROR(sink->WriteAt(off, std::span(data).subspan(off, 256 << 10)));
            }
            if (flush) BARGE_RETURN_IF_ERROR(sink->Flush());
          }
          BARGE_RETURN_IF_ERROR(env.Rename(temp, final_path));
          return env.SyncDir(work_);
        },
        [&](const CrashPoint&) {
          std::vector<std::byte> now = Bytes(final_path);
          if (Contents(final_path) != kMissing && now != data) ++partial;
        });
    ASSERT_TRUE(runs.ok()) << runs.error().ToString();
    if (flush) {
      EXPECT_EQ(partial, 0);
    } else {
      EXPECT_GT(partial, 0);
    }
  }
}

// Four threads replace files while the machine dies under them: every file
// is whole, old or new, and the sweep of temporaries finds the rest.
TEST_F(FaultEnvTest, CrashUnderFourThreadsLeavesEveryFileOldOrNew) {
  constexpr int kThreads = 4;
  constexpr int kFiles = 5;
  auto name = [&](int t, int i) { return Path("f" + std::to_string(t) + "-" + std::to_string(i)); };
  for (uint64_t crash_after : {0, 1, 7, 20, 45, 1000}) {
    SCOPED_TRACE(crash_after);
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kFiles; ++i) Durable(name(t, i), "old");
    }
    env_.MarkDurable();
    env_.CrashAfter(crash_after);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kFiles; ++i) {
          if (!env_.WriteFileAtomic(name(t, i), std::string_view("new")).ok()) return;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(env_.crashed(), crash_after < 3 * kThreads * kFiles);
    PowerLoss();
    // One thread's folder sync also makes the others' temporaries durable,
    // as on a real filesystem: the recovery step sweeps them.
    auto swept = SweepStaleTemporaries(PosixEnv(), work_);
    ASSERT_TRUE(swept.ok());
    auto names = PosixEnv().ListDir(work_);
    ASSERT_TRUE(names.ok());
    EXPECT_EQ(names->size(), size_t{kThreads * kFiles});
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kFiles; ++i) {
        std::string now = Contents(name(t, i));
        EXPECT_TRUE(now == "old" || now == "new") << now;
      }
    }
  }
}

// ---- errors ----

TEST_F(FaultEnvTest, FailsTheNthCallOfAKindWithEachErrno) {
  struct Case {
    int err;
    ErrorCode code;
  };
  for (Case c : {Case{EIO, ErrorCode::kIoError}, Case{ENOSPC, ErrorCode::kNoSpace},
                 Case{EDQUOT, ErrorCode::kNoSpace}, Case{EROFS, ErrorCode::kIoError}}) {
    SCOPED_TRACE(c.err);
    env_.ClearFaults();
    env_.ResetCounters();
    Durable(Path("a"), "a");
    env_.FailCall(EnvOp::kRename, 2, c.err);
    ASSERT_TRUE(env_.Rename(Path("a"), Path("b")).ok());
    Status s = env_.Rename(Path("b"), Path("c"));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().errno_value(), c.err);
    EXPECT_EQ(s.error().code(), c.code);
    EXPECT_EQ(s.error().path(), Path("c"));
    EXPECT_NE(s.error().message().find("injected rename"), std::string::npos);
    EXPECT_EQ(Contents(Path("b")), "a");  // no effect
    ASSERT_TRUE(env_.Rename(Path("b"), Path("c")).ok());  // only the 2nd
    EXPECT_EQ(env_.calls(EnvOp::kRename), 3u);
    ASSERT_TRUE(env_.Unlink(Path("c")).ok());

    // Sink writes: the 2nd and every later one, with the range named.
    env_.FailCall(EnvOp::kWrite, 2, c.err, /*and_after=*/true);
    auto sink = env_.OpenSink(Path("w"), SinkMode::kTruncate);
    ASSERT_TRUE(sink.ok());
    EXPECT_TRUE((*sink)->WriteAt(0, AsBytes("1")).ok());
    Status w = (*sink)->WriteAt(1, AsBytes("22"));
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.error().errno_value(), c.err);
    EXPECT_EQ(w.error().path(), Path("w"));
    EXPECT_EQ(w.error().offset(), 1u);
    EXPECT_EQ(w.error().length(), 2u);
    EXPECT_FALSE((*sink)->WriteZeroes(0, 10).ok());
    EXPECT_FALSE((*sink)->Truncate(0).ok());
    EXPECT_TRUE((*sink)->Flush().ok());  // another kind
    EXPECT_EQ(env_.calls(EnvOp::kWrite), 4u);
    sink->reset();
    EXPECT_EQ(Contents(Path("w")), "1");
  }
}

TEST_F(FaultEnvTest, CountsEveryKindOfCall) {
  std::string f = Path("f");
  uid_t uid = ::getuid();
  gid_t gid = ::getgid();
  {
    auto sink = env_.OpenSink(f, SinkMode::kCreateNew);
    ASSERT_TRUE(sink.ok());
    ASSERT_TRUE((*sink)->WriteAt(0, AsBytes("0123456789")).ok());
    ASSERT_TRUE((*sink)->WriteZeroes(2, 2).ok());
    ASSERT_TRUE((*sink)->Trim(4, 2).ok());
    ASSERT_TRUE((*sink)->Truncate(8).ok());
    ASSERT_TRUE((*sink)->Flush().ok());
  }
  {
    auto src = env_.OpenSource(f, {});
    ASSERT_TRUE(src.ok());
    std::vector<std::byte> buf(4);
    ASSERT_TRUE((*src)->ReadAt(0, buf).ok());
    std::vector<std::byte> b1(2), b2(2);
    std::vector<ReadRequest> reqs{{0, b1, {}}, {2, b2, {}}};
    ASSERT_TRUE((*src)->ReadMany(reqs).ok());
    ASSERT_TRUE((*src)->Extents(0, 8).ok());
    (*src)->WillNeed(0, 8);  // a hint: not counted
  }
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  ASSERT_TRUE(env_.Rename(f, Path("g")).ok());
  ASSERT_TRUE(env_.Link(Path("g"), Path("h")).ok());
  ASSERT_TRUE(env_.Unlink(Path("h")).ok());
  ASSERT_TRUE(env_.CreateSymlink("g", Path("s")).ok());
  ASSERT_TRUE(env_.ReadLink(Path("s")).ok());
  ASSERT_TRUE(env_.UnlinkIfExists(Path("s")).ok());
  ASSERT_TRUE(env_.UnlinkIfExists(Path("s")).ok());  // gone: still a call
  ASSERT_TRUE(env_.CreateDir(Path("d")).ok());
  ASSERT_TRUE(env_.RemoveDir(Path("d")).ok());
  ASSERT_TRUE(env_.ListDir(work_).ok());
  ASSERT_TRUE(env_.LockFile(Path(".lock")).ok());
  ASSERT_TRUE(env_.LockImage(Path("g"), ImageAccess::kRead).ok());
  ASSERT_TRUE(env_.Stat(Path("g")).ok());
  ASSERT_TRUE(env_.StatNoFollow(Path("g")).ok());
  ASSERT_TRUE(env_.Space(work_).ok());
  ASSERT_TRUE(env_.RealPath(Path("g")).ok());
  ASSERT_TRUE(env_.SetMode(Path("g"), 0600).ok());
  ASSERT_TRUE(env_.SetOwner(Path("g"), uid, gid).ok());

  struct Want {
    EnvOp op;
    uint64_t calls;
  };
  for (Want w : {Want{EnvOp::kOpen, 2}, Want{EnvOp::kRead, 4}, Want{EnvOp::kWrite, 4},
                 Want{EnvOp::kSync, 1}, Want{EnvOp::kSyncDir, 1}, Want{EnvOp::kRename, 1},
                 Want{EnvOp::kLink, 2}, Want{EnvOp::kUnlink, 4}, Want{EnvOp::kMkdir, 1},
                 Want{EnvOp::kList, 1}, Want{EnvOp::kLock, 2}, Want{EnvOp::kStat, 5},
                 Want{EnvOp::kSetOwner, 2}}) {
    EXPECT_EQ(env_.calls(w.op), w.calls) << EnvOpName(w.op);
  }
  // sync, sync-dir, rename, link, unlink, symlink, 2 unlinks, rmdir
  EXPECT_EQ(env_.boundaries(), 9u);

  // Every kind can be failed.
  env_.FailAll(EnvOp::kList, EROFS);
  env_.FailAll(EnvOp::kLock, EROFS);
  env_.FailAll(EnvOp::kStat, EROFS);
  env_.FailAll(EnvOp::kSetOwner, EROFS);
  env_.FailAll(EnvOp::kMkdir, EROFS);
  env_.FailAll(EnvOp::kOpen, EROFS);
  EXPECT_EQ(env_.ListDir(work_).error().errno_value(), EROFS);
  EXPECT_EQ(env_.ReadLink(Path("g")).error().errno_value(), EROFS);
  ASSERT_EQ(env_.injections().size(), 2u);
  EXPECT_EQ(env_.injections()[1].op, EnvOp::kStat);
  EXPECT_EQ(env_.injections()[1].path, Path("g"));
  EXPECT_EQ(env_.injections()[1].err, EROFS);
  EXPECT_EQ(env_.LockFile(Path(".lock")).error().errno_value(), EROFS);
  EXPECT_EQ(env_.Space(work_).error().errno_value(), EROFS);
  EXPECT_EQ(env_.SetMode(Path("g"), 0644).error().errno_value(), EROFS);
  EXPECT_EQ(env_.CreateDir(Path("d")).error().errno_value(), EROFS);
  EXPECT_EQ(env_.ReadFile(Path("g")).error().errno_value(), EROFS);
  EXPECT_FALSE(PosixEnv().Exists(Path("d")));
  env_.ClearFaults();
  EXPECT_TRUE(env_.ListDir(work_).ok());
}

// The campaign's pattern: count the sites of each kind in a clean run, then
// fail each in turn. WriteFileAtomic must report the error, leave no
// temporary, and keep the old contents (or, once renamed, the new).
TEST_F(FaultEnvTest, FailingEachSiteInTurnLosesNothing) {
  std::string f = Path("m.json");
  Durable(f, "old");
  env_.ResetCounters();
  ASSERT_TRUE(env_.WriteFileAtomic(f, std::string_view("new")).ok());
  std::vector<std::pair<EnvOp, uint64_t>> sites;
  for (EnvOp op : {EnvOp::kOpen, EnvOp::kWrite, EnvOp::kSync, EnvOp::kRename, EnvOp::kSyncDir,
                   EnvOp::kLock}) {
    uint64_t n = env_.calls(op);
    EXPECT_GE(n, 1u) << EnvOpName(op);
    for (uint64_t i = 1; i <= n; ++i) sites.emplace_back(op, i);
  }
  for (int err : {EIO, ENOSPC}) {
    for (auto [op, n] : sites) {
      SCOPED_TRACE(std::string(EnvOpName(op)) + " #" + std::to_string(n) + " errno " +
                   std::to_string(err));
      Durable(f, "old");
      env_.ClearFaults();
      env_.ResetCounters();
      env_.FailCall(op, n, err);
      Status s = env_.WriteFileAtomic(f, std::string_view("new"));
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.error().errno_value(), err);
      // The folder sync names the folder; every other site the file.
      if (op == EnvOp::kSyncDir) {
        EXPECT_EQ(s.error().path(), work_);
      } else {
        EXPECT_NE(s.error().path().find("m.json"), std::string::npos);
      }
      EXPECT_EQ(Contents(f), op == EnvOp::kSyncDir ? "new" : "old");
      auto names = PosixEnv().ListDir(work_);
      ASSERT_TRUE(names.ok());
      EXPECT_EQ(*names, std::vector<std::string>{"m.json"});
    }
  }
  env_.ClearFaults();
}

// ---- threads and locks ----

TEST_F(FaultEnvTest, FourConcurrentWritersKeepExactlyTheSyncedData) {
  constexpr size_t kChunk = 64 << 10;
  constexpr size_t kPerThread = 16;
  constexpr int kThreads = 4;
  std::string f = Path("image");
  std::vector<std::byte> original = testing::RandomBytes(kChunk * kPerThread * kThreads, 1);
  testing::WriteFile(f, original);
  auto sink = env_.OpenSink(f, SinkMode::kExisting);
  ASSERT_TRUE(sink.ok());
  auto write_all = [&](uint64_t seed, bool grow) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        // Each thread its own quarter, every other chunk; and its own new file.
        std::vector<std::byte> data = testing::RandomBytes(kChunk, seed + t);
        auto own = env_.OpenSink(Path("t" + std::to_string(t)), SinkMode::kTruncate);
        ASSERT_TRUE(own.ok());
        for (size_t i = 0; i < kPerThread; i += 2) {
          uint64_t off = (t * kPerThread + i) * kChunk;
          ASSERT_TRUE((*sink)->WriteAt(off, data).ok());
          ASSERT_TRUE((*own)->WriteAt(i * kChunk, data).ok());
        }
        if (grow) {
          ASSERT_TRUE((*sink)->WriteAt(original.size() + t * kChunk, data).ok());
        }
        ASSERT_TRUE((*own)->Flush().ok());
      });
    }
    for (auto& th : threads) th.join();
  };
  write_all(100, false);
  ASSERT_TRUE((*sink)->Flush().ok());
  ASSERT_TRUE(env_.SyncDir(work_).ok());
  std::vector<std::byte> synced = Bytes(f);
  std::vector<std::vector<std::byte>> synced_own;
  for (int t = 0; t < kThreads; ++t) synced_own.push_back(Bytes(Path("t" + std::to_string(t))));
  EXPECT_EQ(env_.calls(EnvOp::kWrite), kThreads * kPerThread);

  write_all(200, true);  // all over again, and past the end; not synced
  // The per-thread files were flushed by their threads: durable again.
  sink->reset();
  EXPECT_NE(Bytes(f), synced);
  PowerLoss();
  EXPECT_EQ(Bytes(f), synced);
  for (int t = 0; t < kThreads; ++t) {
    // Rewritten and flushed: the second pass's data, with holes between.
    std::vector<std::byte> want((kPerThread - 1) * kChunk);
    std::vector<std::byte> data = testing::RandomBytes(kChunk, 200 + t);
    for (size_t i = 0; i < kPerThread; i += 2) std::copy(data.begin(), data.end(), want.begin() + i * kChunk);
    EXPECT_EQ(Bytes(Path("t" + std::to_string(t))), want);
    EXPECT_NE(want, synced_own[t]);
  }
}

TEST_F(FaultEnvTest, LocksPassThrough) {
  std::string lock_path = Path(".lock");
  auto held = env_.LockFile(lock_path);
  ASSERT_TRUE(held.ok());
  auto other = PosixEnv().LockFile(lock_path);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code(), ErrorCode::kBusy);
  held->reset();
  EXPECT_TRUE(PosixEnv().LockFile(lock_path).ok());

  Durable(Path("img"), "image");
  auto image = env_.LockImage(Path("img"), ImageAccess::kExclusiveWrite);
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(PosixEnv().LockImage(Path("img"), ImageAccess::kRead).error().code(),
            ErrorCode::kBusy);
}

}  // namespace
}  // namespace barge
