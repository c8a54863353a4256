// The HTTP head parser and the URL checks: what a server or a user may
// hand over, and what is shown of a URL.
#include <gtest/gtest.h>

#include "blockio/http_client.h"
#include "blockio/http_parse.h"

namespace barge {
namespace {

HttpResponseHead Head(std::initializer_list<std::string_view> lines) {
  HttpResponseHead h;
  for (auto l : lines) AddHttpHeadLine(l, h);
  return h;
}

TEST(HttpHeadTest, ReadsStatusAndTheFieldsBargeUses) {
  auto h = Head({"HTTP/1.1 206 Partial Content\r\n", "content-range: bytes 10-19/100\r\n", "ETag: \"abc\"\r\n",
                 "Last-Modified: Sun, 29 Nov 2026 04:00:00 GMT\r\n", "Content-Type: Text/HTML; charset=utf-8\r\n",
                 "Content-Length: 10\r\n", "\r\n"});
  EXPECT_EQ(h.status, 206);
  EXPECT_EQ(h.content_range, "bytes 10-19/100");
  EXPECT_EQ(h.etag, "\"abc\"");
  EXPECT_EQ(h.last_modified, "Sun, 29 Nov 2026 04:00:00 GMT");
  EXPECT_EQ(h.content_type, "text/html");
  EXPECT_EQ(h.content_length, 10u);
  EXPECT_FALSE(h.malformed);
}

TEST(HttpHeadTest, ARedirectsHeadIsReplacedByTheNextResponse) {
  auto h = Head({"HTTP/1.1 302 Found\r\n", "ETag: \"old\"\r\n", "\r\n", "HTTP/2 200\r\n", "\r\n"});
  EXPECT_EQ(h.status, 200);
  EXPECT_EQ(h.etag, "");
}

TEST(HttpHeadTest, GarbageIsMarkedMalformed) {
  EXPECT_TRUE(Head({"HTTP/1.1 abc\r\n"}).malformed);
  EXPECT_TRUE(Head({"HTTP/1.1 200 OK\r\n", "no colon here\r\n"}).malformed);
  EXPECT_TRUE(Head({"HTTP/1.1 200 OK\r\n", "Content-Length: 99999999999999999999999\r\n"}).malformed);
  EXPECT_TRUE(Head({"HTTP/1.1 200 OK\r\n", "Content-Length: -1\r\n"}).malformed);
}

TEST(HttpHeadTest, ContentRangeForms) {
  auto r = ParseContentRange("bytes 0-0/8388608");
  ASSERT_TRUE(r);
  EXPECT_EQ(*r->first, 0u);
  EXPECT_EQ(*r->last, 0u);
  EXPECT_EQ(*r->total, 8388608u);
  r = ParseContentRange("bytes */0");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->first);
  EXPECT_EQ(*r->total, 0u);
  r = ParseContentRange("bytes 5-9/*");
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->total);
  for (const char* bad : {"", "bytes", "bytes 9-5/100", "bytes 0-100/100", "items 0-1/2", "bytes 0-1", "bytes */*",
                          "bytes -1-2/3", "bytes 0-1/18446744073709551616"}) {
    EXPECT_FALSE(ParseContentRange(bad)) << bad;
  }
}

TEST(HttpUrlTest, RecognisedAndChecked) {
  EXPECT_TRUE(IsHttpUrl("http://h/x.raw"));
  EXPECT_TRUE(IsHttpUrl("HTTPS://h/x.qcow2"));
  EXPECT_FALSE(IsHttpUrl("nbd://h/x"));
  EXPECT_FALSE(IsHttpUrl("/srv/http/x.raw"));
  EXPECT_FALSE(IsHttpUrl("httpx://h/"));
  EXPECT_TRUE(CheckHttpUrl("https://example.com:8443/images/a.qcow2?v=1").ok());
  auto creds = CheckHttpUrl("https://alice:s3cret@example.com/a.qcow2");
  ASSERT_FALSE(creds.ok());
  EXPECT_EQ(creds.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(creds.error().ToString().find("s3cret"), std::string::npos) << creds.error().ToString();
  EXPECT_NE(creds.error().message().find("netrc"), std::string::npos);
  EXPECT_FALSE(CheckHttpUrl("https://alice@example.com/a.qcow2").ok());
  EXPECT_FALSE(CheckHttpUrl("http:///a.raw").ok());
  EXPECT_FALSE(CheckHttpUrl("http://h/a b.raw").ok());
  EXPECT_FALSE(CheckHttpUrl("http://h/a\n.raw").ok());
}

TEST(HttpUrlTest, ShownWithoutCredentials) {
  EXPECT_EQ(RedactHttpUrl("https://alice:pw@example.com/a.qcow2"), "https://example.com/a.qcow2");
  EXPECT_EQ(RedactHttpUrl("https://example.com/a.qcow2?token=abc&v=2"), "https://example.com/a.qcow2?v=2");
  EXPECT_EQ(RedactHttpUrl("http://h:8080/x.raw"), "http://h:8080/x.raw");
  // A signed URL's signature is a credential: Azure SAS, S3, Google, CloudFront.
  EXPECT_EQ(RedactHttpUrl("https://a.blob.core.windows.net/c/i.qcow2?sv=2022-11-02&se=2030-01-01&sig=AZ%3D"),
            "https://a.blob.core.windows.net/c/i.qcow2?sv=2022-11-02&se=2030-01-01");
  EXPECT_EQ(RedactHttpUrl("https://s3.example/b/i.raw?X-Amz-Date=1&X-Amz-Signature=abc&X-Amz-Security-Token=t"),
            "https://s3.example/b/i.raw?X-Amz-Date=1");
  EXPECT_EQ(RedactHttpUrl("https://storage.example/b/i.raw?X-Goog-Signature=abc&X-Goog-Credential=c&x=1"),
            "https://storage.example/b/i.raw?x=1");
  EXPECT_EQ(RedactHttpUrl("https://cdn.example/i.raw?Expires=1&Signature=abc&Key-Pair-Id=k"),
            "https://cdn.example/i.raw?Expires=1");
}

}  // namespace
}  // namespace barge
