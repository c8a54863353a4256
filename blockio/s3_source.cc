// OpenS3Source: S3Client's HEAD, then HttpSource over a signed HttpClient.
#include "blockio/s3_source.h"

#include "blockio/s3_client.h"

namespace barge {

namespace {

// The client of `url` (an object's s3:// URL), its location in *at.
Result<std::unique_ptr<S3Client>> ClientOf(const std::string& url, const HttpOptions& options, S3Location* at_out) {
  BARGE_ASSIGN_OR_RETURN(S3Location at, ParseS3Url(url));
  if (at.key.empty() || at.key.ends_with('/')) {
    return Error::InvalidArgument("names no object (give s3://BUCKET/KEY of one image)").set_path(at.shown());
  }
  auto created = S3Client::Create(options);
  if (!created.ok()) {
    // Missing keys or a bad endpoint: named by the object the user gave.
    Error e = created.error();
    if (e.path().empty()) e.set_path(at.shown());
    return e;
  }
  *at_out = std::move(at);
  return std::move(*created);
}

// The source over `s3`'s signed GETs of `at`, described by `info`.
Result<HttpSourceOpened> SourceOf(S3Client& s3, const S3Location& at, const S3ObjectInfo& info) {
  HttpOptions reader = s3.signed_options();
  reader.extra_headers.push_back("x-amz-content-sha256: " + Sha256Hex({}));  // a GET has no body
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::Create(s3.Url(at), reader));
  HttpSourceOpened out;
  out.object.length_bytes = info.size;
  out.object.etag = info.etag;
  out.object.last_modified = info.last_modified;
  out.object.ranges = true;
  out.source = MakeHttpSource(std::move(client), out.object, at.shown());
  return out;
}

}  // namespace

Result<HttpSourceOpened> OpenS3Source(const std::string& url, const HttpOptions& options) {
  S3Location at;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> s3, ClientOf(url, options, &at));
  BARGE_ASSIGN_OR_RETURN(S3ObjectInfo info, s3->Head(at));
  return SourceOf(*s3, at, info);
}

Result<HttpSourceOpened> OpenS3SourceKnown(const std::string& url, const HttpOptions& options, uint64_t size,
                                           const std::string& etag) {
  S3Location at;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> s3, ClientOf(url, options, &at));
  S3ObjectInfo info;
  info.size = size;
  info.etag = etag;
  return SourceOf(*s3, at, info);
}

}  // namespace barge
