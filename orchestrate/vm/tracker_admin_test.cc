// tracker create and delete against libvirt's test driver (test:///default,
// in process: one domain "test", no checkpoints), no libvirtd needed.
#include "orchestrate/vm/tracker_admin.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

constexpr const char* kTestDriver = "test:///default";

class TrackerAdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = BackupCatalog::Open(PosixEnv(), dir_ / "catalog.db");
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    catalog_ = std::move(*c);
  }
  barge::testing::TempDir dir_;
  std::unique_ptr<BackupCatalog> catalog_;
};

TEST_F(TrackerAdminTest, CreateOnlyForADomainLibvirtKnows) {
  Status missing = CreateTrackerForDomain(*catalog_, "t1", "no-such-domain", kTestDriver);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(catalog_->GetTracker("t1").ok());
  Status made = CreateTrackerForDomain(*catalog_, "t1", "test", kTestDriver);
  ASSERT_TRUE(made.ok()) << made.error().ToString();
  EXPECT_EQ(catalog_->GetTracker("t1")->domain, "test");
}

TEST_F(TrackerAdminTest, DeleteWithoutACheckpointNeedsNoLibvirt) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  auto r = DeleteTrackerAndCheckpoint(*catalog_, "t1", "bogus+unreachable:///x");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_FALSE(r->checkpoint_deleted);
  EXPECT_EQ(r->warning, "");
  EXPECT_FALSE(catalog_->GetTracker("t1").ok());
  auto again = DeleteTrackerAndCheckpoint(*catalog_, "t1", "");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::kNotFound);
}

TEST_F(TrackerAdminTest, ACheckpointLibvirtCannotDeleteIsAWarning) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "test").ok());
  BackupRecord rec;
  rec.domain = "test";
  rec.tracker = "t1";
  rec.type = "full";
  rec.checkpoint = "t1-a";
  rec.started_at = "2026-11-22T15:00:00Z";
  auto id = catalog_->BeginBackup(rec);
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  CheckpointRecord cp{"t1-a", "t1", "test", "2026-11-22T15:00:01Z", {"vda"}, "<domaincheckpoint/>", ""};
  ASSERT_TRUE(catalog_->CommitBackup(*id, rec, cp, {{"vda", 1}}).ok());
  // The test driver's domain has no checkpoint t1-a: libvirt refuses.
  auto r = DeleteTrackerAndCheckpoint(*catalog_, "t1", kTestDriver);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_FALSE(r->checkpoint_deleted);
  EXPECT_NE(r->warning.find("could not delete checkpoint t1-a"), std::string::npos) << r->warning;
  EXPECT_FALSE(catalog_->GetTracker("t1").ok());
}

}  // namespace
}  // namespace barge::orchestrate
