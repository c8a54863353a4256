// ImageCatalog across processes: an old catalog gains the owner column;
// pending and in-progress rows of gone owners are marked interrupted (their
// temporaries removed), those of live or remote owners are left alone; the
// per-image lock refuses a second sync and holds back recovery.
#include "orchestrate/catalog/image_catalog.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <tuple>

#include "blockio/fault_env.h"
#include "blockio/path.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/base/sqlite_db.h"
#include "tests/testing/env_wrappers.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

namespace fs = std::filesystem;

// The image_copies table as versions before the owner column made it.
constexpr const char* kOldSchema = R"sql(
CREATE TABLE images (name TEXT PRIMARY KEY, source TEXT NOT NULL, expected_sha512 TEXT NOT NULL DEFAULT '',
  sha512 TEXT NOT NULL DEFAULT '', format TEXT NOT NULL DEFAULT '', virtual_size INTEGER NOT NULL DEFAULT 0,
  created INTEGER NOT NULL);
CREATE TABLE image_copies (image TEXT NOT NULL REFERENCES images(name) ON DELETE CASCADE, disk TEXT NOT NULL,
  path TEXT NOT NULL, state TEXT NOT NULL CHECK (state IN ('pending', 'in-progress', 'ready', 'failed')),
  percent REAL NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '', sender TEXT NOT NULL DEFAULT '',
  updated INTEGER NOT NULL, unused_since INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (image, disk));
CREATE TABLE image_senders (image TEXT NOT NULL REFERENCES images(name) ON DELETE CASCADE, sender TEXT NOT NULL,
  sends INTEGER NOT NULL DEFAULT 0, max_concurrent INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (image, sender));
)sql";

class ImageCatalogTest : public ::testing::Test {
 protected:
  std::string Db() const { return dir_ / "catalog.db"; }
  std::string Disk(const std::string& name) const {
    fs::create_directories(dir_ / name);
    return fs::canonical(dir_ / name).string();
  }
  // A hidden temporary as a killed RunReplicate leaves it.
  std::string Temp(const std::string& disk, const std::string& name) const {
    std::string t = disk + "/." + name + ".barge-tmp";
    barge::testing::WriteFile(t, barge::testing::RandomBytes(4096, 1));
    return t;
  }
  std::map<std::string, ImageCopyRecord> CopiesByDisk(ImageCatalog& c, const std::string& image) {
    auto copies = c.Copies(image);
    EXPECT_TRUE(copies.ok());
    std::map<std::string, ImageCopyRecord> out;
    if (copies.ok()) {
      for (auto& r : *copies) out[r.disk] = r;
    }
    return out;
  }
  barge::testing::TempDir dir_;
};

TEST_F(ImageCatalogTest, OldCatalogGainsOwnerAndItsUnownedRowsAreInterrupted) {
  std::string a = Disk("a"), b = Disk("b");
  std::string temp = Temp(a, "base");
  {
    auto db = SqliteDb::Open(PosixEnv(), Db());
    ASSERT_TRUE(db.ok()) << db.error().ToString();
    ASSERT_TRUE((*db)->Exec(kOldSchema).ok());
    ASSERT_TRUE((*db)->Exec("INSERT INTO images (name, source, created) VALUES ('base', '/src', 1);").ok());
    std::string rows = "INSERT INTO image_copies (image, disk, path, state, percent, updated) VALUES "
                       "('base', '" + a + "', '" + a + "/base', 'in-progress', 37.5, 1), "
                       "('base', '" + b + "', '" + b + "/base', 'ready', 100, 1);";
    ASSERT_TRUE((*db)->Exec(rows).ok());
  }
  auto cat = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  auto before = CopiesByDisk(**cat, "base");
  EXPECT_EQ(before[a].state, "in-progress");
  EXPECT_EQ(before[a].percent, 37.5);
  EXPECT_EQ(before[a].owner, "");

  auto recovered = (*cat)->RecoverInterrupted();
  ASSERT_TRUE(recovered.ok()) << recovered.error().ToString();
  ASSERT_EQ(recovered->size(), 1u);
  EXPECT_EQ((*recovered)[0].disk, a);
  auto after = CopiesByDisk(**cat, "base");
  EXPECT_EQ(after[a].state, "failed");
  EXPECT_EQ(after[a].message, kInterruptedMessage);
  EXPECT_EQ(after[a].percent, 37.5);
  EXPECT_EQ(after[b].state, "ready");
  EXPECT_FALSE(fs::exists(temp));

  // Opening again (already migrated) changes nothing.
  cat->reset();
  auto again = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  EXPECT_EQ(CopiesByDisk(**again, "base")[a].state, "failed");
}

