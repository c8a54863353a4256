// An S3 client on the one HTTP layer (blockio/http_client.h): requests
// signed with AWS Signature V4 by libcurl, path-style (or virtual-host)
// addressing, TLS verified, retries with backoff and jitter on 5xx,
// SlowDown and timeouts (HttpClient::Send). S3 error documents become
// barge's error codes with one line naming s3://BUCKET/KEY, never a key or
// secret. Tested against a real Ceph radosgw (blockio/s3_client_test.cc,
// tests/testing/radosgw.h).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "blockio/http_client.h"
#include "blockio/s3_xml.h"

namespace barge {

// True for "s3://" locations (scheme case-insensitive).
bool IsS3Url(std::string_view location);

// s3://BUCKET[/KEY-OR-PREFIX]. kInvalidArgument for another scheme, a
// bucket name S3 refuses (3-63 of a-z 0-9 . -, starting and ending with a
// letter or digit), control characters, or credentials in the URL.
struct S3Location {
  std::string bucket;
  std::string key;  // "" = the whole bucket; may end with '/' (a prefix)
  std::string shown() const;  // "s3://BUCKET/KEY"
};
Result<S3Location> ParseS3Url(std::string_view url);

// AWS's URI encoding: every byte but A-Z a-z 0-9 - . _ ~ (and '/' when
// `keep_slash`) as %XX, upper-case hex.
std::string S3UriEncode(std::string_view text, bool keep_slash);

// The hex SHA-256 of `data` (x-amz-content-sha256).
std::string Sha256Hex(std::span<const std::byte> data);

// Thread-safe: requests share HttpClient's pool of connections.
class S3Client {
 public:
  // `http` carries the endpoint, region and keys in http.s3; its TLS and
  // timeout settings apply. kInvalidArgument for an endpoint that is not an
  // http(s) URL with a host and nothing after it, or keys missing.
  static Result<std::unique_ptr<S3Client>> Create(HttpOptions http);

  // The URL of an object ("" key: the bucket) with `query` appended as
  // given (already sorted and encoded).
  std::string Url(const S3Location& at, std::string_view query = {}) const;

  Status CreateBucket(const std::string& bucket);  // exists already: ok
  // Size, ETag and Last-Modified of an object; kNotFound when it or its
  // bucket is missing.
  Result<S3ObjectInfo> Head(const S3Location& at);
  // Exactly out.size() bytes at `offset`; a short answer is kIoError.
  Status Get(const S3Location& at, uint64_t offset, std::span<std::byte> out);
  Status Put(const S3Location& at, std::span<const std::byte> body);
  // PUT with If-None-Match: * : kBusy "already exists" (412) when the key
  // exists, so that two writers never both create it.
  Status PutIfAbsent(const S3Location& at, std::span<const std::byte> body);
  Status Delete(const S3Location& at);  // a missing key is ok (S3's rule)
  // PUT with If-Match: `etag` (as Head gave it): replaces the object only
  // while it is still the version read. kBusy "changed since it was read"
  // (412) otherwise; kNotFound when it is gone.
  Status PutIfMatch(const S3Location& at, std::span<const std::byte> body, const std::string& etag);
  // A server-side copy of `from` to `to`: one PUT with x-amz-copy-source up
  // to copy_limits().single_max bytes; above it (S3 refuses a single copy
  // over 5 GiB) a multipart upload of UploadPartCopy parts of
  // copy_limits().part_bytes (more when 10,000 parts would not hold it),
  // every part required to come from the ETag the HEAD saw (a source
  // replaced meanwhile: kCorruption), aborted on failure. kNotFound when
  // `from` is missing.
  Status Copy(const S3Location& from, const S3Location& to);
  // One part of a multipart upload of `to`, copied server-side from bytes
  // [offset, offset + length) of `from` (x-amz-copy-source-range), from its
  // version `if_etag` when not "" (else kCorruption). The part's ETag.
  Result<std::string> UploadPartCopy(const S3Location& to, const std::string& upload_id, int part,
                                     const S3Location& from, uint64_t offset, uint64_t length,
                                     const std::string& if_etag = {});
  struct CopyLimits {
    uint64_t single_max = uint64_t{5} << 30;  // S3's limit for one CopyObject
    uint64_t part_bytes = uint64_t{512} << 20;  // 5 MiB..5 GiB on AWS
  };
  // Set before the client is shared (a test forces the multipart path with
  // a few MiB); not synchronized with copies in flight.
  void set_copy_limits(CopyLimits limits) { copy_limits_ = limits; }
  const CopyLimits& copy_limits() const { return copy_limits_; }
  // Every object whose key starts with at.key (ListObjectsV2, all pages of
  // up to `page_keys` keys each); with `limit` > 0, no further page once
  // `limit` objects came (one page of one key says whether a prefix holds
  // anything).
  Result<std::vector<S3ObjectInfo>> List(const S3Location& at, int page_keys = 1000, size_t limit = 0);

