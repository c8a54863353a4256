// S3Client: S3's REST operations as HttpClient::Send requests (signing by
// libcurl's CURLOPT_AWS_SIGV4), answers read by blockio/s3_xml.h.
#include "blockio/s3_client.h"

#include <gnutls/crypto.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cctype>
#include <ctime>
#include <utility>

namespace barge {
namespace {

constexpr std::string_view kHex = "0123456789abcdef";

bool Unreserved(unsigned char c) {
  return std::isalnum(c) != 0 || c == '-' || c == '.' || c == '_' || c == '~';
}

bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '.' ||
          c == '-')) {
      return false;
    }
  }
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  return alnum(b.front()) && alnum(b.back());
}

// A query string as SigV4 wants it from us on curl 7.88: names sorted,
// names and values encoded, "name=" for an empty value.
std::string Query(std::vector<std::pair<std::string, std::string>> params) {
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [name, value] : params) {
    if (!out.empty()) out += '&';
    out += S3UriEncode(name, false) + "=" + S3UriEncode(value, false);
  }
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      default: out += c;
    }
  }
  return out;
}

bool Ok(int status) { return status >= 200 && status < 300; }

// The value of x-amz-copy-source: "/BUCKET/KEY", the key encoded.
std::string CopySource(const S3Location& from) {
  return "/" + from.bucket + "/" + S3UriEncode(from.key, /*keep_slash=*/true);
}

}  // namespace

bool IsS3Url(std::string_view location) {
  if (location.size() < 5) return false;
  return std::tolower(static_cast<unsigned char>(location[0])) == 's' && location[1] == '3' &&
         location.substr(2, 3) == "://";
}

std::string S3Location::shown() const { return "s3://" + bucket + (key.empty() ? "" : "/" + key); }

Result<S3Location> ParseS3Url(std::string_view url) {
  if (!IsS3Url(url)) return Error::InvalidArgument("not an s3:// location").set_path(std::string(url.substr(0, 200)));
  std::string_view rest = url.substr(5);
  const size_t slash = rest.find('/');
  S3Location at;
  at.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) at.key = std::string(rest.substr(slash + 1));
  const std::string shown = "s3://" + std::string(rest);
  for (char c : url) {
    if (static_cast<unsigned char>(c) < ' ' || c == 0x7f) {
      return Error::InvalidArgument("an s3:// location with control characters").set_path(at.bucket);
    }
  }
  if (at.bucket.find('@') != std::string::npos || at.bucket.find(':') != std::string::npos) {
    return Error::InvalidArgument(
               "credentials or a port in an s3:// location are refused; give keys with AWS_ACCESS_KEY_ID and "
               "AWS_SECRET_ACCESS_KEY (or ~/.aws/credentials) and the server with --s3-endpoint")
        .set_path("s3://");
  }
  if (!ValidBucket(at.bucket)) {
    return Error::InvalidArgument(
               "not a bucket name (3 to 63 lower-case letters, digits, dots and dashes, starting and ending with "
               "a letter or digit)")
        .set_path(shown);
  }
  if (at.key.size() > 1024) return Error::InvalidArgument("an object key longer than 1024 bytes").set_path(at.bucket);
  return at;
}

std::string S3UriEncode(std::string_view text, bool keep_slash) {
  std::string out;
  out.reserve(text.size());
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (Unreserved(c) || (keep_slash && c == '/')) {
      out += ch;
    } else {
      out += '%';
      out += static_cast<char>(std::toupper(kHex[c >> 4]));
      out += static_cast<char>(std::toupper(kHex[c & 15]));
    }
  }
  return out;
}

std::string Sha256Hex(std::span<const std::byte> data) {
  unsigned char digest[32];
  gnutls_hash_fast(GNUTLS_DIG_SHA256, data.data(), data.size(), digest);
  std::string out;
  for (unsigned char b : digest) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  return out;
}

