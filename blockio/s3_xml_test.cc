// The S3 answer readers, the error mapping and the location parser, on
// documents as radosgw and AWS send them (no server needed).
#include "blockio/s3_xml.h"

#include <gtest/gtest.h>

#include <map>

#include "blockio/s3_client.h"
#include "blockio/s3_config.h"
#include "blockio/s3_source.h"

namespace barge {
namespace {

TEST(S3XmlTest, ListObjectsV2DecodesEntitiesAndCarriesTheToken) {
  auto page = ParseListObjectsV2(
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<IsTruncated>true</IsTruncated><NextContinuationToken>tok&amp;1</NextContinuationToken>"
      "<Contents><Key>p/a&amp;b&#x41;&#66;</Key><Size>10</Size><ETag>&quot;e&quot;</ETag></Contents>"
      "<Contents><Key>p/c</Key><Size>0</Size></Contents></ListBucketResult>");
  ASSERT_TRUE(page.ok()) << page.error().ToString();
  ASSERT_EQ(page->objects.size(), 2u);
  EXPECT_EQ(page->objects[0].key, "p/a&bAB");
  EXPECT_EQ(page->objects[0].etag, "\"e\"");
  EXPECT_EQ(page->objects[0].size, 10u);
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_token, "tok&1");
}

TEST(S3XmlTest, MalformedListingsAreCorruption) {
  EXPECT_FALSE(ParseListObjectsV2("<Error><Code>x</Code></Error>").ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size></Contents></ListBucketResult>").ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>").ok());
  EXPECT_FALSE(ParseListParts("<ListPartsResult><Part><PartNumber>0</PartNumber><Size>1</Size></Part></ListPartsResult>").ok());
  EXPECT_FALSE(ParseListParts("<ListPartsResult><Part><PartNumber>10001</PartNumber><Size>1</Size></Part></ListPartsResult>").ok());
  EXPECT_FALSE(ParseInitiateMultipart("<InitiateMultipartUploadResult></InitiateMultipartUploadResult>").ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><Contents><Key>unterminated").ok() &&
               !ParseListObjectsV2("<ListBucketResult><Contents><Key>unterminated")->objects.empty());
}

TEST(S3XmlTest, PartsAndUploads) {
  auto parts = ParseListParts(
      "<ListPartsResult><IsTruncated>false</IsTruncated><Part><PartNumber>2</PartNumber><ETag>\"b\"</ETag>"
      "<Size>5</Size></Part></ListPartsResult>");
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->parts.size(), 1u);
  EXPECT_EQ(parts->parts[0].number, 2);
  EXPECT_EQ(parts->parts[0].etag, "\"b\"");
  auto uploads = ParseListMultipartUploads(
      "<ListMultipartUploadsResult><Upload><Key>k</Key><UploadId>2~x</UploadId></Upload>"
      "</ListMultipartUploadsResult>");
  ASSERT_TRUE(uploads.ok());
  ASSERT_EQ(uploads->uploads.size(), 1u);
  EXPECT_EQ(uploads->uploads[0].upload_id, "2~x");
  auto id = ParseInitiateMultipart("<InitiateMultipartUploadResult><UploadId>2~id</UploadId></InitiateMultipartUploadResult>");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "2~id");
}

TEST(S3XmlTest, ErrorCodesAreWordsAndMessagesOneLine) {
  // Found by fuzz/s3_xml_fuzzer.cc: a code with a line break in it.
  auto e = ParseS3Error("<Error><Code>NoSuch\nBucket\x1b[2J</Code><Message>a\nb</Message></Error>");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "NoSuchBucket2J");
  EXPECT_EQ(e->message, "a b");
  EXPECT_FALSE(ParseS3Error("<Error><Code>\n</Code></Error>"));
}

TEST(S3XmlTest, ElementsNeedTheirWholeName) {
  auto e = XmlElements("<KeyCount>3</KeyCount><Key a=\"1\">x</Key><Key/>", "Key");
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0], "x");
  EXPECT_EQ(e[1], "");
}

