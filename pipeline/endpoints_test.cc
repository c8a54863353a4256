// ApplyFolderRule: the one folder rule of images opened by path (the cli's
// OpenImageFile and OpenSource both use it).
#include "pipeline/endpoints.h"

#include <gtest/gtest.h>

#include "blockio/path.h"

namespace barge::pipeline {
namespace {

TEST(ApplyFolderRuleTest, ExtraFoldersAddToTheImagesOwnFolder) {
  formats::OpenOptions o;
  ApplyFolderRule(o, "/images/vm/disk.qcow2", false, {"/bases", "/more"});
  EXPECT_FALSE(o.allow_any_path);
  EXPECT_EQ(o.allowed_dirs, (std::vector<std::string>{"/bases", "/more", "/images/vm"}));

  // A relative path's folder is made absolute.
  formats::OpenOptions rel;
  ApplyFolderRule(rel, "disk.qcow2", false, {"/bases"});
  ASSERT_EQ(rel.allowed_dirs.size(), 2u);
  EXPECT_EQ(rel.allowed_dirs[1], DirName(AbsolutePath("disk.qcow2")));
}

TEST(ApplyFolderRuleTest, NoExtraFoldersOrAnyPathLeaveTheDefault) {
  formats::OpenOptions o;
  ApplyFolderRule(o, "/images/vm/disk.qcow2", false, {});
  EXPECT_FALSE(o.allow_any_path);
  EXPECT_TRUE(o.allowed_dirs.empty());  // formats' default: the image's folder

  formats::OpenOptions any;
  ApplyFolderRule(any, "/images/vm/disk.qcow2", true, {"/bases"});
  EXPECT_TRUE(any.allow_any_path);
  EXPECT_TRUE(any.allowed_dirs.empty());
}

}  // namespace
}  // namespace barge::pipeline