Error S3ErrorFor(int status, std::string_view body, const S3Location& at) {
  const std::string shown = at.shown();
  const auto doc = ParseS3Error(body);
  const std::string code = doc ? doc->code : std::string();
  const std::string tag = " (HTTP " + std::to_string(status) + (code.empty() ? "" : " " + code) + ")";
  auto named = [&](Error e) { return e.set_path(shown); };
  if (code == "NoSuchBucket") return named(Error::NotFound("the bucket " + at.bucket + " does not exist" + tag));
  if (code == "NoSuchKey") return named(Error::NotFound("no such object in bucket " + at.bucket + tag));
  if (code == "NoSuchUpload") return named(Error::NotFound("the multipart upload is gone (completed or aborted)" + tag));
  if (code == "SignatureDoesNotMatch") {
    return named(Error::InvalidArgument("the server refused the request signature for bucket " + at.bucket + tag +
                                        ": check the secret access key and the region"));
  }
  if (code == "InvalidAccessKeyId") {
    return named(Error::InvalidArgument("the server does not know the access key id" + tag +
                                        ": check AWS_ACCESS_KEY_ID or the profile"));
  }
  if (code == "RequestTimeTooSkewed") {
    return named(Error::InvalidArgument("this machine's clock differs too much from the object store's" + tag +
                                        ": set the time (NTP)"));
  }
  if (code == "QuotaExceeded") return named(Error::NoSpace("the quota of bucket " + at.bucket + " or its owner is full" + tag));
  if (code == "PreconditionFailed" || status == 412) {
    return named(Error::Busy("already exists: the object was created by someone else first" + tag));
  }
  if (code == "AccessDenied" || status == 403 || status == 401) {
    return named(Error::InvalidArgument("access denied to bucket " + at.bucket + tag +
                                        ": check the access key, the secret, the region and the bucket's policy"));
  }
  if (status == 404) return named(Error::NotFound("no such object, or no bucket " + at.bucket + tag));
  if (code == "SlowDown" || status >= 500 || status == 429 || status == 408) {
    return named(Error::IoError("the object store kept failing" + tag).set_retryable(true));
  }
  std::string message = doc && !doc->message.empty() ? ": " + doc->message.substr(0, 200) : "";
  for (char& c : message) {
    if (static_cast<unsigned char>(c) < ' ') c = ' ';
  }
  return named(Error::InvalidArgument("the object store refused the request" + tag + message));
}

struct S3Client::Call {
  Call(std::string m, const S3Location* a) : method(std::move(m)), at(a) {}
  std::string method;
  const S3Location* at;
  std::string query;
  std::vector<std::string> headers;
  std::span<const std::byte> body;
  std::string range;
};

S3Client::S3Client(HttpOptions http, std::string endpoint, std::unique_ptr<HttpClient> client)
    : http_(std::move(http)), endpoint_(std::move(endpoint)), client_(std::move(client)) {}

Result<std::unique_ptr<S3Client>> S3Client::Create(HttpOptions http) {
  S3Access& s3 = http.s3;
  if (s3.region.empty()) s3.region = "us-east-1";
  for (char c : s3.region) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-')) {
      return Error::InvalidArgument("not a region name: '" + s3.region.substr(0, 40) + "'");
    }
  }
  std::string endpoint = s3.endpoint.empty() ? "https://s3." + s3.region + ".amazonaws.com" : s3.endpoint;
  while (endpoint.ends_with('/')) endpoint.pop_back();
  if (auto st = CheckHttpUrl(endpoint); !st.ok()) return Error(st.error()).Wrap("S3 endpoint");
  const size_t host = endpoint.find("://") + 3;
  if (endpoint.find_first_of("/?#", host) != std::string::npos) {
    return Error::InvalidArgument("an S3 endpoint is scheme://HOST[:PORT], without a path").set_path(endpoint);
  }
  if (s3.access_key_id.empty() || s3.secret_access_key.empty()) {
    return Error::InvalidArgument(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a profile in ~/.aws/credentials "
        "(AWS_PROFILE)");
  }
  http.aws_sigv4 = "aws:amz:" + s3.region + ":s3";
  if (!s3.session_token.empty()) http.extra_headers.push_back("x-amz-security-token: " + s3.session_token);
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::Create(endpoint, http));
  return std::unique_ptr<S3Client>(new S3Client(std::move(http), std::move(endpoint), std::move(client)));
}