TEST(S3ErrorTest, CodesMapToBargeErrorsNamingTheBucket) {
  const S3Location at{"bkt", "dir/k"};
  auto code = [&](int status, const std::string& s3code) {
    return S3ErrorFor(status, "<Error><Code>" + s3code + "</Code><Message>m</Message></Error>", at);
  };
  EXPECT_EQ(code(404, "NoSuchBucket").code(), ErrorCode::kNotFound);
  EXPECT_NE(code(404, "NoSuchBucket").ToString().find("the bucket bkt does not exist"), std::string::npos);
  EXPECT_EQ(code(404, "NoSuchKey").code(), ErrorCode::kNotFound);
  EXPECT_EQ(code(403, "AccessDenied").code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code(403, "SignatureDoesNotMatch").code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(code(403, "RequestTimeTooSkewed").ToString().find("clock"), std::string::npos);
  EXPECT_EQ(code(403, "QuotaExceeded").code(), ErrorCode::kNoSpace);
  EXPECT_EQ(code(412, "PreconditionFailed").code(), ErrorCode::kBusy);
  EXPECT_EQ(code(503, "SlowDown").code(), ErrorCode::kIoError);
  EXPECT_TRUE(code(503, "SlowDown").retryable());
  EXPECT_EQ(S3ErrorFor(404, "", at).code(), ErrorCode::kNotFound);  // a HEAD has no body
  EXPECT_EQ(S3ErrorFor(403, "", at).code(), ErrorCode::kInvalidArgument);
  for (const Error& e : {code(403, "SignatureDoesNotMatch"), S3ErrorFor(400, "<Error><Code>X</Code><Message>a\nb</Message></Error>", at)}) {
    EXPECT_NE(e.ToString().find("s3://bkt/dir/k"), std::string::npos) << e.ToString();
    EXPECT_EQ(e.ToString().find('\n'), std::string::npos) << e.ToString();
  }
}

TEST(S3LocationTest, ParsesAndRefuses) {
  auto at = ParseS3Url("s3://my-bucket/chains/vm1/disk.qcow2");
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(at->bucket, "my-bucket");
  EXPECT_EQ(at->key, "chains/vm1/disk.qcow2");
  EXPECT_EQ(at->shown(), "s3://my-bucket/chains/vm1/disk.qcow2");
  EXPECT_TRUE(ParseS3Url("s3://bucket").ok());
  EXPECT_FALSE(ParseS3Url("s3://Bucket/k").ok());
  EXPECT_FALSE(ParseS3Url("s3://ab/k").ok());
  EXPECT_FALSE(ParseS3Url("s3://-ab/k").ok());
  auto creds = ParseS3Url("s3://KEY:hunter2xyz@bucket/k");
  ASSERT_FALSE(creds.ok());
  EXPECT_EQ(creds.error().ToString().find("hunter2xyz"), std::string::npos) << creds.error().ToString();
  EXPECT_FALSE(ParseS3Url("https://bucket/k").ok());
  EXPECT_TRUE(IsS3Url("S3://b"));
  EXPECT_FALSE(IsS3Url("s3:/b"));
}

TEST(S3LocationTest, UriEncodingAndDigest) {
  EXPECT_EQ(S3UriEncode("a b/c+d~e", true), "a%20b/c%2Bd~e");
  EXPECT_EQ(S3UriEncode("a/b", false), "a%2Fb");
  EXPECT_EQ(Sha256Hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(S3ClientCreateTest, MissingKeysAreNamedByTheObjectBeforeAnyRequest) {
  HttpOptions o;
  o.s3.endpoint = "http://127.0.0.1:1";
  auto opened = OpenS3Source("s3://bucket/x.qcow2", o);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.error().path(), "s3://bucket/x.qcow2");
  EXPECT_NE(opened.error().message().find("no S3 credentials"), std::string::npos) << opened.error().ToString();
}

TEST(S3ClientCreateTest, RefusesMissingKeysAndEndpointsWithPaths) {
  HttpOptions o;
  o.s3.endpoint = "http://127.0.0.1:1";
  EXPECT_FALSE(S3Client::Create(o).ok());
  o.s3.access_key_id = "k";
  o.s3.secret_access_key = "s";
  EXPECT_TRUE(S3Client::Create(o).ok());
  o.s3.endpoint = "http://127.0.0.1:1/path";
  EXPECT_FALSE(S3Client::Create(o).ok());
  o.s3.endpoint = "ftp://host";
  EXPECT_FALSE(S3Client::Create(o).ok());
  o.s3.endpoint = "http://127.0.0.1:9";
  auto c = S3Client::Create(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->Url({"b", "k/x y"}), "http://127.0.0.1:9/b/k/x%20y");
  o.s3.virtual_host = true;
  o.s3.endpoint = "https://s3.example.net";
  auto v = S3Client::Create(o);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ((*v)->Url({"b", "k"}, "uploads="), "https://b.s3.example.net/k?uploads=");
}

}  // namespace
}  // namespace barge

