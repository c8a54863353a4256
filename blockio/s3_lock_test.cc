// The lock object's body (blockio/s3_lock.h): what barge writes reads
// back, and anything else is "a lock object barge did not write" (no
// server needed; the lock itself is tested in tests/s3_upload_test.cc).
#include "blockio/s3_lock.h"

#include <gtest/gtest.h>

namespace barge {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

const S3Location kAt{"bucket", "chain/.lock"};

TEST(S3LockBodyTest, WhatBargeWritesReadsBack) {
  const S3LockBody body{"host-1.example", 12345, "0123456789abcdef0123456789abcdef", 1700000000, 1700000120, "", 0};
  const std::string text = FormatS3LockBody(body);
  auto back = ParseS3LockBody(Bytes(text), kAt);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->host, body.host);
  EXPECT_EQ(back->pid, body.pid);
  EXPECT_EQ(back->token, body.token);
  EXPECT_EQ(back->acquired, body.acquired);
  EXPECT_EQ(back->expires, body.expires);
  // Spacing and field order are free.
  auto spaced = ParseS3LockBody(
      Bytes(" { \"expires\" : 5 ,\n\"acquired\":4, \"token\":\"ffffffffffffffffffffffffffffffff\",\"pid\":1,"
            "\"host\":\"h\",\"barge_lock\":1 }\n"),
      kAt);
  ASSERT_TRUE(spaced.ok()) << spaced.error().ToString();
  EXPECT_EQ(spaced->expires, 5);
}

// Version 2 names the owner's boot and pid namespace and its start time,
// so that a writer of the same machine can tell a dead owner.
TEST(S3LockBodyTest, VersionTwoReadsBack) {
  const S3LockBody body{"h", 77, std::string(32, 'c'), 10, 20, "0f3c-aa/4026531836", 123456};
  const std::string text = FormatS3LockBody(body);
  EXPECT_NE(text.find("\"barge_lock\":2"), std::string::npos) << text;
  auto back = ParseS3LockBody(Bytes(text), kAt);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->boot, body.boot);
  EXPECT_EQ(back->start, body.start);
  EXPECT_EQ(back->pid, body.pid);
  // Version 1 (no boot): written and read as before.
  auto v1 = ParseS3LockBody(Bytes(FormatS3LockBody(S3LockBody{"h", 1, std::string(32, 'd'), 1, 2, "", 0})), kAt);
  ASSERT_TRUE(v1.ok()) << v1.error().ToString();
  EXPECT_EQ(v1->boot, "");
  EXPECT_EQ(v1->start, 0);
}

TEST(S3LockBodyTest, AnythingElseIsALockBargeDidNotWrite) {
  const std::string good_tail = ",\"token\":\"0123456789abcdef0123456789abcdef\",\"acquired\":1,\"expires\":2}";
  for (const std::string& bad : std::vector<std::string>{
           std::string(), std::string("not json"), std::string("{}"), std::string("[1]"),
           "{\"barge_lock\":2,\"host\":\"h\",\"pid\":1" + good_tail,           // version 2 without boot, start
           "{\"barge_lock\":3,\"host\":\"h\",\"boot\":\"b\",\"pid\":1,\"start\":1" + good_tail,  // version
           "{\"barge_lock\":1,\"host\":\"h\",\"boot\":\"b\",\"pid\":1,\"start\":1" + good_tail,  // v2 fields in v1
           "{\"barge_lock\":2,\"host\":\"h\",\"boot\":\"b\",\"pid\":1,\"start\":1,\"x\":1" + good_tail,  // extra
           "{\"barge_lock\":2,\"host\":\"h\",\"boot\":\"b\",\"pid\":1,\"begin\":1" + good_tail,  // start misnamed
           "{\"barge_lock\":2,\"host\":\"h\",\"boot\":\"b c\",\"pid\":1,\"start\":1" + good_tail,  // space
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":-1" + good_tail,          // negative
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":01" + good_tail,          // leading zero
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":1.5" + good_tail,         // fraction
           "{\"barge_lock\":1,\"host\":\"h\\\"x\",\"pid\":1" + good_tail,      // escape
           "{\"barge_lock\":1,\"host\":\"h h\",\"pid\":1" + good_tail,         // space
           "{\"barge_lock\":1,\"host\":\"h\",\"host\":\"h\",\"pid\":1" + good_tail,  // duplicate
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":1,\"x\":1" + good_tail,   // extra field
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":99999999999999999999" + good_tail,  // too large
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":1" + good_tail + "x",     // trailing bytes
           std::string("{\"barge_lock\":1,\"host\":\"h\",\"pid\":1,\"token\":\"xyz\",\"acquired\":1,\"expires\":2}"),
           "{\"barge_lock\":1,\"host\":\"h\",\"pid\":1" + good_tail.substr(0, good_tail.size() - 1),  // cut
       }) {
    auto parsed = ParseS3LockBody(Bytes(bad), kAt);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.error().code(), ErrorCode::kInvalidArgument) << bad;
    const std::string line = parsed.error().ToString();
    EXPECT_NE(line.find("a lock object barge did not write"), std::string::npos) << line;
    EXPECT_NE(line.find("s3://bucket/chain/.lock"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace barge
