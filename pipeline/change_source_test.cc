// The backup command's choice of change source (ApplyChangeSource).
#include "pipeline/change_source.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

TEST(ChangeSourceTest, RecordIncrementals) {
  BackupRequest req;
  ASSERT_TRUE(ApplyChangeSource({.incremental = true, .dirty_bitmap = "b1"}, req).ok());
  EXPECT_TRUE(req.incremental);
  EXPECT_EQ(req.changed_by, ChangedBy::kRecord);
  EXPECT_EQ(req.dirty_bitmap, "b1");
  EXPECT_EQ(ChangeRecordText(req), "bitmap 'b1'");
  EXPECT_EQ(ChangeRecordField(req), "bitmap:b1");

  BackupRequest ext;
  ASSERT_TRUE(ApplyChangeSource({.incremental = true, .changed_by = "bitmap+digests", .dirty_extents = "e.json"}, ext).ok());
  EXPECT_EQ(ext.changed_by, ChangedBy::kRecordAndDigests);
  EXPECT_EQ(ext.dirty_extents_file, "e.json");
  EXPECT_EQ(ChangeRecordText(ext), "the extents file");
  EXPECT_EQ(ChangeRecordField(ext), "extents:e.json");
}

TEST(ChangeSourceTest, DigestsNeedNoRecord) {
  BackupRequest inc;
  ASSERT_TRUE(ApplyChangeSource({.incremental = true, .changed_by = "digests"}, inc).ok());
  EXPECT_EQ(inc.changed_by, ChangedBy::kDigests);
  BackupRequest full;  // a full by digests keeps its table for the next one
  ASSERT_TRUE(ApplyChangeSource({.changed_by = "digests", .cluster_size_given = true}, full).ok());
  EXPECT_EQ(full.changed_by, ChangedBy::kDigests);
  EXPECT_FALSE(full.incremental);
  BackupRequest plain;
  ASSERT_TRUE(ApplyChangeSource({}, plain).ok());
  EXPECT_EQ(plain.changed_by, ChangedBy::kRecord);
}

TEST(ChangeSourceTest, RefusalsNameTheFlags) {
  struct Case {
    ChangeSourceFlags flags;
    const char* says;
  };
  const Case cases[] = {
      {{.changed_by = "digests", .dirty_bitmap = "b"}, "--changed-by digests reads no bitmap or extents file"},
      {{.changed_by = "bitmap+digests", .dirty_bitmap = "b"}, "--changed-by bitmap+digests needs --incremental"},
      {{.incremental = true}, "--incremental needs exactly one of --dirty-bitmap or --dirty-extents"},
      {{.incremental = true, .dirty_bitmap = "b", .dirty_extents = "e"}, "--incremental needs exactly one of"},
      {{.incremental = true, .dirty_bitmap = "b", .cluster_size_given = true},
       "--cluster-size does not apply to an incremental"},
  };
  for (const auto& c : cases) {
    BackupRequest req;
    Status s = ApplyChangeSource(c.flags, req);
    ASSERT_FALSE(s.ok()) << c.says;
    EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message().find(c.says), std::string::npos) << s.error().message();
  }
}

}  // namespace
}  // namespace barge::pipeline