namespace barge {
namespace {

TEST(S3ConfigTest, EnvironmentThenCredentialsFile) {
  std::map<std::string, std::string> env{{"HOME", "/home/u"}, {"AWS_ENDPOINT_URL", "http://127.0.0.1:7480"},
                                         {"AWS_DEFAULT_REGION", "eu-west-1"}};
  auto getenv = [&](const std::string& n) -> std::optional<std::string> {
    auto it = env.find(n);
    return it == env.end() ? std::nullopt : std::optional(it->second);
  };
  std::string read;
  auto reader = [&](const std::string& path) -> Result<std::string> {
    read = path;
    if (path != "/home/u/.aws/credentials") return Error::NotFound("missing");
    return std::string("# c\n[default]\naws_access_key_id = AK\naws_secret_access_key=SK\n[profile p2]\n"
                       "aws_access_key_id=AK2\naws_secret_access_key=SK2\naws_session_token=T2\n");
  };
  auto a = ResolveS3Access({}, getenv, reader);
  ASSERT_TRUE(a.ok()) << a.error().ToString();
  EXPECT_EQ(a->endpoint, "http://127.0.0.1:7480");
  EXPECT_EQ(a->region, "eu-west-1");
  EXPECT_EQ(a->access_key_id, "AK");
  EXPECT_EQ(a->secret_access_key, "SK");
  env["AWS_PROFILE"] = "p2";
  a = ResolveS3Access({}, getenv, reader);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->session_token, "T2");
  S3Access flags;
  flags.endpoint = "https://flag.example";
  env["AWS_ACCESS_KEY_ID"] = "EK";
  env["AWS_SECRET_ACCESS_KEY"] = "ES";
  a = ResolveS3Access(flags, getenv, reader);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->endpoint, "https://flag.example");
  EXPECT_EQ(a->access_key_id, "EK");
  env.erase("AWS_ACCESS_KEY_ID");
  env["AWS_PROFILE"] = "nope";
  a = ResolveS3Access({}, getenv, reader);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().ToString().find("SK"), std::string::npos) << a.error().ToString();
  env.erase("AWS_PROFILE");
  env["HOME"] = "/elsewhere";
  a = ResolveS3Access({}, getenv, reader);
  ASSERT_TRUE(a.ok()) << "no file and no profile named: no keys, no error";
  EXPECT_TRUE(a->access_key_id.empty());
}

TEST(S3XmlTest, ObjectLockConfigurationAndRetention) {
  auto on = ParseObjectLockConfiguration(
      "<ObjectLockConfiguration><ObjectLockEnabled>Enabled</ObjectLockEnabled></ObjectLockConfiguration>");
  ASSERT_TRUE(on.ok());
  EXPECT_TRUE(*on);
  auto off = ParseObjectLockConfiguration("<ObjectLockConfiguration></ObjectLockConfiguration>");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(*off);
  EXPECT_FALSE(ParseObjectLockConfiguration("<Error/>").ok());

  // radosgw sends nanoseconds.
  auto r = ParseRetention(
      "<Retention><Mode>COMPLIANCE</Mode><RetainUntilDate>2026-11-30T12:00:00.000000000Z</RetainUntilDate>"
      "</Retention>");
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->mode, S3LockMode::kCompliance);
  EXPECT_EQ(S3IsoTime(r->until_unix), "2026-11-30T12:00:00Z");
  EXPECT_EQ(ParseS3IsoTime("1970-01-02T00:00:00Z"), 86400);
  for (const char* bad : {"<Retention><Mode>NONE</Mode><RetainUntilDate>2026-11-30T12:00:00Z</RetainUntilDate></Retention>",
                          "<Retention><Mode>GOVERNANCE</Mode><RetainUntilDate>tomorrow</RetainUntilDate></Retention>",
                          "<Retention><Mode>GOVERNANCE</Mode></Retention>", "<RetentionX/>"}) {
    EXPECT_EQ(ParseRetention(bad).error().code(), ErrorCode::kCorruption) << bad;
  }
  for (const char* bad : {"2026-13-01T00:00:00Z", "2026-11-30 12:00:00Z", "2026-11-30T12:00:00.Z", "2026-11-30T12:00:00+01"}) {
    EXPECT_FALSE(ParseS3IsoTime(bad)) << bad;
  }
}

}  // namespace
}  // namespace barge
