// The S3 client (blockio/s3_client.h) against a real Ceph radosgw
// (tests/testing/radosgw.h), cross-checked with a second client (aws s3)
// and qemu-img.
#include "blockio/s3_client.h"

#include <gtest/gtest.h>

#include <atomic>

#include "tests/testing/cli_testing.h"
#include "tests/testing/radosgw.h"
#include "tests/testing/testing.h"

namespace barge {
namespace {

using testing::Radosgw;

HttpOptions OptionsFor(const Radosgw& rgw) {
  HttpOptions o;
  o.s3.endpoint = rgw.endpoint();
  o.s3.access_key_id = rgw.access_key();
  o.s3.secret_access_key = rgw.secret_key();
  o.max_attempts = 3;
  o.backoff_initial_ms = 50;
  return o;
}

// A fresh bucket per test: tests share the binary's one radosgw.
std::string NewBucket(S3Client& client) {
  static std::atomic<int> n{0};
  const std::string bucket = "t" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  EXPECT_TRUE(client.CreateBucket(bucket).ok());
  return bucket;
}

std::span<const std::byte> Bytes(const std::vector<std::byte>& v) { return v; }

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BARGE_REQUIRE_RADOSGW(rgw_);
    auto c = S3Client::Create(OptionsFor(*rgw_));
    ASSERT_TRUE(c.ok()) << c.error().ToString();
    client_ = std::move(*c);
    bucket_ = NewBucket(*client_);
  }
  Radosgw* rgw_ = nullptr;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

TEST_F(S3ClientTest, PutHeadRangedGetDeleteAnswerExactly) {
  const auto data = testing::RandomBytes(3 << 20 | 123, 1);
  const S3Location at{bucket_, "dir/a b+c.bin"};  // a key that needs encoding
  ASSERT_TRUE(client_->Put(at, Bytes(data)).ok());
  auto info = client_->Head(at);
  ASSERT_TRUE(info.ok()) << info.error().ToString();
  EXPECT_EQ(info->size, data.size());
  EXPECT_FALSE(info->etag.empty());
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{65535}, uint64_t{1} << 20, data.size() - 7}) {
    const size_t n = std::min<size_t>(70000, data.size() - offset);
    std::vector<std::byte> got(n);
    ASSERT_TRUE(client_->Get(at, offset, got).ok()) << offset;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + offset)) << offset;
  }
  std::vector<std::byte> past(16);
  EXPECT_FALSE(client_->Get(at, data.size() - 8, past).ok());
  ASSERT_TRUE(client_->Delete(at).ok());
  auto gone = client_->Head(at);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(client_->Delete(at).ok()) << "deleting a missing key is no error";
}

TEST_F(S3ClientTest, ListFollowsContinuationTokens) {
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client_->Put({bucket_, "p/" + std::to_string(i)}, Bytes(testing::RandomBytes(10 + i, i))).ok());
  }
  ASSERT_TRUE(client_->Put({bucket_, "other"}, Bytes(testing::RandomBytes(3, 9))).ok());
  auto list = client_->List({bucket_, "p/"}, 2);  // three pages
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  ASSERT_EQ(list->size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ((*list)[i].key, "p/" + std::to_string(i));
    EXPECT_EQ((*list)[i].size, uint64_t(10 + i));
  }
  auto all = client_->List({bucket_, ""});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 6u);
  // A limit stops after the page that reached it: one key, one request.
  auto first = client_->List({bucket_, "p/"}, 1, 1);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_EQ((*first)[0].key, "p/0");
  auto three = client_->List({bucket_, "p/"}, 2, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->size(), 4u) << "whole pages: two of two keys";
}

TEST_F(S3ClientTest, ConditionalCreateTwiceSaysItExists) {
  const S3Location at{bucket_, "chain/manifest.json"};
  ASSERT_TRUE(client_->PutIfAbsent(at, Bytes(testing::RandomBytes(100, 1))).ok());
  auto second = client_->PutIfAbsent(at, Bytes(testing::RandomBytes(100, 2)));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), ErrorCode::kBusy);
  const std::string line = second.error().ToString();
  EXPECT_NE(line.find("already exists"), std::string::npos) << line;
  EXPECT_NE(line.find("s3://" + bucket_ + "/chain/manifest.json"), std::string::npos) << line;
  std::vector<std::byte> got(100);
  ASSERT_TRUE(client_->Get(at, 0, got).ok());
  EXPECT_EQ(got, testing::RandomBytes(100, 1)) << "the first writer's bytes stay";
}