TEST_F(ImageCatalogTest, OnlyGoneOwnersAreRecovered) {
  std::string live = Disk("live"), remote = Disk("remote"), dead = Disk("dead"), queued = Disk("queued");
  ProcessOwner self = ProcessOwner::Self(PosixEnv());
  ProcessOwner elsewhere = self;
  elsewhere.host += "-elsewhere";
  elsewhere.pid = 1;
  pid_t child = ::fork();
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  auto child_owner = ProcessOwner::Of(PosixEnv(), child);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(child_owner.ok());

  auto cat = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  {
    auto db = SqliteDb::Open(PosixEnv(), Db());
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("INSERT INTO images (name, source, created) VALUES ('base', '/src', 1);").ok());
    auto st = (*db)->Prepare("INSERT INTO image_copies (image, disk, path, state, updated, owner) "
                             "VALUES ('base', ?1, ?1 || '/base', ?2, 1, ?3)");
    ASSERT_TRUE(st.ok());
    for (auto [disk, state, owner] : {std::tuple{live, "in-progress", self.Encode()},
                                      std::tuple{remote, "in-progress", elsewhere.Encode()},
                                      std::tuple{dead, "in-progress", child_owner->Encode()},
                                      std::tuple{queued, "pending", child_owner->Encode()}}) {
      ASSERT_TRUE(st->Bind(1, disk).Bind(2, state).Bind(3, owner).Run().ok());
      ASSERT_TRUE(st->Reset().ok());
    }
  }
  std::string live_temp = Temp(live, "base"), remote_temp = Temp(remote, "base"), dead_temp = Temp(dead, "base");

  // While another process (here: another lock) holds the image, nothing is
  // touched: that add or sync owns the image's rows.
  {
    auto held = TryLockFile(PosixEnv(), dir_ / "locks/images/base.lock", "busy");
    ASSERT_TRUE(held.ok()) << held.error().ToString();
    auto r = (*cat)->RecoverInterrupted("base");
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_TRUE(r->empty());
    EXPECT_EQ(CopiesByDisk(**cat, "base")[dead].state, "in-progress");
    EXPECT_TRUE(fs::exists(dead_temp));
  }

  auto r = (*cat)->RecoverInterrupted("base");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->size(), 2u);
  auto rows = CopiesByDisk(**cat, "base");
  EXPECT_EQ(rows[live].state, "in-progress");
  EXPECT_EQ(rows[live].owner, self.Encode());
  EXPECT_EQ(rows[remote].state, "in-progress");
  EXPECT_EQ(rows[dead].state, "failed");
  EXPECT_EQ(rows[dead].message, kInterruptedMessage);
  EXPECT_EQ(rows[dead].owner, "");
  EXPECT_EQ(rows[queued].state, "failed");
  EXPECT_TRUE(fs::exists(live_temp));
  EXPECT_TRUE(fs::exists(remote_temp));
  EXPECT_FALSE(fs::exists(dead_temp));

  // Nothing more to do the second time.
  r = (*cat)->RecoverInterrupted();
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->empty());
}

