// A remote object over HTTP(S) as a read-only BlockSource: every read is a
// ranged GET (several in flight, one connection each), so the qcow2 and raw
// readers read a URL as they read a file.
#pragma once

#include <memory>
#include <string>

#include "blockio/env.h"
#include "blockio/http_client.h"
#include "blockio/source.h"

namespace barge {

// Probes `url` (HttpClient::Probe) and returns the source: errors are what
// Probe refuses. name() is the URL without credentials (RedactHttpUrl).
// Reads are ReadRange: a changed object is kCorruption, never mixed bytes.
// A server that serves no byte ranges (it answers a Range request with the
// whole file) is read once, front to back (HttpClient::ReadWhole), into a
// private file under options.stage_dir (StageStream, through `env`) after
// telling options.on_sequential; the source then reads that file.
// Thread-safe.
struct HttpSourceOpened {
  std::unique_ptr<BlockSource> source;
  HttpObject object;        // what the probe said: length and validators
  bool sequential = false;  // read once into a private file (no ranges)
};
Result<HttpSourceOpened> OpenHttpSource(Env& env, const std::string& url, const HttpOptions& options);

// The source of an object already described (`object`, ranges true),
// named `name` (e.g. "s3://BUCKET/KEY"): what OpenHttpSource returns after
// its probe, for callers that learnt the object otherwise (an S3 HEAD).
std::unique_ptr<BlockSource> MakeHttpSource(std::unique_ptr<HttpClient> client, HttpObject object, std::string name);

}  // namespace barge