std::string S3Client::Url(const S3Location& at, std::string_view query) const {
  std::string url;
  const std::string key = at.key.empty() ? "" : "/" + S3UriEncode(at.key, true);
  if (http_.s3.virtual_host) {
    const size_t host = endpoint_.find("://") + 3;
    url = endpoint_.substr(0, host) + at.bucket + "." + endpoint_.substr(host) + (key.empty() ? "/" : key);
  } else {
    url = endpoint_ + "/" + at.bucket + key;
  }
  if (!query.empty()) url += "?" + std::string(query);
  return url;
}

Result<HttpReply> S3Client::Do(const Call& call) {
  HttpRequest req;
  req.method = call.method;
  req.url = Url(*call.at, call.query);
  req.headers = call.headers;
  // curl 7.88 signs what it is given but sends no payload hash of its own.
  req.headers.push_back("x-amz-content-sha256: " + Sha256Hex(call.body));
  if (call.method == "PUT" || call.method == "POST") {
    const bool xml = call.method == "POST";
    req.headers.push_back(xml ? "Content-Type: application/xml" : "Content-Type: application/octet-stream");
  }
  req.body = call.body;
  req.range = call.range;
  auto reply = client_->Send(req);
  if (!reply.ok()) return Error(reply.error()).set_path(call.at->shown());
  const int s = reply->head.status;
  if (s >= 500 || s == 429 || s == 408) {  // still failing after Send's retries
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%.1f", static_cast<double>(reply->elapsed_ms) / 1000.0);
    const Error e = S3ErrorFor(s, reply->body, *call.at);
    return Error::IoError("gave up after " + std::to_string(reply->attempts) + " attempts in " + seconds +
                          " s: " + std::string(e.message()))
        .set_path(call.at->shown())
        .set_retryable(true);
  }
  return reply;
}

Status S3Client::CreateBucket(const std::string& bucket) { return CreateBucket(bucket, false); }

Status S3Client::CreateBucket(const std::string& bucket, bool object_lock) {
  S3Location at{bucket, ""};
  Call call("PUT", &at);
  if (object_lock) call.headers.push_back("x-amz-bucket-object-lock-enabled: true");
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (Ok(r.head.status)) return {};
  auto doc = ParseS3Error(r.body);
  if (doc && doc->code == "BucketAlreadyOwnedByYou") return {};
  return S3ErrorFor(r.head.status, r.body, at);
}

Result<S3ObjectInfo> S3Client::Head(const S3Location& at) {
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(Call("HEAD", &at)));
  if (r.head.status == 404 && !at.key.empty()) {
    // A HEAD's answer has no body to say which is missing: ask the bucket.
    const S3Location bucket{at.bucket, ""};
    BARGE_ASSIGN_OR_RETURN(HttpReply b, Do(Call("HEAD", &bucket)));
    const char* code = b.head.status == 404 ? "NoSuchBucket" : "NoSuchKey";
    return S3ErrorFor(404, "<Error><Code>" + std::string(code) + "</Code></Error>", at);
  }
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
  if (!r.head.content_length) return Error::IoError("the object store sent no length").set_path(at.shown());
  S3ObjectInfo info;
  info.key = at.key;
  info.size = *r.head.content_length;
  info.etag = r.head.etag;
  info.last_modified = r.head.last_modified;
  return info;
}

Status S3Client::Get(const S3Location& at, uint64_t offset, std::span<std::byte> out) {
  if (out.empty()) return {};
  if (out.size() > HttpReply::kMaxBody) return Error::InvalidArgument("a GET larger than 16 MiB").set_path(at.shown());
  Call call("GET", &at);
  call.range = std::to_string(offset) + "-" + std::to_string(offset + out.size() - 1);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
  if (r.head.status != 206 && offset != 0) {
    return Error::IoError("the object store ignored the byte range (HTTP " + std::to_string(r.head.status) + ")")
        .set_path(at.shown());
  }
  if (r.body.size() < out.size()) {
    return Error::IoError("the object store sent " + std::to_string(r.body.size()) + " bytes of " +
                          std::to_string(out.size()) + " (past the object's end?)")
        .set_path(at.shown())
        .set_range(offset, out.size());
  }
  std::memcpy(out.data(), r.body.data(), out.size());
  return {};
}

