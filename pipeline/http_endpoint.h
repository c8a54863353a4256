// What a command's flags say about the http(s) URLs it reads (--ca-file,
// --netrc-file), and the checks made on those files before libcurl reads them.
#pragma once

#include "blockio/env.h"
#include "blockio/http_client.h"

namespace barge::pipeline {

// `options` after checking its files through `env`: the netrc file must be
// a regular file readable by its owner only (CheckPrivateFile), the CA
// file must exist and be a regular file; kNotFound / kInvalidArgument
// naming the file otherwise.
Result<HttpOptions> HttpOptionsFor(Env& env, const HttpOptions& options);

}  // namespace barge::pipeline
