// Backup catalog: trackers, checkpoints and records, and the rule that a
// tracker advances only together with a successful backup's record.
#include "orchestrate/catalog/backup_catalog.h"

#include <gtest/gtest.h>

#include "orchestrate/base/sqlite_db.h"
#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

class BackupCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = BackupCatalog::Open(PosixEnv(), dir_ / "sub/catalog.db");
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    catalog_ = std::move(*c);
  }
  BackupRecord Record(const std::string& checkpoint) {
    BackupRecord r;
    r.domain = "vm1";
    r.tracker = "t1";
    r.type = "full";
    r.reason = "tracker empty";
    r.checkpoint = checkpoint;
    r.target = "/backups";
    r.started_at = "2026-11-22T15:00:00Z";
    r.disks.push_back({"vda", "full", "tracker empty", "/backups/vm1/vda", "/backups/vm1/vda/x.qcow2",
                       "/backups/vm1/vda/x.json", 1 << 20, 4096, 1024});
    return r;
  }
  barge::testing::TempDir dir_;
  std::unique_ptr<BackupCatalog> catalog_;
};

TEST_F(BackupCatalogTest, TrackerLifecycle) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  EXPECT_FALSE(catalog_->CreateTracker("t1", "vm1").ok());
  EXPECT_FALSE(catalog_->CreateTracker("bad name", "vm1").ok());
  auto t = catalog_->GetTracker("t1");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->domain, "vm1");
  EXPECT_TRUE(t->latest_checkpoint.empty());
  EXPECT_EQ(catalog_->ListTrackers("vm1")->size(), 1u);
  EXPECT_EQ(catalog_->ListTrackers("vm2")->size(), 0u);
  ASSERT_TRUE(catalog_->DeleteTracker("t1").ok());
  EXPECT_EQ(catalog_->GetTracker("t1").error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(catalog_->DeleteTracker("t1").error().code(), ErrorCode::kNotFound);
}

TEST_F(BackupCatalogTest, TrackerAdvancesOnlyWithSuccessfulRecord) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  auto id = catalog_->BeginBackup(Record("t1-a"));
  ASSERT_TRUE(id.ok());
  BackupRecord failed = Record("t1-a");
  failed.error = "disk vda: boom";
  ASSERT_TRUE(catalog_->FailBackup(*id, failed).ok());
  EXPECT_TRUE(catalog_->GetTracker("t1")->latest_checkpoint.empty());
  EXPECT_EQ(catalog_->GetBackup(*id)->result, "failed");
  EXPECT_EQ(catalog_->GetBackup(*id)->error, "disk vda: boom");

  auto id2 = catalog_->BeginBackup(Record("t1-b"));
  ASSERT_TRUE(id2.ok());
  CheckpointRecord cp{"t1-b", "t1", "vm1", "2026-11-22T15:00:01Z", {"vda"}, "<domaincheckpoint/>", ""};
  ASSERT_TRUE(catalog_->CommitBackup(*id2, Record("t1-b"), cp, {{"vda", 1 << 20}}).ok());
  auto t = catalog_->GetTracker("t1");
  EXPECT_EQ(t->latest_checkpoint, "t1-b");
  EXPECT_EQ(t->disks.at("vda"), 1u << 20);
  EXPECT_EQ(catalog_->GetCheckpoint("t1-b")->xml, "<domaincheckpoint/>");
  auto rec = catalog_->GetBackup(*id2);
  EXPECT_EQ(rec->result, "success");
  ASSERT_EQ(rec->disks.size(), 1u);
  EXPECT_EQ(rec->disks[0].bytes_read, 4096u);

  // A commit whose tracker vanished rolls back: the record stays "running".
  ASSERT_TRUE(catalog_->DeleteTracker("t1").ok());
  auto id3 = catalog_->BeginBackup(Record("t1-c"));
  CheckpointRecord cp3{"t1-c", "t1", "vm1", "", {"vda"}, "<x/>", ""};
  EXPECT_FALSE(catalog_->CommitBackup(*id3, Record("t1-c"), cp3, {}).ok());
  EXPECT_EQ(catalog_->GetBackup(*id3)->result, "running");
}

