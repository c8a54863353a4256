// `catalog list`'s reading: no catalog is kNotFound and creates none; a
// domain filters the records.
#include "orchestrate/catalog/catalog_listing.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

TEST(CatalogListingTest, ReadsWithoutCreating) {
  barge::testing::TempDir dir;
  Env& env = PosixEnv();
  auto none = ReadCatalogListing(env, dir / "catalog.db", "");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(env.Exists(dir / "catalog.db"));

  {
    auto c = BackupCatalog::Open(env, dir / "catalog.db");
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    ASSERT_TRUE((*c)->CreateTracker("t1", "vm1").ok());
    ASSERT_TRUE((*c)->CreateTracker("t2", "vm2").ok());
  }
  auto all = ReadCatalogListing(env, dir / "catalog.db", "");
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  EXPECT_EQ(all->path, dir / "catalog.db");
  EXPECT_EQ(all->trackers.size(), 2u);
  EXPECT_TRUE(all->checkpoints.empty());
  EXPECT_TRUE(all->backups.empty());
  auto one = ReadCatalogListing(env, dir / "catalog.db", "vm2");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->trackers.size(), 1u);
  EXPECT_EQ(one->trackers[0].name, "t2");
}

}  // namespace
}  // namespace barge::orchestrate
