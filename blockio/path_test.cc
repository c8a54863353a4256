// Lexical path helpers: dirname/basename forms, joining, normalizing and
// the component-wise "inside" test.
#include "blockio/path.h"

#include <gtest/gtest.h>

namespace barge {
namespace {

TEST(PathTest, DirAndBaseNames) {
  EXPECT_EQ(DirName("a/b"), "a");
  EXPECT_EQ(DirName("a/b/"), "a");
  EXPECT_EQ(DirName("/b"), "/");
  EXPECT_EQ(DirName("b"), ".");
  EXPECT_EQ(DirName(""), ".");
  EXPECT_EQ(DirName("/a//b"), "/a");
  EXPECT_EQ(BaseName("a/b"), "b");
  EXPECT_EQ(BaseName("a/b/"), "b");
  EXPECT_EQ(BaseName("/"), "/");
  EXPECT_EQ(BaseName("b"), "b");
  EXPECT_EQ(Extension("d/0001-x.qcow2"), ".qcow2");
  EXPECT_EQ(Extension("d/.lock"), "");
  EXPECT_EQ(Extension("a.b/c"), "");
  EXPECT_EQ(Extension(".x.json.barge-tmp"), ".barge-tmp");
}

TEST(PathTest, JoinAndNormalize) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("a", "/b"), "/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(LexicallyNormal("/a/./b/../c//d/"), "/a/c/d");
  EXPECT_EQ(LexicallyNormal("/.."), "/");
  EXPECT_EQ(LexicallyNormal("../a/../../b"), "../../b");
  EXPECT_EQ(LexicallyNormal("a/.."), ".");
  EXPECT_EQ(LexicallyNormal(""), "");
  EXPECT_TRUE(IsAbsolutePath("/x"));
  EXPECT_FALSE(IsAbsolutePath("x"));
  EXPECT_TRUE(IsAbsolutePath(AbsolutePath("x/../y")));
  EXPECT_EQ(BaseName(AbsolutePath("x/../y")), "y");
}

TEST(PathTest, InsideComparesWholeComponents) {
  EXPECT_TRUE(IsInsidePath("/a/b/c", "/a/b"));
  EXPECT_TRUE(IsInsidePath("/a/b", "/a/b/"));
  EXPECT_TRUE(IsInsidePath("/a/b/../b/c", "/a/b"));
  EXPECT_FALSE(IsInsidePath("/a/bc", "/a/b"));
  EXPECT_FALSE(IsInsidePath("/a/b/../c", "/a/b"));
  EXPECT_TRUE(IsInsidePath("/anything", "/"));
  EXPECT_FALSE(IsInsidePath("relative", "/"));
}


// A chain in a bucket (blockio/bucket_env.h): s3:// paths keep their "//",
// are never taken from the working directory, and their root is the bucket.
TEST(PathTest, S3LocationsKeepTheirScheme) {
  EXPECT_TRUE(IsAbsolutePath("s3://b/x"));
  EXPECT_EQ(LexicallyNormal("s3://bucket/chains//vm1/./"), "s3://bucket/chains/vm1");
  EXPECT_EQ(LexicallyNormal("s3://bucket/"), "s3://bucket");
  EXPECT_EQ(AbsolutePath("s3://bucket/chains"), "s3://bucket/chains");
  EXPECT_EQ(DirName("s3://bucket/chains/vm1"), "s3://bucket/chains");
  EXPECT_EQ(DirName("s3://bucket/chains"), "s3://bucket");
  EXPECT_EQ(DirName("s3://bucket"), "s3://bucket");
  EXPECT_EQ(BaseName("s3://bucket/chains/vm1/"), "vm1");
  EXPECT_EQ(JoinPath("s3://bucket/chains", "vm1"), "s3://bucket/chains/vm1");
  EXPECT_EQ(JoinPath("/local", "s3://bucket/x"), "s3://bucket/x");
  EXPECT_TRUE(IsInsidePath("s3://bucket/chains/vm1", "s3://bucket/chains"));
  EXPECT_FALSE(IsInsidePath("s3://bucket2/chains", "s3://bucket"));
}

}  // namespace
}  // namespace barge
