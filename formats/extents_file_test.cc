#include "formats/extents_file.h"

#include <gtest/gtest.h>

namespace barge::formats {
namespace {

TEST(ExtentsFileTest, ObjectAndArrayForms) {
  auto a = DecodeExtentsFile(R"({"format":"barge-extents","version":1,"virtual_size":1048576,
      "extents":[{"offset":65536,"length":4096},{"offset":0,"length":512},{"offset":4096,"length":4096,"dirty":false}]})");
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(*a->virtual_size, 1048576u);
  EXPECT_EQ(a->dirty, (RangeList{{0, 512}, {65536, 4096}}));
  auto b = DecodeExtentsFile(R"([{"offset":10,"length":10},{"offset":15,"length":10}])");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dirty, (RangeList{{10, 15}}));
}

TEST(ExtentsFileTest, RejectsBadInput) {
  EXPECT_FALSE(DecodeExtentsFile("{").ok());
  EXPECT_FALSE(DecodeExtentsFile(R"({"format":"other","version":1,"extents":[]})").ok());
  EXPECT_EQ(DecodeExtentsFile(R"({"format":"barge-extents","version":2,"extents":[]})").error().code(),
            ErrorCode::kNotSupported);
  EXPECT_FALSE(DecodeExtentsFile(R"([{"offset":-1,"length":1}])").ok());
  EXPECT_FALSE(DecodeExtentsFile(R"([{"offset":18446744073709551615,"length":2}])").ok());
  EXPECT_FALSE(DecodeExtentsFile(
      R"({"format":"barge-extents","version":1,"virtual_size":100,"extents":[{"offset":90,"length":20}]})").ok());
  EXPECT_FALSE(DecodeExtentsFile(R"([1,2])").ok());
}

}  // namespace
}  // namespace barge::formats