TEST_F(ImageCatalogTest, SyncOfALockedImageIsRefusedAtOnce) {
  auto cat = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  auto held = TryLockFile(PosixEnv(), dir_ / "locks/images/base.lock", "busy");
  ASSERT_TRUE(held.ok());
  auto r = (*cat)->Sync("base", {Disk("a")}, SyncOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kBusy);
  EXPECT_TRUE(r.error().retryable());
  EXPECT_EQ(r.error().message(), "an image sync of base is already running");
  held->reset();
  // Free again: now it fails for its real reason.
  r = (*cat)->Sync("base", {Disk("a")}, SyncOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound) << r.error().ToString();
  // Names that could leave the lock folder are refused before any lock.
  EXPECT_EQ((*cat)->Sync("../x", {Disk("a")}, SyncOptions{}).error().code(), ErrorCode::kInvalidArgument);
}

// Issue 13 (found by the reliability campaign): cleanup removed a copy and
// its record, then deleted the row, without syncing the folder. A power
// loss brought the files back with no row left, so no later cleanup ever
// removed them. Now a removal is durable before its row goes, and a crash
// before that leaves the row for the next cleanup.
TEST_F(ImageCatalogTest, Issue13CleanupRemovalIsDurableBeforeTheRowGoes) {
  std::string src = dir_ / "src.raw";
  barge::testing::WriteFile(src, barge::testing::RandomBytes(256 << 10, 3));
  // Two copies: cleanup keeps an image's last ready copy, and removes the
  // other.
  const std::string a = Disk("a");
  const std::string b = Disk("b");
  FaultEnv env(PosixEnv(), dir_ / "stash");
  std::string copy;  // the copy cleanup removes
  {
    auto cat = ImageCatalog::Open(env, Db());
    ASSERT_TRUE(cat.ok()) << cat.error().ToString();
    auto added = (*cat)->Add("base", src, "", a, pipeline::ReplicateOptions{});
    ASSERT_TRUE(added.ok()) << added.error().ToString();
    ASSERT_EQ(added->state, "ready") << added->message;
    ASSERT_TRUE((*cat)->Sync("base", {b}, SyncOptions{}).ok());
    env.MarkDurable();
    auto r = (*cat)->Cleanup(std::chrono::seconds(0));
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    ASSERT_EQ(r->removed.size(), 1u);
    ASSERT_EQ(r->last_copy.size(), 1u);
    copy = r->removed[0];
  }
  ASSERT_TRUE(env.SimulatePowerLoss().ok());
  EXPECT_FALSE(fs::exists(copy)) << "reported removed, back after a power loss";
  EXPECT_FALSE(fs::exists(pipeline::ReplicaRecordPath(copy)));

  // A crash between the unlinks and the folder sync: the files come back
  // and keep their row, and the next cleanup removes them.
  const std::string disk = DirName(copy);
  {
    auto cat = ImageCatalog::Open(env, Db());
    ASSERT_TRUE(cat.ok());
    ASSERT_TRUE((*cat)->Sync("base", {disk}, SyncOptions{}).ok());
    env.MarkDurable();
    env.CrashAfter(2);  // the record's and the copy's unlinks
    EXPECT_FALSE((*cat)->Cleanup(std::chrono::seconds(0)).ok());
  }
  ASSERT_TRUE(env.SimulatePowerLoss().ok());
  ASSERT_TRUE(fs::exists(copy));
  auto cat = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(cat.ok());
  EXPECT_EQ(CopiesByDisk(**cat, "base")[disk].state, "ready");
  auto r = (*cat)->Cleanup(std::chrono::seconds(0));
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->removed, std::vector<std::string>{copy});
  EXPECT_FALSE(fs::exists(copy));
}

