// The object identity encrypted chain objects are sealed under
// (blockio/crypt_env.h); the wrapper itself runs against radosgw in
// tests/s3_crypt_test.cc.
#include "blockio/crypt_env.h"

#include <gtest/gtest.h>

namespace barge {
namespace {

TEST(CryptEnvTest, IdentityIsTheFinalName) {
  auto id = [](std::string_view path) {
    auto r = EncryptedObjectIdentity(path);
    return r.ok() ? *r : "error: " + r.error().message();
  };
  EXPECT_EQ(id("s3://bkt/chains/vm1/1-full.qcow2"), "bkt/chains/vm1/1-full.qcow2");
  // The staged temporary and a merge's staged name seal under the final name.
  EXPECT_EQ(id("s3://bkt/chains/vm1/.1-full.qcow2.barge-tmp"), "bkt/chains/vm1/1-full.qcow2");
  EXPECT_EQ(id("s3://bkt/chains/vm1/.1-full.qcow2.merge-new"), "bkt/chains/vm1/1-full.qcow2");
  EXPECT_EQ(id("s3://bkt/chains/vm1/..1-full.qcow2.merge-new.barge-tmp"), "bkt/chains/vm1/1-full.qcow2");
  EXPECT_EQ(id("s3://bkt//chains/./vm1/x"), "bkt/chains/vm1/x");
  EXPECT_EQ(id("s3://bkt/top"), "bkt/top");
  EXPECT_TRUE(id("s3://bkt/../x").starts_with("error: "));
}

}  // namespace
}  // namespace barge
