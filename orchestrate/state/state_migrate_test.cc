// MigrateState through a test's Env: a crash (the Env stops, as a killed
// process would) after every durability boundary of a migration, each
// followed by a re-run that must end with the new folder complete and
// current and the old one gone; and a failing copy that must roll back.
#include "orchestrate/state/state_migrate.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/vm/cbt.h"
#include "orchestrate/libvirt/libvirt_conn.h"
#include "orchestrate/base/sqlite_db.h"
#include "tests/testing/env_wrappers.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// Relative path -> what it is: a file's bytes, a link's target, or a folder,
// with its permission bits. Journal and marker excluded.
std::map<std::string, std::string> Snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    std::string rel = it->path().lexically_relative(dir).string();
    if (rel == kMigrateJournalName || rel == kStateMarkerName) continue;
    struct stat st;
    EXPECT_EQ(::lstat(it->path().c_str(), &st), 0);
    std::string mode = " mode " + std::to_string(st.st_mode & 07777);
    if (it->is_symlink()) {
      out[rel] = "link " + fs::read_symlink(it->path()).string();
    } else if (it->is_directory()) {
      out[rel] = "dir" + mode;
    } else {
      auto bytes = testing::ReadFile(it->path().string());
      out[rel] = std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()) + mode;
    }
  }
  return out;
}

class StateMigrateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    from_ = dir_.path() / "old/state";
    to_ = dir_.path() / "new/state";
    fs::create_directories(from_ / "tpm2");
    fs::create_directories(from_ / "efi/deep");
    fs::create_directories(dir_.path() / "new");
    testing::WriteFile((from_ / "tpm2/permall").string(), testing::RandomBytes(10000, 1));
    fs::permissions(from_ / "tpm2/permall", fs::perms::owner_read | fs::perms::owner_write);
    fs::permissions(from_ / "tpm2", fs::perms::owner_all);
    auto vars = testing::RandomBytes(3 << 20, 2);
    std::fill(vars.begin() + (1 << 20), vars.begin() + (2 << 20), std::byte{0});  // a hole in the copy
    testing::WriteFile((from_ / "efi/VARS.fd").string(), vars);
    testing::WriteFile((from_ / "efi/deep/empty").string(), {});
    fs::create_symlink("../tpm2/permall", from_ / "efi/link");
    before_ = Snapshot(from_);
  }

  Result<StateMigrateResult> Migrate(Env& env) { return MigrateState(env, from_.string(), to_.string()); }

  void ExpectFinished() {
    EXPECT_FALSE(fs::exists(from_));
    EXPECT_EQ(Snapshot(to_), before_);
    EXPECT_TRUE(fs::exists(to_ / kStateMarkerName));
    for (const auto& e : fs::directory_iterator(to_)) {
      EXPECT_FALSE(e.path().filename().string().ends_with(".barge-tmp")) << e.path();
    }
  }

  TempDir dir_;
  fs::path from_, to_;
  std::map<std::string, std::string> before_;
};

TEST_F(StateMigrateTest, MovesFilesLinksFoldersAndModes) {
  auto r = Migrate(PosixEnv());
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->outcome, "migrated");
  EXPECT_EQ(r->recovery, "");
  EXPECT_EQ(r->files.size(), before_.size());
  ExpectFinished();
  auto again = Migrate(PosixEnv());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, "already-migrated");
}

