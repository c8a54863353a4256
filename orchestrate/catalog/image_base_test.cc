// `--base image:NAME` as the backup command gives it (ImageBaseName,
// UseImageBase with a missing catalog).
#include "orchestrate/catalog/image_base.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

TEST(ImageBaseTest, NameOfTheFlag) {
  auto chain = ImageBaseName("golden@0001");
  ASSERT_TRUE(chain.ok());
  EXPECT_FALSE(chain->has_value());  // a chain, not an image
  auto image = ImageBaseName("image:debian12");
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image->value(), "debian12");
  for (const char* bad : {"image:", "image:debian12@0001"}) {
    auto r = ImageBaseName(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

// An explicit --catalog must exist (ExistingCatalogPath): no new catalog
// is made for a base.
TEST(ImageBaseTest, AMissingCatalogIsNotFoundNamingIt) {
  barge::testing::TempDir dir;
  const std::string catalog = dir / "catalog.db";
  pipeline::BackupRequest req;
  auto r = UseImageBase(Env::Default(), catalog, "debian12", req);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::kNotFound);
  EXPECT_EQ(r.error().path(), catalog);
  EXPECT_TRUE(req.base.empty());
}

}  // namespace
}  // namespace barge::orchestrate
