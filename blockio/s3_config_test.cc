// The AWS config file (~/.aws/config) and the precedence of its settings
// (blockio/s3_config.h): files in a private TempDir, read through the Env.
#include "blockio/s3_config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "blockio/env.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

TEST(AwsConfigTest, ReadsTheProfilesRegionAndEndpoint) {
  const std::string text =
      "# comment\n; another\n[default]\nregion = eu-west-1\noutput=json\ns3 =\n  addressing_style = virtual\n"
      "  endpoint_url = http://nested.example\n\n[profile ceph]\r\nregion=us-east-2\r\n"
      "endpoint_url = http://127.0.0.1:7480\r\n[services my]\ns3 =\n  endpoint_url = http://svc\n"
      "[ceph]\nregion = not-a-profile-section\n";
  auto d = ParseAwsConfig(text, "default");
  ASSERT_TRUE(d.ok()) << d.error().ToString();
  EXPECT_EQ(d->region, "eu-west-1");
  EXPECT_EQ(d->endpoint_url, "") << "indented sub-settings are not the profile's";
  auto c = ParseAwsConfig(text, "ceph");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->region, "us-east-2");
  EXPECT_EQ(c->endpoint_url, "http://127.0.0.1:7480");
  auto none = ParseAwsConfig(text, "absent");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->region, "");
  auto pd = ParseAwsConfig("[profile default]\nregion = ap-south-1\n", "default");
  ASSERT_TRUE(pd.ok());
  EXPECT_EQ(pd->region, "ap-south-1");
}

TEST(AwsConfigTest, MalformedTextIsAnErrorNamingTheLineNotItsText) {
  const struct {
    const char* text;
    const char* line;
  } cases[] = {
      {"[default\nregion = x\n", "line 1: a section header without ']'"},
      {"[default]\nregion x-secret-ish\n", "line 2: neither a comment"},
      {"region = x\n[default]\n", "line 1: a setting before the first [section]"},
      {"  region = x\n", "line 1: an indented line before"},
      {"[default]\nregion = a\x01secret\n", "line 2: a control character"},
      {"[default]\n= value\n", "line 2: neither"},
      {"[default]\nregion = a\rb\n", "line 2: a control character"},  // found by s3_config_fuzzer
  };
  for (const auto& c : cases) {
    auto r = ParseAwsConfig(c.text, "default");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find(c.line), std::string::npos) << r.error().message();
    EXPECT_EQ(r.error().message().find("secret"), std::string::npos) << r.error().message();
  }
}

class ResolveFromFilesTest : public ::testing::Test {
 protected:
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  Result<S3Access> Resolve(const S3Access& flags = {}) {
    auto getenv = [this](const std::string& n) -> std::optional<std::string> {
      auto it = env_.find(n);
      return it == env_.end() ? std::nullopt : std::optional(it->second);
    };
    auto read = [](const std::string& path) { return Env::Default().ReadFile(path, 1 << 20); };
    return ResolveS3Access(flags, getenv, read);
  }
  testing::TempDir dir_;
  std::map<std::string, std::string> env_{{"HOME", dir_.path().string()}};
};

TEST_F(ResolveFromFilesTest, FlagThenEnvironmentThenConfigFileThenDefault) {
  std::filesystem::create_directories(dir_.path() / ".aws");
  Write(".aws/config", "[default]\nregion = eu-central-1\nendpoint_url = http://config.example:7480\n"
                       "[profile other]\nregion = sa-east-1\n");
  Write(".aws/credentials", "[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n"
                            "[other]\naws_access_key_id = AK2\naws_secret_access_key = SK2\n");
  auto a = Resolve();
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(a->region, "eu-central-1");
  EXPECT_EQ(a->endpoint, "http://config.example:7480");
  EXPECT_EQ(a->access_key_id, "AK");

  env_["AWS_DEFAULT_REGION"] = "us-west-1";
  env_["AWS_ENDPOINT_URL"] = "http://env.example";
  a = Resolve();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->region, "us-west-1");
  EXPECT_EQ(a->endpoint, "http://env.example");

  S3Access flags;
  flags.region = "us-west-2";
  flags.endpoint = "http://flag.example";
  a = Resolve(flags);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->region, "us-west-2");
  EXPECT_EQ(a->endpoint, "http://flag.example");

  env_.erase("AWS_DEFAULT_REGION");
  env_.erase("AWS_ENDPOINT_URL");
  env_["AWS_PROFILE"] = "other";
  a = Resolve();
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(a->region, "sa-east-1");
  EXPECT_EQ(a->endpoint, "") << "the profile has none: the default (AWS) applies";
  EXPECT_EQ(a->access_key_id, "AK2");

  env_["AWS_CONFIG_FILE"] = dir_ / "elsewhere";
  Write("elsewhere", "[profile other]\nregion = me-south-1\n");
  a = Resolve();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->region, "me-south-1");

  env_["AWS_CONFIG_FILE"] = "/dev/null";
  env_["AWS_SHARED_CREDENTIALS_FILE"] = "/dev/null";
  env_.erase("AWS_PROFILE");
  a = Resolve();
  ASSERT_TRUE(a.ok()) << "/dev/null is an empty file: " << a.error().ToString();
  EXPECT_EQ(a->region, "");
  EXPECT_EQ(a->access_key_id, "");
  env_.erase("AWS_SHARED_CREDENTIALS_FILE");
  env_["AWS_PROFILE"] = "other";

  env_["AWS_CONFIG_FILE"] = dir_ / "missing";
  a = Resolve();
  ASSERT_TRUE(a.ok()) << "a missing config file is no error";
  EXPECT_EQ(a->region, "");
}

TEST_F(ResolveFromFilesTest, AMalformedConfigFileIsAnErrorNamingTheFile) {
  env_["AWS_CONFIG_FILE"] = dir_ / "config";
  Write("config", "[default]\nregion = ok\n[profile broken\naws_secret_access_key = SHOULD-NOT-SHOW\n");
  auto a = Resolve();
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), ErrorCode::kInvalidArgument);
  const std::string text = a.error().ToString();
  EXPECT_NE(text.find(dir_ / "config"), std::string::npos) << text;
  EXPECT_NE(text.find("line 3"), std::string::npos) << text;
  EXPECT_EQ(text.find("SHOULD-NOT-SHOW"), std::string::npos) << text;

  S3Access flags;
  flags.region = "r";
  flags.endpoint = "http://e";
  EXPECT_TRUE(Resolve(flags).ok()) << "not read when the flags say everything it could";
}

}  // namespace
}  // namespace barge