// A crash after each boundary in turn (journal appends, file syncs, folder
// syncs, renames, removals): never are both copies lost, and the re-run
// finishes from whichever side was current.
TEST_F(StateMigrateTest, CrashAtEveryBoundaryThenRerun) {
  const fs::path pristine = dir_.path() / "pristine";
  fs::copy(from_, pristine, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  int rolled_back = 0, finished = 0;
  for (uint64_t k = 1;; ++k) {
    SCOPED_TRACE("crash after boundary " + std::to_string(k));
    fs::remove_all(dir_.path() / "old");
    fs::remove_all(to_);
    fs::create_directories(from_.parent_path());
    fs::copy(pristine, from_, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    fs::permissions(from_, fs::status(pristine).permissions());
    testing::StopEnv env(PosixEnv());
    env.StopAfter(k);
    auto r = Migrate(env);
    if (r.ok()) {
      EXPECT_FALSE(env.stopped());
      ExpectFinished();
      break;
    }
    ASSERT_TRUE(env.stopped()) << r.error().ToString();
    const bool current = fs::exists(to_ / kStateMarkerName);
    if (current) {
      EXPECT_EQ(Snapshot(to_), before_);  // the old one may be partly removed
    } else {
      EXPECT_EQ(Snapshot(from_), before_);
    }
    auto again = Migrate(PosixEnv());
    ASSERT_TRUE(again.ok()) << again.error().ToString();
    if (again->outcome == "already-migrated") {
      ++finished;  // the crash came after the last step was durable
    } else {
      EXPECT_EQ(again->outcome, "migrated");
      EXPECT_TRUE(again->recovery.empty() || again->recovery == "rolled back" || again->recovery == "finished");
      rolled_back += again->recovery == "rolled back";
      finished += again->recovery == "finished";
    }
    ExpectFinished();
  }
  // Both sides of the commit point were hit many times.
  EXPECT_GT(rolled_back, 5);
  EXPECT_GT(finished, 2);
}

// What the domains and the catalog name (the repoint's stand-in): switched
// inside the journaled step, so that after any crash and the re-run it names
// the new folder, and whenever the new folder is current it names it.
TEST_F(StateMigrateTest, RepointFollowsTheCommitPointAcrossCrashes) {
  const fs::path pristine = dir_.path() / "pristine";
  fs::copy(from_, pristine, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  for (uint64_t k = 1;; ++k) {
    SCOPED_TRACE("crash after boundary " + std::to_string(k));
    fs::remove_all(dir_.path() / "old");
    fs::remove_all(to_);
    fs::create_directories(from_.parent_path());
    fs::copy(pristine, from_, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    std::string pointed = from_.string();
    MigrateRepoint repoint = [&pointed](const std::string& old_dir, const std::string& new_dir) -> Status {
      if (pointed == old_dir) pointed = new_dir;
      return OkStatus();
    };
    testing::StopEnv env(PosixEnv());
    env.StopAfter(k);
    auto r = MigrateState(env, from_.string(), to_.string(), {.repoint = repoint});
    if (r.ok()) {
      EXPECT_EQ(pointed, to_.string());
      ExpectFinished();
      break;
    }
    ASSERT_TRUE(env.stopped()) << r.error().ToString();
    if (fs::exists(to_ / kStateMarkerName)) {
      EXPECT_EQ(pointed, to_.string());
    }
    auto again = MigrateState(PosixEnv(), from_.string(), to_.string(), {.repoint = repoint});
    ASSERT_TRUE(again.ok()) << again.error().ToString();
    EXPECT_EQ(pointed, to_.string());
    ExpectFinished();
  }
}

// A repoint that fails (a domain started meanwhile): the migration rolls
// back, the repoint is undone, the old folder stays current.
TEST_F(StateMigrateTest, FailedRepointRollsBack) {
  std::vector<std::pair<std::string, std::string>> calls;
  MigrateRepoint repoint = [&calls](const std::string& old_dir, const std::string& new_dir) -> Status {
    calls.emplace_back(old_dir, new_dir);
    if (calls.size() == 1) return Error::Busy("domain 'd' was started during the migration");
    return OkStatus();
  };
  auto r = MigrateState(PosixEnv(), from_.string(), to_.string(), {.repoint = repoint});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kBusy) << r.error().ToString();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], std::make_pair(from_.string(), to_.string()));
  EXPECT_EQ(calls[1], std::make_pair(to_.string(), from_.string()));
  EXPECT_EQ(Snapshot(from_), before_);
  EXPECT_FALSE(fs::exists(to_));
}

TEST(ReplacePathPrefixTest, WholeValuesAndPrefixesOnly) {
  const std::string xml =
      "<disk><source file='/s/vm'/><source file=\"/s/vm/vda.qcow2\"/><nvram>/s/vm/VARS.fd</nvram>"
      "<x a='/s/vm2/y'/><x a='/s/vmx'/><x a='p/s/vm/z'/></disk>";
  EXPECT_EQ(ReplacePathPrefix(xml, "/s/vm", "/t/new", true),
            "<disk><source file='/t/new'/><source file=\"/t/new/vda.qcow2\"/><nvram>/t/new/VARS.fd</nvram>"
            "<x a='/s/vm2/y'/><x a='/s/vmx'/><x a='p/s/vm/z'/></disk>");
  EXPECT_EQ(ReplacePathPrefix("<a f='/s/a&amp;b/c'/>", "/s/a&b", "/t/n", true), "<a f='/t/n/c'/>");
  EXPECT_EQ(ReplacePathPrefix(R"([{"overlay":"/s/vm/vda.qcow2","data_file":"/d/x.raw"}])", "/s/vm", "/t", false),
            R"([{"overlay":"/t/vda.qcow2","data_file":"/d/x.raw"}])");
}

TEST(ReplacePathPrefixTest, MovePathWholeValuesOnly) {
  EXPECT_EQ(MovePath("/s/vm", "/s/vm", "/t"), "/t");
  EXPECT_EQ(MovePath("/s/vm/a/b", "/s/vm", "/t"), "/t/a/b");
  EXPECT_EQ(MovePath("/s/vm2", "/s/vm", "/t"), "/s/vm2");
  EXPECT_EQ(MovePath("/x/s/vm", "/s/vm", "/t"), "/x/s/vm");
  EXPECT_TRUE(NamesPathInside("<a f='/s/vm/x'/>", "/s/vm", true));
  EXPECT_FALSE(NamesPathInside("<a f='/s/vm2/x'/>", "/s/vm", true));
}

// The catalog's side of a repoint: the CBT record (state folder, overlays,
// raw disks and the pre-enable XML that cbt disable goes back to) and the
// stored checkpoint XML name the new place; paths elsewhere stay, and so
// does the record of a domain on another host (its paths are that host's).
TEST(RepointCatalogTest, CbtRecordAndCheckpointXmlFollowTheFolder) {
  testing::TempDir dir;
  auto catalog = BackupCatalog::Open(PosixEnv(), (dir.path() / "catalog.db").string());
  ASSERT_TRUE(catalog.ok()) << catalog.error().ToString();
  BackupCatalog& c = **catalog;
  ASSERT_TRUE(RepointCbtPaths(c, {"/old"}, "/new").ok());  // nothing to repoint yet
  ASSERT_TRUE(c.CreateTracker("t", "d").ok());
  ASSERT_TRUE(c.db()
                  .Exec("INSERT INTO vm_cbt(domain, state_dir, original_xml, disks, enabled_at) "
                        "VALUES('d', '/old/cbt', "
                        "'<domain><source file=\"/old/disk.raw\"/><source file=\"/else/x.raw\"/></domain>', "
                        "'[{\"disk\":\"vda\",\"data_file\":\"/old/disk.raw\",\"overlay\":\"/state/vda.qcow2\"}]', "
                        "'now');"
                        "INSERT INTO vm_cbt(domain, state_dir, original_xml, disks, enabled_at, host) VALUES('r', '', "
                        "'<domain/>', "
                        "'[{\"disk\":\"vda\",\"data_file\":\"/old/r.raw\",\"overlay\":\"/old/r.raw.cbt.qcow2\"}]', "
                        "'now', 'qemu+ssh://h/system');"
                        "INSERT INTO vm_checkpoints VALUES('c1', 't', 'd', 'now', '[]', "
                        "'<domaincheckpoint><source file=\"/old/disk.raw\"/></domaincheckpoint>');")
                  .ok());
  for (int round = 0; round < 2; ++round) {  // idempotent
    auto txn = SqliteTransaction::Begin(c.db());
    ASSERT_TRUE(txn.ok());
    ASSERT_TRUE(RepointCbtPaths(c, {"/elsewhere", "/old"}, "/new").ok());
    ASSERT_TRUE(c.RepointPaths({"/elsewhere", "/old"}, "/new").ok());
    ASSERT_TRUE((*txn)->Commit().ok());
  }
  auto disks = CbtDisksOf(c, "d");
  ASSERT_TRUE(disks.ok() && disks->has_value());
  ASSERT_EQ((*disks)->size(), 1u);
  EXPECT_EQ((**disks)[0].data_file, "/new/disk.raw");
  EXPECT_EQ((**disks)[0].overlay, "/state/vda.qcow2");
  auto st = c.db().Prepare("SELECT state_dir, original_xml FROM vm_cbt WHERE domain='d'");
  ASSERT_TRUE(st.ok());
  ASSERT_TRUE(*st->Step());
  EXPECT_EQ(st->Text(0), "/new/cbt");
  EXPECT_EQ(st->Text(1), "<domain><source file=\"/new/disk.raw\"/><source file=\"/else/x.raw\"/></domain>");
  auto cp = c.GetCheckpoint("c1");
  ASSERT_TRUE(cp.ok());
  EXPECT_EQ(cp->xml, "<domaincheckpoint><source file=\"/new/disk.raw\"/></domaincheckpoint>");
  auto remote = CbtDisksOf(c, "r");
  ASSERT_TRUE(remote.ok() && remote->has_value());
  EXPECT_EQ((**remote)[0].data_file, "/old/r.raw");
}

// A catalog whose vm_cbt was made before remote CBT (no host column) gains
// the column when it is opened, before any CBT row is read; its rows are
// this machine's.
TEST(CbtCatalogTest, OlderTableGainsTheHostColumnOnOpen) {
  testing::TempDir dir;
  const std::string path = (dir.path() / "catalog.db").string();
  {
    auto old = SqliteDb::Open(PosixEnv(), path);
    ASSERT_TRUE(old.ok()) << old.error().ToString();
    ASSERT_TRUE((*old)
                    ->Exec("CREATE TABLE vm_cbt (domain TEXT PRIMARY KEY, state_dir TEXT NOT NULL, "
                           "original_xml TEXT NOT NULL, disks TEXT NOT NULL, enabled_at TEXT NOT NULL);"
                           "INSERT INTO vm_cbt VALUES('d', '/s', '<domain/>', "
                           "'[{\"disk\":\"vda\",\"data_file\":\"/d.raw\",\"overlay\":\"/s/vda.qcow2\"}]', "
                           "'now');")
                    .ok());
  }
  for (int round = 0; round < 2; ++round) {  // a second open finds the column there
    auto catalog = BackupCatalog::Open(PosixEnv(), path);
    ASSERT_TRUE(catalog.ok()) << catalog.error().ToString();
    BackupCatalog& c = **catalog;
    {
      auto st = c.db().Prepare("SELECT host FROM vm_cbt WHERE domain='d'");
      ASSERT_TRUE(st.ok()) << st.error().ToString();
      ASSERT_TRUE(*st->Step());
      EXPECT_EQ(st->Text(0), "");
    }
    auto disks = CbtDisksOf(c, "d");
    ASSERT_TRUE(disks.ok()) << disks.error().ToString();
    ASSERT_TRUE(disks->has_value());
    EXPECT_EQ((**disks)[0].overlay, "/s/vda.qcow2");
  }
}

TEST_F(StateMigrateTest, FailedCopyRollsBackAndKeepsTheOld) {
  testing::FaultFilesEnv env(PosixEnv(), [](const std::string& path, FaultInjector& faults) {
    if (path.ends_with("VARS.fd")) faults.AddRule(FaultRule::Nth(FaultOp::kWrite, 2, ENOSPC));
  });
  auto r = Migrate(env);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNoSpace) << r.error().ToString();
  EXPECT_NE(r.error().message().find("stays current"), std::string::npos) << r.error().ToString();
  EXPECT_FALSE(fs::exists(to_));
  EXPECT_EQ(Snapshot(from_), before_);
  auto again = Migrate(PosixEnv());
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  ExpectFinished();
}

TEST_F(StateMigrateTest, RefusesNestedFoldersAndANonEmptyTarget) {
  EXPECT_EQ(MigrateState(PosixEnv(), from_.string(), (from_ / "sub").string()).error().code(),
            ErrorCode::kInvalidArgument);
  fs::create_directories(to_);
  testing::WriteFile((to_ / "stray").string(), testing::RandomBytes(10, 3));
  EXPECT_EQ(Migrate(PosixEnv()).error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(Snapshot(from_), before_);
}

}  // namespace
}  // namespace barge::orchestrate
