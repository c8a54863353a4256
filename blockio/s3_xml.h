// Reading what an S3 server answers: its XML error documents and the
// listings (ListObjectsV2, ListParts, ListMultipartUploads) and the upload
// id of a new multipart upload. The bytes are untrusted: every function
// accepts any input, never reads past it and reports what it could not read
// (fuzz/s3_xml_fuzzer.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"

namespace barge {

// The inner text of each <TAG>...</TAG> (or <TAG attr=...>) element of
// `xml`, in order, not decoded; an element without its end is left out.
std::vector<std::string_view> XmlElements(std::string_view xml, std::string_view tag);
// The first TAG element's text with the five XML entities and &#N;/&#xN;
// decoded; nullopt when there is none.
std::optional<std::string> XmlText(std::string_view xml, std::string_view tag);

// <Error><Code>NoSuchBucket</Code><Message>...</Message></Error>; nullopt
// when the document has no Code. The code keeps only letters, digits and
// . _ - (64 at most); control characters of the message become blanks.
struct S3ErrorBody {
  std::string code;
  std::string message;
};
std::optional<S3ErrorBody> ParseS3Error(std::string_view xml);

struct S3ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;           // as sent, quotes included
  std::string last_modified;
};
struct S3ObjectPage {
  std::vector<S3ObjectInfo> objects;
  bool truncated = false;
  std::string next_token;  // NextContinuationToken
};
// kCorruption for a document that is no ListBucketResult or whose entries
// lack a key or carry a size that is no number.
Result<S3ObjectPage> ParseListObjectsV2(std::string_view xml);

struct S3Part {
  int number = 0;
  std::string etag;
  uint64_t size = 0;
};
struct S3PartPage {
  std::vector<S3Part> parts;
  bool truncated = false;
  std::string next_marker;  // NextPartNumberMarker
};
Result<S3PartPage> ParseListParts(std::string_view xml);

struct S3MultipartUpload {  // an unfinished multipart upload (ListMultipartUploads)
  std::string key;
  std::string upload_id;
  std::string initiated;
};
struct S3UploadPage {
  std::vector<S3MultipartUpload> uploads;
  bool truncated = false;
  std::string next_key_marker, next_upload_id_marker;
};
Result<S3UploadPage> ParseListMultipartUploads(std::string_view xml);

// The UploadId of an InitiateMultipartUploadResult; kCorruption without one.
Result<std::string> ParseInitiateMultipart(std::string_view xml);

// --- Object Lock (issue 40) ---

// An object version's retention: until `until_unix` (seconds since the
// epoch, UTC) it cannot be deleted or overwritten; COMPLIANCE retention
// cannot be shortened or removed by anyone, GOVERNANCE by a user allowed
// to bypass it.
enum class S3LockMode { kCompliance, kGovernance };
struct S3Retention {
  S3LockMode mode = S3LockMode::kCompliance;
  int64_t until_unix = 0;
};
std::string_view S3LockModeName(S3LockMode mode);  // "COMPLIANCE", "GOVERNANCE"
// "YYYY-MM-DDTHH:MM:SSZ" (UTC), as S3 wants it.
std::string S3IsoTime(int64_t unix_seconds);
// The inverse, also accepting a fraction of a second and a missing 'Z';
// nullopt for anything else.
std::optional<int64_t> ParseS3IsoTime(std::string_view text);

// GetObjectLockConfiguration's answer: whether ObjectLockEnabled is
// "Enabled". kCorruption for a document that is no ObjectLockConfiguration.
Result<bool> ParseObjectLockConfiguration(std::string_view xml);
// GetObjectRetention's answer. kCorruption for no Retention, a mode other
// than COMPLIANCE/GOVERNANCE or a date ParseS3IsoTime refuses.
Result<S3Retention> ParseRetention(std::string_view xml);

}  // namespace barge