Status S3Client::Put(const S3Location& at, std::span<const std::byte> body) { return Put(at, body, PutOptions{}); }

Status S3Client::PutIfAbsent(const S3Location& at, std::span<const std::byte> body) {
  return PutIfAbsent(at, body, PutOptions{});
}

Status S3Client::PutIfMatch(const S3Location& at, std::span<const std::byte> body, const std::string& etag) {
  Call call("PUT", &at);
  call.body = body;
  // Unquoted: radosgw compares the header with the stored ETag as is.
  std::string bare = etag;
  if (bare.size() >= 2 && bare.front() == '"' && bare.back() == '"') bare = bare.substr(1, bare.size() - 2);
  call.headers.push_back("If-Match: " + bare);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (r.head.status == 412) return Error::Busy("changed since it was read").set_path(at.shown());
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
  return {};
}

Status S3Client::Copy(const S3Location& from, const S3Location& to) {
  BARGE_ASSIGN_OR_RETURN(S3ObjectInfo source, Head(from));
  if (source.size > copy_limits_.single_max) return CopyInParts(from, to, source);
  Call call("PUT", &to);
  call.headers.push_back("x-amz-copy-source: " + CopySource(from));
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, r.head.status == 404 ? from : to);
  // A copy can fail after its 200 (the error document is the body).
  if (r.body.find("<Error>") != std::string::npos) return S3ErrorFor(500, r.body, to);
  return {};
}

Status S3Client::CopyInParts(const S3Location& from, const S3Location& to, const S3ObjectInfo& source) {
  // Parts of part_bytes, larger when 10,000 of them would not hold it.
  const uint64_t part_bytes = std::max<uint64_t>({copy_limits_.part_bytes, (source.size + 9999) / 10000, 1});
  BARGE_ASSIGN_OR_RETURN(std::string upload_id, CreateMultipart(to));
  std::vector<S3Part> parts;
  Status copied;
  for (uint64_t offset = 0; offset < source.size && copied.ok(); offset += part_bytes) {
    const int number = static_cast<int>(parts.size()) + 1;
    auto etag = UploadPartCopy(to, upload_id, number, from, offset, std::min(part_bytes, source.size - offset),
                               source.etag);
    if (etag.ok()) parts.push_back(S3Part{number, std::move(*etag)});
    else copied = std::move(etag).error();
  }
  if (copied.ok()) copied = CompleteMultipart(to, upload_id, parts);
  if (!copied.ok()) (void)AbortMultipart(to, upload_id);
  return copied;
}

Result<std::string> S3Client::UploadPartCopy(const S3Location& to, const std::string& upload_id, int part,
                                             const S3Location& from, uint64_t offset, uint64_t length,
                                             const std::string& if_etag) {
  if (part < 1 || part > 10000) return Error::InvalidArgument("a part number outside 1..10000").set_path(to.shown());
  if (length == 0) return Error::InvalidArgument("an empty part copy").set_path(to.shown());
  Call call("PUT", &to);
  call.query = Query({{"partNumber", std::to_string(part)}, {"uploadId", upload_id}});
  call.headers.push_back("x-amz-copy-source: " + CopySource(from));
  call.headers.push_back("x-amz-copy-source-range: bytes=" + std::to_string(offset) + "-" +
                         std::to_string(offset + length - 1));
  if (!if_etag.empty()) call.headers.push_back("x-amz-copy-source-if-match: " + if_etag);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (r.head.status == 412) {
    return Error::Corruption("the object changed while it was copied").set_path(from.shown());
  }
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, r.head.status == 404 ? from : to);
  if (ParseS3Error(r.body)) return S3ErrorFor(500, r.body, to);  // an error after the 200
  std::optional<std::string> etag = XmlText(r.body, "ETag");
  if (!etag || etag->empty()) return Error::IoError("the object store sent no ETag for a copied part").set_path(to.shown());
  return *etag;
}

