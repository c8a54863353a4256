// vm backup's tracker, settled before the run (SettleTracker).
#include "orchestrate/vm/vm_request.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

class SettleTrackerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    req_.catalog_path = dir_ / "catalog.db";
    auto c = BackupCatalog::Open(PosixEnv(), req_.catalog_path);
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    catalog_ = std::move(*c);
  }
  barge::testing::TempDir dir_;
  std::unique_ptr<BackupCatalog> catalog_;
  VmBackupRequest req_;
};

TEST_F(SettleTrackerTest, NoTrackerLeavesItOpen) {
  req_.domain = "vm1";
  auto r = SettleTracker(PosixEnv(), req_);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(*r, "");
  EXPECT_EQ(req_.tracker, "");
}

TEST_F(SettleTrackerTest, TheDomainsOnlyTracker) {
  ASSERT_TRUE(catalog_->CreateTracker("t1", "vm1").ok());
  ASSERT_TRUE(catalog_->CreateTracker("other", "vm2").ok());
  req_.domain = "vm1";
  auto r = SettleTracker(PosixEnv(), req_);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(*r, "");
  EXPECT_EQ(req_.tracker, "t1");
}

TEST_F(SettleTrackerTest, SeveralAndNoneNamedIsTheCallersChoice) {
  ASSERT_TRUE(catalog_->CreateTracker("a", "vm1").ok());
  ASSERT_TRUE(catalog_->CreateTracker("b", "vm1").ok());
  req_.domain = "vm1";
  auto r = SettleTracker(PosixEnv(), req_);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_NE(r->find("name one with --tracker"), std::string::npos) << *r;
  EXPECT_EQ(req_.tracker, "");
  req_.tracker = "b";
  r = SettleTracker(PosixEnv(), req_);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(*r, "");
  EXPECT_EQ(req_.tracker, "b");
}

TEST_F(SettleTrackerTest, AnotherDomainsTrackerIsRefused) {
  ASSERT_TRUE(catalog_->CreateTracker("t2", "vm2").ok());
  req_.domain = "vm1";
  req_.tracker = "t2";
  auto r = SettleTracker(PosixEnv(), req_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
  req_.tracker = "missing";
  r = SettleTracker(PosixEnv(), req_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace barge::orchestrate
