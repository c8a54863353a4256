// The image catalog's status and the errors of copies that are not ready:
// a full disk is NoSpace (scripts tell it from a broken copy), the first
// copy not ready names a sync's error.
#include "orchestrate/catalog/image_catalog_report.h"

#include <gtest/gtest.h>

#include "tests/testing/testing.h"

namespace barge::orchestrate {
namespace {

ImageCopyRecord Copy(const std::string& disk, const std::string& state, const std::string& message = "") {
  ImageCopyRecord c;
  c.image = "base";
  c.disk = disk;
  c.path = disk + "/base.qcow2";
  c.state = state;
  c.message = message;
  return c;
}

TEST(ImageCatalogReportTest, StatusOfAMissingImageIsNotFound) {
  barge::testing::TempDir dir;
  auto cat = ImageCatalog::Open(PosixEnv(), dir / "images.db");
  ASSERT_TRUE(cat.ok()) << cat.error().ToString();
  auto all = ReadImageCatalogStatus(**cat, "");
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  EXPECT_TRUE(all->images.empty());
  EXPECT_EQ(ImageStatusText(*all), "");
  auto none = ReadImageCatalogStatus(**cat, "base");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), ErrorCode::kNotFound);
}

TEST(ImageCatalogReportTest, AFullDiskIsNoSpace) {
  const auto full = Copy("/d1", "failed", std::string(ErrorCodeName(ErrorCode::kNoSpace)) + ": disk full");
  auto e = AddFailure(full);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), ErrorCode::kNoSpace);
  EXPECT_TRUE(e->ToString().find("/d1/base.qcow2") != std::string::npos) << e->ToString();
  EXPECT_EQ(CopyError(Copy("/d2", "failed", "read error"), "x").code(), ErrorCode::kIoError);
  EXPECT_FALSE(AddFailure(Copy("/d1", "ready")).has_value());
}

TEST(ImageCatalogReportTest, SyncFailureCountsAndNamesTheFirst) {
  SyncResult r;
  r.copies = {Copy("/d1", "ready"), Copy("/d2", "failed", "read error"), Copy("/d3", "pending")};
  auto e = SyncFailure(r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->message(), "2 of 3 copies are not ready (see the result for each); the first is failed: read error");
  EXPECT_TRUE(e->ToString().find("/d2/base.qcow2") != std::string::npos) << e->ToString();
  r.copies.resize(1);
  EXPECT_FALSE(SyncFailure(r).has_value());
}

TEST(ImageCatalogReportTest, Texts) {
  auto moving = Copy("/d1", "in-progress");
  moving.percent = 42.7;
  EXPECT_EQ(CopyLine(moving), "base  /d1  in-progress 42%\n");
  moving.bytes_done = 1 << 20;
  moving.bytes_total = 12 << 20;
  EXPECT_EQ(CopyLine(moving), "base  /d1  in-progress 42% (1 MiB of 12 MiB)\n");
  SyncResult r;
  r.copies = {Copy("/d2", "failed", "read error")};
  SenderRecord s;
  s.sender = "/d0/base.qcow2";
  s.sends = 2;
  s.max_concurrent = 1;
  r.senders = {s};
  EXPECT_EQ(SyncText("base", r), "base  /d2  failed: read error\nsender /d0/base.qcow2: 2 send(s), at most 1 at once\n");
  r.downloaded_from = "https://images.example/base.qcow2";
  EXPECT_TRUE(SyncText("base", r).starts_with(
      "no ready copy was left: downloaded base again from its origin https://images.example/base.qcow2\nbase  /d2"));
  CleanupResult c;
  c.removed = {"/d1/base.qcow2"};
  c.busy = {"/d2/base.qcow2"};
  c.dry_run = true;
  EXPECT_EQ(CleanupText(c), "would remove /d1/base.qcow2\nbusy    /d2/base.qcow2  (an add or sync of its image is "
                            "running)\n");
}

}  // namespace
}  // namespace barge::orchestrate