TEST_F(S3ClientTest, MultipartWithAPartUploadedAgainEqualsTheInput) {
  BARGE_REQUIRE_TOOL("aws");
  const auto data = testing::RandomBytes((2 << 20) + 300000, 7);
  const size_t part = 1 << 20;
  const S3Location at{bucket_, "big.bin"};
  auto id = client_->CreateMultipart(at);
  ASSERT_TRUE(id.ok()) << id.error().ToString();
  auto uploads = client_->ListMultipartUploads({bucket_, "big"});
  ASSERT_TRUE(uploads.ok()) << uploads.error().ToString();
  ASSERT_EQ(uploads->size(), 1u);
  EXPECT_EQ((*uploads)[0].upload_id, *id);
  EXPECT_EQ((*uploads)[0].key, "big.bin");
  // Part 2 first goes up with the wrong bytes, as a cut run might leave it.
  const auto wrong = testing::RandomBytes(part, 99);
  for (int p = 1; p <= 3; ++p) {
    const size_t off = (p - 1) * part;
    auto body = p == 2 ? std::span<const std::byte>(wrong)
                       : std::span<const std::byte>(data).subspan(off, std::min(part, data.size() - off));
    auto etag = client_->UploadPart(at, *id, p, body);
    ASSERT_TRUE(etag.ok()) << etag.error().ToString();
  }
  auto parts = client_->ListParts(at, *id);
  ASSERT_TRUE(parts.ok()) << parts.error().ToString();
  ASSERT_EQ(parts->size(), 3u);
  const std::string wrong_etag = (*parts)[1].etag;
  auto again = client_->UploadPart(at, *id, 2, std::span<const std::byte>(data).subspan(part, part));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, wrong_etag);
  parts = client_->ListParts(at, *id);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[1].etag, *again);
  EXPECT_EQ((*parts)[2].size, data.size() - 2 * part);
  ASSERT_TRUE(client_->CompleteMultipart(at, *id, *parts).ok());
  auto none = client_->ListMultipartUploads({bucket_, ""});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // A second client downloads the object: the input, byte for byte.
  testing::TempDir dir;
  testing::RunOk(rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " s3 cp s3://" + bucket_ +
                 "/big.bin " + testing::ShellQuote(dir / "big.bin") + " --only-show-errors");
  EXPECT_EQ(testing::ReadFile(dir / "big.bin"), data);
  // An aborted upload is gone.
  auto other = client_->CreateMultipart({bucket_, "x"});
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(client_->AbortMultipart({bucket_, "x"}, *other).ok());
  auto after = client_->ListParts({bucket_, "x"}, *other);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code(), ErrorCode::kNotFound);
}

TEST_F(S3ClientTest, Qcow2UploadedInPartsPassesQemuImgCheckWhenDownloaded) {
  BARGE_REQUIRE_TOOL("aws");
  BARGE_REQUIRE_TOOL("qemu-img");
  BARGE_REQUIRE_TOOL("qemu-io");
  testing::TempDir dir;
  const std::string img = dir / "disk.qcow2";
  testing::RunOk("qemu-img create -q -f qcow2 " + testing::ShellQuote(img) + " 64M && qemu-io -c 'write -P 0x5a 1M 3M' -c "
                 "'write -P 0x17 40M 1M' " + testing::ShellQuote(img) + " >/dev/null");
  const auto bytes = testing::ReadFile(img);
  const S3Location at{bucket_, "disk.qcow2"};
  auto id = client_->CreateMultipart(at);
  ASSERT_TRUE(id.ok());
  std::vector<S3Part> parts;
  const size_t part = 1 << 20;
  for (size_t off = 0, n = 1; off < bytes.size(); off += part, ++n) {
    auto body = std::span<const std::byte>(bytes).subspan(off, std::min(part, bytes.size() - off));
    auto etag = client_->UploadPart(at, *id, static_cast<int>(n), body);
    ASSERT_TRUE(etag.ok()) << etag.error().ToString();
    parts.push_back(S3Part{static_cast<int>(n), *etag, body.size()});
  }
  ASSERT_TRUE(client_->CompleteMultipart(at, *id, parts).ok());
  const std::string back = dir / "back.qcow2";
  testing::RunOk(rgw_->client_env() + "aws --endpoint-url " + rgw_->endpoint() + " s3 cp s3://" + bucket_ +
                 "/disk.qcow2 " + testing::ShellQuote(back) + " --only-show-errors");
  testing::RunOk("qemu-img check -q " + testing::ShellQuote(back));
  testing::RunOk("qemu-img compare -q " + testing::ShellQuote(img) + " " + testing::ShellQuote(back));
}

TEST_F(S3ClientTest, WrongSecretIsOneLineNamingTheBucketNeverTheSecret) {
  HttpOptions o = OptionsFor(*rgw_);
  o.s3.secret_access_key = "Wr0ngSecretThatMustNotShow" + rgw_->secret_key().substr(0, 8);
  auto bad = S3Client::Create(o);
  ASSERT_TRUE(bad.ok());
  const S3Location at{bucket_, "k"};
  std::vector<Error> errors;
  if (auto st = (*bad)->Put(at, Bytes(testing::RandomBytes(10, 1))); !st.ok()) errors.push_back(st.error());
  if (auto st = (*bad)->Head(at); !st.ok()) errors.push_back(st.error());
  if (auto st = (*bad)->List(at); !st.ok()) errors.push_back(st.error());
  ASSERT_EQ(errors.size(), 3u);
  for (const Error& e : errors) {
    const std::string line = e.ToString();
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << line;
    EXPECT_NE(line.find(bucket_), std::string::npos) << line;
    EXPECT_EQ(line.find(o.s3.secret_access_key), std::string::npos) << line;
    EXPECT_EQ(line.find(rgw_->secret_key()), std::string::npos) << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  }
  EXPECT_NE(errors[0].ToString().find("SignatureDoesNotMatch"), std::string::npos) << errors[0].ToString();
}

TEST_F(S3ClientTest, MissingBucketIsNotFoundNamingIt) {
  const S3Location at{"no-such-bucket-" + std::to_string(::getpid()), "k"};
  auto put = client_->Put(at, Bytes(testing::RandomBytes(10, 1)));
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(put.error().ToString().find("the bucket " + at.bucket + " does not exist"), std::string::npos)
      << put.error().ToString();
  auto list = client_->List(at);
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.error().code(), ErrorCode::kNotFound);
  auto head = client_->Head(at);
  ASSERT_FALSE(head.ok());
  EXPECT_EQ(head.error().code(), ErrorCode::kNotFound);
  EXPECT_NE(head.error().ToString().find("the bucket " + at.bucket + " does not exist"), std::string::npos)
      << head.error().ToString();
  auto key = client_->Head({bucket_, "missing"});
  ASSERT_FALSE(key.ok());
  EXPECT_NE(key.error().ToString().find("no such object in bucket " + bucket_), std::string::npos)
      << key.error().ToString();
}

}  // namespace
}  // namespace barge