  // Multipart upload: parts 1..10000, each but the last at least the
  // server's minimum (5 MiB on AWS).
  Result<std::string> CreateMultipart(const S3Location& at);  // the upload id
  Result<std::string> UploadPart(const S3Location& at, const std::string& upload_id, int part,
                                 std::span<const std::byte> body);  // the part's ETag
  Result<std::vector<S3Part>> ListParts(const S3Location& at, const std::string& upload_id);
  // `parts` in ascending number, with the ETags UploadPart or ListParts gave.
  Status CompleteMultipart(const S3Location& at, const std::string& upload_id, const std::vector<S3Part>& parts);
  Status AbortMultipart(const S3Location& at, const std::string& upload_id);
  // Unfinished uploads of keys under at.key (all pages).
  Result<std::vector<S3MultipartUpload>> ListMultipartUploads(const S3Location& at);

  // The options of a signed HttpClient for ranged reads of objects (the
  // ranged source of s3:// images, blockio/http_source.h).
  const HttpOptions& signed_options() const { return http_; }

  // --- Object Lock (issue 40) ---
  // A bucket created with Object Lock enabled (and so with versioning):
  // objects in it can carry retention. Exists already: ok, as it is.
  Status CreateBucket(const std::string& bucket, bool object_lock);
  // Whether the bucket has Object Lock enabled; a bucket created without
  // it: false (not an error). kNotFound for no such bucket.
  Result<bool> GetObjectLockEnabled(const std::string& bucket);
  // What a new object carries: retention (S3's x-amz-object-lock-mode and
  // x-amz-object-lock-retain-until-date), sent with a Content-MD5.
  struct PutOptions {
    std::optional<S3Retention> retention;
  };
  Status Put(const S3Location& at, std::span<const std::byte> body, const PutOptions& options);
  Status PutIfAbsent(const S3Location& at, std::span<const std::byte> body, const PutOptions& options);
  Result<std::string> CreateMultipart(const S3Location& at, const PutOptions& options);
  // Sets the retention of the object's version `version_id` ("" the
  // current one). Extending is always allowed; shortening COMPLIANCE
  // retention is refused by the server (kInvalidArgument, AccessDenied).
  // On a bucket without Object Lock: kInvalidArgument "bucket B was not
  // created with Object Lock".
  Status PutRetention(const S3Location& at, const S3Retention& retention, const std::string& version_id = {});
  // The version's retention; kNotFound when it has none (or no such
  // object); the bucket-without-Object-Lock error as PutRetention.
  Result<S3Retention> GetRetention(const S3Location& at, const std::string& version_id = {});
  // Deletes one version for good. A version under retention is refused:
  // kInvalidArgument "s3://B/K is locked until T (COMPLIANCE)".
  Status DeleteVersion(const S3Location& at, const std::string& version_id);

  // Implementation (s3_client.cc).
  struct Call;

 private:
  S3Client(HttpOptions http, std::string endpoint, std::unique_ptr<HttpClient> client);
  Result<HttpReply> Do(const Call& call);
  Status CopyInParts(const S3Location& from, const S3Location& to, const S3ObjectInfo& source);

  const HttpOptions http_;
  const std::string endpoint_;  // scheme://host[:port], no trailing '/'
  const std::unique_ptr<HttpClient> client_;
  CopyLimits copy_limits_;
};

// The error an S3 answer means (status and XML error document), naming
// `at`: NoSuchBucket/NoSuchKey/NoSuchUpload kNotFound; AccessDenied,
// InvalidAccessKeyId, SignatureDoesNotMatch, RequestTimeTooSkewed
// kInvalidArgument; QuotaExceeded kNoSpace; PreconditionFailed (412) kBusy
// "already exists"; SlowDown and 5xx kIoError (retryable); other 4xx
// kInvalidArgument. Public for tests and the fuzz target.
Error S3ErrorFor(int status, std::string_view body, const S3Location& at);

}  // namespace barge