Status S3Client::Delete(const S3Location& at) {
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(Call("DELETE", &at)));
  if (!Ok(r.head.status) && r.head.status != 404) return S3ErrorFor(r.head.status, r.body, at);
  if (r.head.status == 404) {
    auto doc = ParseS3Error(r.body);
    if (doc && doc->code == "NoSuchBucket") return S3ErrorFor(r.head.status, r.body, at);
  }
  return {};
}

Result<std::vector<S3ObjectInfo>> S3Client::List(const S3Location& at, int page_keys, size_t limit) {
  const S3Location bucket{at.bucket, ""};
  std::vector<S3ObjectInfo> out;
  std::string token;
  for (int pages = 0;; ++pages) {
    std::vector<std::pair<std::string, std::string>> params{
        {"list-type", "2"}, {"max-keys", std::to_string(page_keys)}, {"prefix", at.key}};
    if (!token.empty()) params.emplace_back("continuation-token", token);
    Call call("GET", &bucket);
    call.query = Query(std::move(params));
    BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
    if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
    auto page = ParseListObjectsV2(r.body);
    if (!page.ok()) return Error(page.error()).set_path(at.shown());
    for (auto& o : page->objects) out.push_back(std::move(o));
    if (!page->truncated || (limit > 0 && out.size() >= limit)) return out;
    if (page->next_token == token || pages > 1000000) {
      return Error::Corruption("the object store's listing does not advance").set_path(at.shown());
    }
    token = page->next_token;
  }
}

Result<std::string> S3Client::CreateMultipart(const S3Location& at) { return CreateMultipart(at, PutOptions{}); }

Result<std::string> S3Client::UploadPart(const S3Location& at, const std::string& upload_id, int part,
                                         std::span<const std::byte> body) {
  if (part < 1 || part > 10000) return Error::InvalidArgument("a part number outside 1..10000").set_path(at.shown());
  Call call("PUT", &at);
  call.query = Query({{"partNumber", std::to_string(part)}, {"uploadId", upload_id}});
  call.body = body;
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
  if (r.head.etag.empty()) return Error::IoError("the object store sent no ETag for a part").set_path(at.shown());
  return r.head.etag;
}

Result<std::vector<S3Part>> S3Client::ListParts(const S3Location& at, const std::string& upload_id) {
  std::vector<S3Part> out;
  std::string marker;
  for (;;) {
    std::vector<std::pair<std::string, std::string>> params{{"uploadId", upload_id}};
    if (!marker.empty()) params.emplace_back("part-number-marker", marker);
    Call call("GET", &at);
    call.query = Query(std::move(params));
    BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
    if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
    auto page = ParseListParts(r.body);
    if (!page.ok()) return Error(page.error()).set_path(at.shown());
    for (auto& p : page->parts) out.push_back(std::move(p));
    if (!page->truncated) return out;
    if (page->next_marker == marker) return Error::Corruption("the object store's part listing does not advance").set_path(at.shown());
    marker = page->next_marker;
  }
}

Status S3Client::CompleteMultipart(const S3Location& at, const std::string& upload_id,
                                   const std::vector<S3Part>& parts) {
  std::string doc = "<CompleteMultipartUpload>";
  for (const S3Part& p : parts) {
    doc += "<Part><PartNumber>" + std::to_string(p.number) + "</PartNumber><ETag>" + XmlEscape(p.etag) +
           "</ETag></Part>";
  }
  doc += "</CompleteMultipartUpload>";
  Call call("POST", &at);
  call.query = Query({{"uploadId", upload_id}});
  call.body = std::as_bytes(std::span(doc));
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  // S3 may answer 200 and put the error in the body.
  if (!Ok(r.head.status) || ParseS3Error(r.body)) return S3ErrorFor(Ok(r.head.status) ? 500 : r.head.status, r.body, at);
  return {};
}

Status S3Client::AbortMultipart(const S3Location& at, const std::string& upload_id) {
  Call call("DELETE", &at);
  call.query = Query({{"uploadId", upload_id}});
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
  return {};
}

