#include "formats/json_fields.h"

#include <gtest/gtest.h>

namespace barge::formats {
namespace {

using nlohmann::json;

TEST(JsonFieldsTest, WrongTypesReadAsTheFallback) {
  const json j = json::parse(R"({"s":"text","n":7,"neg":-1,"f":1e300,"b":true,"a":[1],"o":{},"z":null})");
  EXPECT_EQ(JsonString(j, "s"), "text");
  EXPECT_EQ(JsonUint(j, "n"), 7u);
  EXPECT_TRUE(JsonBool(j, "b"));
  for (const char* key : {"n", "f", "b", "a", "o", "z", "missing"}) {
    EXPECT_EQ(JsonString(j, key, "fb"), "fb") << key;
  }
  for (const char* key : {"s", "neg", "f", "b", "a", "o", "z", "missing"}) {
    EXPECT_EQ(JsonUint(j, key, 5), 5u) << key;
  }
  EXPECT_FALSE(JsonBool(j, "n"));
  // Not an object at all.
  for (const json& other : {json::array({1, 2}), json(nullptr), json("s"), json(3)}) {
    EXPECT_EQ(JsonString(other, "s", "fb"), "fb");
    EXPECT_EQ(JsonUint(other, "n", 9), 9u);
  }
}

TEST(JsonFieldsTest, IsUtf8AgreesWithTheJsonEncoder) {
  for (const std::string& good : {std::string(""), std::string("plain"), std::string("caf\xc3\xa9"),
                                  std::string("\xe2\x82\xac"), std::string("\xf0\x9f\x98\x80")}) {
    EXPECT_TRUE(IsUtf8(good)) << good;
    EXPECT_TRUE(DumpJson(json(good), -1, "x").ok());
  }
  for (const std::string& bad : {std::string("\xff"), std::string("a\xc3"), std::string("\xc0\xaf"),
                                 std::string("\xed\xa0\x80"), std::string("\xf4\x90\x80\x80"),
                                 std::string("\xe2\x82"), std::string("\x80")}) {
    EXPECT_FALSE(IsUtf8(bad)) << testing::PrintToString(bad);
    EXPECT_FALSE(DumpJson(json(bad), -1, "x").ok()) << testing::PrintToString(bad);
  }
}

TEST(JsonFieldsTest, TextThatIsNotUtf8IsAnErrorOrReplaced) {
  json j = {{"path", std::string("/srv/\xff\xfe.qcow2")}};
  auto dumped = DumpJson(j, 2, "record x");
  ASSERT_FALSE(dumped.ok());
  EXPECT_EQ(dumped.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(dumped.error().message().find("record x"), std::string::npos) << dumped.error().ToString();
  EXPECT_NE(DumpJsonForDisplay(j).find("\xef\xbf\xbd"), std::string::npos);  // U+FFFD
  nlohmann::ordered_json o;
  o["ok"] = "caf\xc3\xa9";
  auto fine = DumpJson(o, -1, "record y");
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(*fine, "{\"ok\":\"caf\xc3\xa9\"}");
}

}  // namespace
}  // namespace barge::formats
