// An S3 object as a read-only BlockSource: HEAD once for its size, ETag
// and Last-Modified, then every read a signed ranged GET through the same
// HttpSource as http(s):// images (blockio/http_source.h), so a changed
// object is kCorruption, never mixed bytes.
#pragma once

#include <string>

#include "blockio/http_source.h"

namespace barge {

// `url` is s3://BUCKET/KEY; `options.s3` says where and as whom. name() is
// the s3:// URL. Errors: ParseS3Url's and S3Client::Create's; the HEAD's
// (kNotFound naming the bucket or key, kInvalidArgument for refused
// credentials); kInvalidArgument for a location that names no object (a
// bucket or a prefix ending in '/').
Result<HttpSourceOpened> OpenS3Source(const std::string& url, const HttpOptions& options);

// The same for an object already known (a listing gave its size and ETag):
// no HEAD. Every read still requires that ETag (a changed object is
// kCorruption); a missing one is the first read's kNotFound.
Result<HttpSourceOpened> OpenS3SourceKnown(const std::string& url, const HttpOptions& options, uint64_t size,
                                           const std::string& etag);

}  // namespace barge
