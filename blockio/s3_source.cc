// OpenS3Source: S3Client's HEAD, then HttpSource over a signed HttpClient.
#include "blockio/s3_source.h"

#include "blockio/s3_client.h"

namespace barge {

Result<HttpSourceOpened> OpenS3Source(const std::string& url, const HttpOptions& options) {
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
  std::unique_ptr<S3Client> s3 = std::move(*created);
  BARGE_ASSIGN_OR_RETURN(S3ObjectInfo info, s3->Head(at));
  HttpOptions reader = s3->signed_options();
  reader.extra_headers.push_back("x-amz-content-sha256: " + Sha256Hex({}));  // a GET has no body
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<HttpClient> client, HttpClient::Create(s3->Url(at), reader));
  HttpSourceOpened out;
  out.object.length_bytes = info.size;
  out.object.etag = info.etag;
  out.object.last_modified = info.last_modified;
  out.object.ranges = true;
  out.source = MakeHttpSource(std::move(client), out.object, at.shown());
  return out;
}

}  // namespace barge