Result<std::vector<S3MultipartUpload>> S3Client::ListMultipartUploads(const S3Location& at) {
  const S3Location bucket{at.bucket, ""};
  std::vector<S3MultipartUpload> out;
  std::string key_marker, id_marker;
  for (;;) {
    std::vector<std::pair<std::string, std::string>> params{{"uploads", ""}, {"prefix", at.key}};
    if (!key_marker.empty()) params.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) params.emplace_back("upload-id-marker", id_marker);
    Call call("GET", &bucket);
    call.query = Query(std::move(params));
    BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
    if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
    auto page = ParseListMultipartUploads(r.body);
    if (!page.ok()) return Error(page.error()).set_path(at.shown());
    for (auto& u : page->uploads) out.push_back(std::move(u));
    if (!page->truncated) return out;
    if (page->next_key_marker == key_marker && page->next_upload_id_marker == id_marker) {
      return Error::Corruption("the object store's upload listing does not advance").set_path(at.shown());
    }
    key_marker = page->next_key_marker;
    id_marker = page->next_upload_id_marker;
  }
}

// --- Object Lock (issue 40) ---

namespace {

// The base64 MD5 of `data` (Content-MD5: S3 demands it, or a checksum
// header, on requests that set retention).
std::string ContentMd5(std::span<const std::byte> data) {
  unsigned char digest[16];
  gnutls_hash_fast(GNUTLS_DIG_MD5, data.data(), data.size(), digest);
  static constexpr std::string_view kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < sizeof digest; i += 3) {
    const uint32_t n = (uint32_t{digest[i]} << 16) | (i + 1 < sizeof digest ? uint32_t{digest[i + 1]} << 8 : 0) |
                       (i + 2 < sizeof digest ? uint32_t{digest[i + 2]} : 0);
    out += kB64[(n >> 18) & 63];
    out += kB64[(n >> 12) & 63];
    out += i + 1 < sizeof digest ? kB64[(n >> 6) & 63] : '=';
    out += i + 2 < sizeof digest ? kB64[n & 63] : '=';
  }
  return "Content-MD5: " + out;
}

std::string VersionQuery(std::string_view name, const std::string& version_id) {
  return version_id.empty() ? std::string(name) + "=" : Query({{std::string(name), ""}, {"versionId", version_id}});
}

// The object-lock headers (and the Content-MD5 they require) of a new object.
void AddLockHeadersTo(const S3Client::PutOptions& options, std::span<const std::byte> body,
                      std::vector<std::string>& headers) {
  if (!options.retention) return;
  headers.push_back("x-amz-object-lock-mode: " + std::string(S3LockModeName(options.retention->mode)));
  headers.push_back("x-amz-object-lock-retain-until-date: " + S3IsoTime(options.retention->until_unix));
  headers.push_back(ContentMd5(body));
}

// A refusal of a retention request: the clear error when the bucket has no
// Object Lock, else what the answer says.
Error RetentionRefused(S3Client& client, const HttpReply& r, const S3Location& at) {
  auto doc = ParseS3Error(r.body);
  const bool missing = doc && (doc->code == "NoSuchKey" || doc->code == "NoSuchBucket" || doc->code == "NoSuchVersion");
  if (!missing) {
    auto enabled = client.GetObjectLockEnabled(at.bucket);
    if (enabled.ok() && !*enabled) {
      return Error::InvalidArgument("bucket " + at.bucket +
                                    " was not created with Object Lock; retention needs a bucket with it enabled "
                                    "(aws s3api create-bucket --object-lock-enabled-for-bucket)")
          .set_path(at.shown());
    }
  }
  return S3ErrorFor(r.head.status, r.body, at);
}

}  // namespace

