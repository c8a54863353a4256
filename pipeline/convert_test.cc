// convert's option combinations (CheckConvertOptions); the conversion
// itself is tested through the CLI (tests/convert_cli_test.cc).
#include "pipeline/convert.h"

#include <gtest/gtest.h>

namespace barge::pipeline {
namespace {

constexpr auto kRaw = DestinationFormat::kRaw;
constexpr auto kQcow2 = DestinationFormat::kQcow2;

std::string Problem(DestinationFormat f, bool compressed, bool backing, bool backing_format, bool cluster) {
  Status s = CheckConvertOptions(f, compressed, backing, backing_format, cluster);
  if (s.ok()) return "";
  EXPECT_EQ(s.error().code(), ErrorCode::kInvalidArgument);
  return s.error().message();
}

TEST(ConvertOptionsTest, Qcow2OnlyOptionsNeedAQcow2Output) {
  EXPECT_EQ(Problem(kRaw, true, false, false, false), "--compress needs -O qcow2");
  EXPECT_EQ(Problem(kRaw, false, true, false, false), "--backing needs -O qcow2");
  EXPECT_EQ(Problem(kRaw, false, false, false, true), "--cluster-size needs -O qcow2 (a raw output has no clusters)");
  EXPECT_EQ(Problem(kQcow2, true, true, true, true), "");
  EXPECT_EQ(Problem(kRaw, false, false, false, false), "");
}

TEST(ConvertOptionsTest, BackingFormatNeedsABacking) {
  EXPECT_EQ(Problem(kQcow2, false, false, true, false), "--backing-format needs --backing");
  EXPECT_EQ(Problem(kQcow2, false, true, true, false), "");
}

}  // namespace
}  // namespace barge::pipeline
