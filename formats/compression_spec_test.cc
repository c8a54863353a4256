// CompressionSpec (formats/image.h): the one spelling of compression that
// --compress, policies and manifests share (issue 19).
#include <gtest/gtest.h>

#include "formats/image.h"

namespace barge::formats {
namespace {

TEST(CompressionSpecTest, Defaults) {
  EXPECT_EQ(CompressionSpec::Default().type, Compression::kZstd);
  EXPECT_EQ(CompressionSpec::Default().level, kDefaultZstdLevel);
  EXPECT_EQ(CompressionSpec::Default().ToString(), "zstd:1");
  EXPECT_EQ(CompressionSpec::None().ToString(), "none");
  EXPECT_EQ(MaxCompressionLevel(Compression::kZstd), 19);
  EXPECT_EQ(MaxCompressionLevel(Compression::kDeflate), 9);
  EXPECT_EQ(MaxCompressionLevel(Compression::kNone), 0);
}

TEST(CompressionSpecTest, GoodSpellings) {
  const struct {
    const char* text;
    Compression type;
    int level;
    const char* printed;
  } cases[] = {
      {"zstd", Compression::kZstd, kDefaultZstdLevel, "zstd:1"},
      {"zstd:1", Compression::kZstd, 1, "zstd:1"},
      {"zstd:3", Compression::kZstd, 3, "zstd:3"},
      {"zstd:19", Compression::kZstd, 19, "zstd:19"},
      {"zstd:07", Compression::kZstd, 7, "zstd:7"},
      {"zlib", Compression::kDeflate, kDefaultDeflateLevel, "zlib:6"},
      {"zlib:9", Compression::kDeflate, 9, "zlib:9"},
      {"deflate", Compression::kDeflate, kDefaultDeflateLevel, "zlib:6"},
      {"deflate:1", Compression::kDeflate, 1, "zlib:1"},
      {"none", Compression::kNone, 0, "none"},
  };
  for (const auto& c : cases) {
    auto spec = ParseCompressionSpec(c.text);
    ASSERT_TRUE(spec.ok()) << c.text << ": " << spec.error().ToString();
    EXPECT_EQ(spec->type, c.type) << c.text;
    EXPECT_EQ(spec->level, c.level) << c.text;
    EXPECT_EQ(spec->ToString(), c.printed) << c.text;
    // What is printed parses back to the same spec (manifests and
    // `policy show` print it).
    EXPECT_EQ(ParseCompressionSpec(spec->ToString()).value(), *spec) << c.text;
  }
}

// The assertions of orchestrate's former ParseCompressionSetting test.
TEST(CompressionSpecTest, PolicySpellings) {
  EXPECT_EQ(ParseCompressionSpec("zstd")->level, kDefaultZstdLevel);
  EXPECT_EQ(ParseCompressionSpec("zstd:7")->level, 7);
  EXPECT_EQ(ParseCompressionSpec("deflate")->type, Compression::kDeflate);
  EXPECT_EQ(ParseCompressionSpec("none")->type, Compression::kNone);
  for (const char* b : {"none:1", "zstd:", "zstd:0", "zlib:10", "zstd:x", "gzip", ""}) {
    EXPECT_FALSE(ParseCompressionSpec(b).ok()) << b;
  }
}

TEST(CompressionSpecTest, BadSpellings) {
  // Each of these was accepted by one of the three former parsers (the
  // cli took "zstd:", "none:", " 5" and "+5"; merge took "zstd:0" as its
  // default and "zstd:5x" as 5, and no range).
  for (const char* b : {"zstd:", "none:", "none:0", "zstd: 5", "zstd:+5", "zstd:-1", "zstd:5x", "zstd:0", "zstd:20",
                        "zstd:99999999999999999999", "zlib:0", "deflate:10", "ZSTD", "zstd ", " zstd", "lz4", ":3",
                        "zstd:3:1"}) {
    auto spec = ParseCompressionSpec(b);
    EXPECT_FALSE(spec.ok()) << b;
    if (!spec.ok()) EXPECT_EQ(spec.error().code(), ErrorCode::kInvalidArgument) << b;
  }
  EXPECT_FALSE(ParseCompressionSpec(std::string_view("zstd\0:3", 7)).ok());
  EXPECT_NE(ParseCompressionSpec("lz4").error().message().find("unknown compression 'lz4'"), std::string::npos);
  EXPECT_NE(ParseCompressionSpec("zstd:20").error().message().find("compression level must be 1..19"),
            std::string::npos);
  EXPECT_NE(ParseCompressionSpec("zlib:10").error().message().find("compression level must be 1..9"),
            std::string::npos);
  EXPECT_NE(ParseCompressionSpec("none:1").error().message().find("'none' takes no level"), std::string::npos);
}

}  // namespace
}  // namespace barge::formats
