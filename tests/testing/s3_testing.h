// Helpers of the CLI tests against the binary's radosgw
// (tests/testing/radosgw.h): a bucket name per test, and the second client.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <cctype>
#include <string>

#include "tests/testing/radosgw.h"

namespace barge::testing {

// A bucket name of this process and the running test: PREFIX PID-TESTNAME,
// lower case, at most 60 characters, ending with a letter or digit.
inline std::string TestBucketName(const std::string& prefix) {
  std::string name = prefix + std::to_string(::getpid()) + "-" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  name = name.substr(0, 60);
  while (!name.empty() && !std::isalnum(static_cast<unsigned char>(name.back()))) name.pop_back();
  return name;
}

// `aws --endpoint-url RGW ARGS` with the radosgw's keys and no config files.
inline std::string AwsCommand(const Radosgw& rgw, const std::string& args) {
  return rgw.client_env() + "aws --endpoint-url " + rgw.endpoint() + " " + args;
}

}  // namespace barge::testing