// A VM disk beside a copy that cannot be read may name the copy as its
// backing file: cleanup stops with that file's error and removes nothing
// unseen (found by the reliability campaign: an EIO opening the disk let
// cleanup remove the backing file it used).
TEST_F(ImageCatalogTest, Issue13CleanupKeepsACopyWhoseNeighbourCannotBeRead) {
  BARGE_REQUIRE_TOOL("qemu-img");
  std::string src = dir_ / "src.raw";
  barge::testing::WriteFile(src, barge::testing::RandomBytes(256 << 10, 4));
  const std::string a = Disk("a"), b = Disk("b"), c = Disk("c");
  {
    auto cat = ImageCatalog::Open(PosixEnv(), Db());
    ASSERT_TRUE(cat.ok()) << cat.error().ToString();
    auto added = (*cat)->Add("base", src, "", a, pipeline::ReplicateOptions{});
    ASSERT_TRUE(added.ok()) << added.error().ToString();
    ASSERT_EQ(added->state, "ready") << added->message;
    ASSERT_TRUE((*cat)->Sync("base", {b, c}, SyncOptions{}).ok());
  }
  // A VM disk on a uses a's copy.
  barge::testing::RunOk("qemu-img create -f qcow2 -b base.raw -F raw " + barge::testing::ShellQuote(a + "/vm.qcow2") +
                        " >/dev/null");
  testing::FailOpenEnv env(PosixEnv(), a + "/vm.qcow2");
  {
    auto cat = ImageCatalog::Open(env, Db());
    ASSERT_TRUE(cat.ok()) << cat.error().ToString();
    auto r = (*cat)->Cleanup(std::chrono::seconds(0));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::kIoError) << r.error().ToString();
    EXPECT_EQ(r.error().path(), a + "/vm.qcow2") << r.error().ToString();
    EXPECT_TRUE(fs::exists(a + "/base.raw"));
    EXPECT_TRUE(fs::exists(pipeline::ReplicaRecordPath(a + "/base.raw")));
  }
  // Readable again: a's copy is in use and stays, b's and c's go.
  auto cat = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  auto r = (*cat)->Cleanup(std::chrono::seconds(0));
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->in_use, std::vector<std::string>{a + "/base.raw"});
  EXPECT_TRUE(fs::exists(a + "/base.raw"));
  EXPECT_EQ(r->removed.size(), 2u);
  EXPECT_FALSE(fs::exists(b + "/base.raw"));
  EXPECT_FALSE(fs::exists(c + "/base.raw"));
}

// The only ready copy's checksum record cannot be read: sync fails with
// that I/O error naming the record, not with NotFound (found by the
// reliability campaign: "has no ready copy to send from" for an EIO).
TEST_F(ImageCatalogTest, Issue13SyncWhoseOnlySenderCannotBeReadSaysWhy) {
  std::string src = dir_ / "src.raw";
  barge::testing::WriteFile(src, barge::testing::RandomBytes(256 << 10, 5));
  const std::string a = Disk("a"), b = Disk("b");
  {
    auto cat = ImageCatalog::Open(PosixEnv(), Db());
    ASSERT_TRUE(cat.ok()) << cat.error().ToString();
    auto added = (*cat)->Add("base", src, "", a, pipeline::ReplicateOptions{});
    ASSERT_TRUE(added.ok()) << added.error().ToString();
  }
  testing::FailOpenEnv env(PosixEnv(), pipeline::ReplicaRecordPath(a + "/base.raw"));
  auto cat = ImageCatalog::Open(env, Db());
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  auto r = (*cat)->Sync("base", {b}, SyncOptions{});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kIoError) << r.error().ToString();
  EXPECT_EQ(r.error().path(), pipeline::ReplicaRecordPath(a + "/base.raw")) << r.error().ToString();
  EXPECT_NE(r.error().ToString().find("no ready copy to send from"), std::string::npos) << r.error().ToString();
}