Result<bool> S3Client::GetObjectLockEnabled(const std::string& bucket) {
  const S3Location at{bucket, ""};
  Call call("GET", &at);
  call.query = "object-lock=";
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (Ok(r.head.status)) {
    auto enabled = ParseObjectLockConfiguration(r.body);
    if (!enabled.ok()) return Error(enabled.error()).set_path(at.shown());
    return enabled;
  }
  auto doc = ParseS3Error(r.body);
  if (doc && (doc->code == "ObjectLockConfigurationNotFoundError" || doc->code == "InvalidRequest")) return false;
  return S3ErrorFor(r.head.status, r.body, at);
}

Status S3Client::Put(const S3Location& at, std::span<const std::byte> body, const PutOptions& options) {
  Call call("PUT", &at);
  call.body = body;
  AddLockHeadersTo(options, body, call.headers);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return options.retention ? RetentionRefused(*this, r, at) : S3ErrorFor(r.head.status, r.body, at);
  return {};
}

Status S3Client::PutIfAbsent(const S3Location& at, std::span<const std::byte> body, const PutOptions& options) {
  Call call("PUT", &at);
  call.body = body;
  call.headers.push_back("If-None-Match: *");
  AddLockHeadersTo(options, body, call.headers);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (r.head.status == 412 || !options.retention) {
    if (!Ok(r.head.status)) return S3ErrorFor(r.head.status, r.body, at);
  }
  if (!Ok(r.head.status)) return RetentionRefused(*this, r, at);
  return {};
}

Result<std::string> S3Client::CreateMultipart(const S3Location& at, const PutOptions& options) {
  Call call("POST", &at);
  call.query = "uploads=";
  AddLockHeadersTo(options, {}, call.headers);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return options.retention ? RetentionRefused(*this, r, at) : S3ErrorFor(r.head.status, r.body, at);
  auto id = ParseInitiateMultipart(r.body);
  if (!id.ok()) return Error(id.error()).set_path(at.shown());
  return id;
}

Status S3Client::PutRetention(const S3Location& at, const S3Retention& retention, const std::string& version_id) {
  const std::string doc = "<Retention xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Mode>" +
                          std::string(S3LockModeName(retention.mode)) + "</Mode><RetainUntilDate>" +
                          S3IsoTime(retention.until_unix) + "</RetainUntilDate></Retention>";
  Call call("PUT", &at);
  call.query = VersionQuery("retention", version_id);
  call.body = std::as_bytes(std::span(doc));
  call.headers.push_back(ContentMd5(call.body));
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) return RetentionRefused(*this, r, at);
  return {};
}

Result<S3Retention> S3Client::GetRetention(const S3Location& at, const std::string& version_id) {
  Call call("GET", &at);
  call.query = VersionQuery("retention", version_id);
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (!Ok(r.head.status)) {
    Error refused = RetentionRefused(*this, r, at);  // a bucket without Object Lock first
    auto doc = ParseS3Error(r.body);
    const bool none = doc && (doc->code == "NoSuchObjectLockConfiguration" || doc->code == "ObjectLockConfigurationNotFoundError");
    if (none && refused.code() == ErrorCode::kNotFound) {
      return Error::NotFound("the object has no retention").set_path(at.shown());
    }
    return refused;
  }
  auto retention = ParseRetention(r.body);
  if (!retention.ok()) return Error(retention.error()).set_path(at.shown());
  return retention;
}

Status S3Client::DeleteVersion(const S3Location& at, const std::string& version_id) {
  if (version_id.empty()) return Error::InvalidArgument("DeleteVersion without a version id").set_path(at.shown());
  Call call("DELETE", &at);
  call.query = Query({{"versionId", version_id}});
  BARGE_ASSIGN_OR_RETURN(HttpReply r, Do(call));
  if (Ok(r.head.status)) return {};
  if (r.head.status == 403) {
    // S3 says only AccessDenied: the version's retention says why.
    auto retention = GetRetention(at, version_id);
    if (retention.ok() && retention->until_unix > static_cast<int64_t>(::time(nullptr))) {
      return Error::InvalidArgument(at.shown() + " is locked until " + S3IsoTime(retention->until_unix) + " (" +
                                    std::string(S3LockModeName(retention->mode)) + ")")
          .set_path(at.shown());
    }
  }
  return S3ErrorFor(r.head.status, r.body, at);
}

}  // namespace barge
