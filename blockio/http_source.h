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

}  // namespace barge