// Every image name has its own copy file: image `a` from x.raw and image
// `a.raw` from y.raw once both mapped to DISK/a.raw, and each add or sync,
// holding only its own image's lock, overwrote the other's ready copy; a
// rescan then called the image `a.raw` `a`.
TEST_F(ImageCatalogTest, TwoImagesNeverShareACopyFile) {
  const std::string x = dir_ / "x.raw", y = dir_ / "y.raw", bare = dir_ / "bare";
  const auto x_bytes = barge::testing::RandomBytes(64 << 10, 6);
  const auto y_bytes = barge::testing::RandomBytes(64 << 10, 7);
  barge::testing::WriteFile(x, x_bytes);
  barge::testing::WriteFile(y, y_bytes);
  barge::testing::WriteFile(bare, y_bytes);
  const std::string d1 = Disk("d1"), d2 = Disk("d2");
  auto cat = ImageCatalog::Open(PosixEnv(), Db());
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  auto add = [&](const std::string& name, const std::string& source, const std::string& disk) {
    return (*cat)->Add(name, source, "", disk, pipeline::ReplicateOptions{});
  };

  // The name never drops the source's extension, so the two differ.
  auto a = add("a", x, d1);
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(a->path, d1 + "/a.raw");
  auto a_raw = add("a.raw", y, d1);
  ASSERT_TRUE(a_raw.ok()) << a_raw.error().ToString();
  EXPECT_EQ(a_raw->path, d1 + "/a.raw.raw");
  EXPECT_EQ(barge::testing::ReadFile(a->path), x_bytes);
  EXPECT_EQ(barge::testing::ReadFile(a_raw->path), y_bytes);

  // A source without an extension gives the name alone: `b.raw` from
  // `bare` would be d1/b.raw, image b's copy. The add is refused, leaves
  // no image, and b's copy is untouched.
  ASSERT_TRUE(add("b", x, d1).ok());
  auto clash = add("b.raw", bare, d1);
  ASSERT_FALSE(clash.ok());
  EXPECT_EQ(clash.error().code(), ErrorCode::kInvalidArgument) << clash.error().ToString();
  EXPECT_NE(clash.error().ToString().find("image 'b'"), std::string::npos) << clash.error().ToString();
  EXPECT_EQ(barge::testing::ReadFile(d1 + "/b.raw"), x_bytes);
  auto none = (*cat)->Images("b.raw");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  // The same in a sync: d2/c.raw is image c.raw's, so c's copy there fails
  // with the reason and c.raw's stays.
  ASSERT_TRUE(add("c.raw", bare, d2).ok());
  ASSERT_TRUE(add("c", x, d1).ok());
  auto synced = (*cat)->Sync("c", {d2}, SyncOptions{});
  ASSERT_TRUE(synced.ok()) << synced.error().ToString();
  auto c_rows = CopiesByDisk(**cat, "c");
  EXPECT_EQ(c_rows[d2].state, "failed");
  EXPECT_NE(c_rows[d2].message.find("image 'c.raw'"), std::string::npos) << c_rows[d2].message;
  EXPECT_EQ(CopiesByDisk(**cat, "c.raw")[d2].state, "ready");
  EXPECT_EQ(barge::testing::ReadFile(d2 + "/c.raw"), y_bytes);

  // A rescan gives each file back to its own image.
  ASSERT_TRUE((*cat)->Rescan({d1, d2}).ok());
  for (const auto& [name, disk, path] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"a", d1, d1 + "/a.raw"},
                                                                      {"a.raw", d1, d1 + "/a.raw.raw"},
                                                                      {"b", d1, d1 + "/b.raw"},
                                                                      {"c", d1, d1 + "/c.raw"},
                                                                      {"c.raw", d2, d2 + "/c.raw"}}) {
    auto rows = CopiesByDisk(**cat, name);
    EXPECT_EQ(rows[disk].path, path) << name;
    EXPECT_EQ(rows[disk].state, "ready") << name;
  }
  auto images = (*cat)->Images();
  ASSERT_TRUE(images.ok());
  EXPECT_EQ(images->size(), 5u);
}

}  // namespace
}  // namespace barge::orchestrate
