// Chains over a base: reference files, the catalog image marker, and
// relative folder paths.
#include "pipeline/base_refs.h"

#include <gtest/gtest.h>


namespace barge::pipeline {
namespace {

TEST(BaseRefTest, RoundTripAndRefusals) {
  BaseRef ref{"../clone1", "0123456789abcdef", "0000-20261127T063000Z"};
  auto back = DecodeBaseRef(EncodeBaseRef(ref));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->dependent, ref.dependent);
  EXPECT_EQ(back->chain_id, ref.chain_id);
  EXPECT_EQ(back->base_id, ref.base_id);
  for (const char* bad : {"", "[]", "{\"format\":\"barge-base-ref\",\"version\":2}",
                          R"({"format":"barge-base-ref","version":1,"dependent":"/etc","chain_id":"ab","base_id":"x"})",
                          R"({"format":"barge-base-ref","version":1,"dependent":"../a","chain_id":"../x","base_id":"x"})",
                          R"({"format":"barge-base-ref","version":1,"dependent":"../a","chain_id":"ab","base_id":".x"})"}) {
    auto r = DecodeBaseRef(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << bad;
  }
}

TEST(BaseRefTest, RelativeFolderPath) {
  EXPECT_EQ(RelativeFolderPath("/t/clone", "/t/golden"), "../golden");
  EXPECT_EQ(RelativeFolderPath("/t/p/d/vda", "/t/golden"), "../../../golden");
  EXPECT_EQ(RelativeFolderPath("/a/b/", "/a/b/c"), "c");
}

}  // namespace
}  // namespace barge::pipeline
