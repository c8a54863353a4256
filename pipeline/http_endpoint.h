// What a command's flags say about the http(s) URLs it reads (--ca-file,
// --netrc-file, --header-file), and the checks made on those files before
// libcurl reads them.
#pragma once

#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/http_client.h"
#include "blockio/source.h"
#include "formats/image.h"

namespace barge::pipeline {

// `options` after checking its files through `env`: the netrc file must be
// a regular file readable by its owner only (CheckPrivateFile), the CA
// file must exist and be a regular file; kNotFound / kInvalidArgument
// naming the file otherwise. The header file (CheckPrivateFile too) is
// read into `headers` (ReadHeaderFile).
// The header lines of `path`: "Name: value" lines (a name of letters,
// digits, '-' and '_'); blank lines and '#' comments skipped. Errors name
// the file and a line's number, never a line's text (it holds secrets).
Result<std::vector<std::string>> ReadHeaderFile(Env& env, const std::string& path);

Result<HttpOptions> HttpOptionsFor(Env& env, const HttpOptions& options);

// The image in `object`, one object read from a URL or a stream (standard
// input), named `name` in messages: qcow2 or raw as `options.format` says
// or as probed. It is the image's only file: a qcow2 that names a backing
// or data file is refused (kInvalidArgument) when it is opened, and no name
// inside it is resolved against this machine's folders.
Result<std::unique_ptr<formats::Image>> OpenObjectImage(std::unique_ptr<BlockSource> object, const std::string& name,
                                                        formats::OpenOptions options);

}  // namespace barge::pipeline