TEST_F(BackupCatalogTest, MarkNeedsFullDropsCheckpoint) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  auto id = catalog_->BeginBackup(Record("t1-a"));
  CheckpointRecord cp{"t1-a", "t1", "vm1", "", {"vda"}, "<x/>", ""};
  ASSERT_TRUE(catalog_->CommitBackup(*id, Record("t1-a"), cp, {{"vda", 1}}).ok());
  ASSERT_TRUE(catalog_->MarkNeedsFull("t1", "bitmap inconsistent").ok());
  auto t = catalog_->GetTracker("t1");
  EXPECT_TRUE(t->needs_full);
  EXPECT_EQ(t->needs_full_reason, "bitmap inconsistent");
  EXPECT_TRUE(t->latest_checkpoint.empty());
  EXPECT_EQ(catalog_->GetCheckpoint("t1-a").error().code(), ErrorCode::kNotFound);
}

TEST_F(BackupCatalogTest, ListCheckpointsByDomainOldestFirst) {
  EXPECT_TRUE(catalog_->ListCheckpoints()->empty());
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  ASSERT_TRUE(catalog_->CreateTracker("t2", "vm2").ok());
  auto a = catalog_->BeginBackup(Record("t2-x"));
  BackupRecord r2 = Record("t2-x");
  r2.domain = "vm2";
  r2.tracker = "t2";
  CheckpointRecord later{"t2-x", "t2", "vm2", "2026-11-23T00:00:00Z", {"vda", "vdb"}, "<x/>", ""};
  ASSERT_TRUE(catalog_->CommitBackup(*a, r2, later, {{"vda", 1}, {"vdb", 2}}).ok());
  auto b = catalog_->BeginBackup(Record("t1-a"));
  CheckpointRecord earlier{"t1-a", "t1", "vm1", "2026-11-22T00:00:00Z", {"vda"}, "<y/>", ""};
  ASSERT_TRUE(catalog_->CommitBackup(*b, Record("t1-a"), earlier, {{"vda", 1}}).ok());
  auto all = catalog_->ListCheckpoints();
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "t1-a");
  EXPECT_EQ((*all)[1].name, "t2-x");
  EXPECT_EQ((*all)[1].disks, (std::vector<std::string>{"vda", "vdb"}));
  auto vm2 = catalog_->ListCheckpoints("vm2");
  ASSERT_TRUE(vm2.ok());
  ASSERT_EQ(vm2->size(), 1u);
  EXPECT_EQ((*vm2)[0].tracker, "t2");
}

TEST_F(BackupCatalogTest, ReopenKeepsData) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  catalog_.reset();
  auto c = BackupCatalog::Open(PosixEnv(), dir_ / "sub/catalog.db");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->GetTracker("t1").ok());
}

// The tracker records where its checkpoint lives; a catalog from before
// hosts were recorded gains the column, empty (this machine).
TEST_F(BackupCatalogTest, TrackerRecordsTheCheckpointsHost) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  EXPECT_EQ(catalog_->GetTracker("t1")->host, "");
  auto id = catalog_->BeginBackup(Record("t1-a"));
  ASSERT_TRUE(id.ok());
  CheckpointRecord cp{"t1-a", "t1", "vm1", "2026-11-22T15:00:01Z", {"vda"}, "<domaincheckpoint/>",
                      "qemu+ssh://root@hv1/system"};
  ASSERT_TRUE(catalog_->CommitBackup(*id, Record("t1-a"), cp, {{"vda", 1}}).ok());
  EXPECT_EQ(catalog_->GetTracker("t1")->host, "qemu+ssh://root@hv1/system");

  const std::string old_path = dir_ / "old.db";
  {
    auto db = SqliteDb::Open(PosixEnv(), old_path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Exec("CREATE TABLE vm_trackers (name TEXT PRIMARY KEY, domain TEXT NOT NULL, "
                            "created_at TEXT NOT NULL, latest_checkpoint TEXT NOT NULL DEFAULT '', "
                            "checkpoint_created_at TEXT NOT NULL DEFAULT '', disks TEXT NOT NULL DEFAULT '{}', "
                            "needs_full INTEGER NOT NULL DEFAULT 0, needs_full_reason TEXT NOT NULL DEFAULT '');"
                            "INSERT INTO vm_trackers(name, domain, created_at) VALUES('old', 'vm1', "
                            "'2026-11-01T00:00:00Z');")
                    .ok());
  }
  for (int open = 0; open < 2; ++open) {  // the second open finds the column there
    auto old = BackupCatalog::Open(PosixEnv(), old_path);
    ASSERT_TRUE(old.ok()) << old.error().ToString();
    auto t = (*old)->GetTracker("old");
    ASSERT_TRUE(t.ok()) << t.error().ToString();
    EXPECT_EQ(t->host, "");
  }
}

}  // namespace
}  // namespace barge::orchestrate
