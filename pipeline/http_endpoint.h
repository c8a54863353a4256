// What a command's flags say about the http(s) URLs it reads (--ca-file,
// --netrc-file), and the checks made on those files before libcurl reads them.
#pragma once

#include "blockio/env.h"
#include "blockio/http_client.h"
#include "blockio/source.h"
#include "formats/image.h"

namespace barge::pipeline {

// `options` after checking its files through `env`: the netrc file must be
// a regular file readable by its owner only (CheckPrivateFile), the CA
// file must exist and be a regular file; kNotFound / kInvalidArgument
// naming the file otherwise.
Result<HttpOptions> HttpOptionsFor(Env& env, const HttpOptions& options);

// The image in `object`, one object read from a URL or a stream (standard
// input), named `name` in messages: qcow2 or raw as `options.format` says
// or as probed. It is the image's only file: a qcow2 that names a backing
// or data file is refused (kInvalidArgument) when it is opened, and no name
// inside it is resolved against this machine's folders.
Result<std::unique_ptr<formats::Image>> OpenObjectImage(std::unique_ptr<BlockSource> object, const std::string& name,
                                                        formats::OpenOptions options);

}  // namespace barge::pipeline
