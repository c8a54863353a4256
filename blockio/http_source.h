// A remote object over HTTP(S) as a read-only BlockSource: every read is a
// ranged GET (several in flight, one connection each), so the qcow2 and raw
// readers read a URL as they read a file.
#pragma once

#include <memory>
#include <string>

#include "blockio/http_client.h"
#include "blockio/source.h"

namespace barge {

// Probes `url` (HttpClient::Probe) and returns the source. Refused:
// kNotSupported for a server that does not serve byte ranges, and what
// Probe refuses. name() is the URL without credentials (RedactHttpUrl).
// Reads are ReadRange: a changed object is kCorruption, never mixed bytes.
// Thread-safe.
struct HttpSourceOpened {
  std::unique_ptr<BlockSource> source;
  HttpObject object;  // what the probe said: length and validators
};
Result<HttpSourceOpened> OpenHttpSource(const std::string& url, const HttpOptions& options);

// The source of an object already described (`object`, ranges true),
// named `name` (e.g. "s3://BUCKET/KEY"): what OpenHttpSource returns after
// its probe, for callers that learnt the object otherwise (an S3 HEAD).
std::unique_ptr<BlockSource> MakeHttpSource(std::unique_ptr<HttpClient> client, HttpObject object, std::string name);

}  // namespace barge
