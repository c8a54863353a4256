// Flags of every command that reads http(s):// URLs and s3:// objects: the
// authorities TLS verifies the server with, a netrc file or a header file of
// credentials, the stall timeout, the S3 endpoint and region; S3 keys and the
// rest come from the environment and the AWS files (blockio/s3_config.h),
// read once the flags are parsed.
#pragma once

#include <CLI/CLI.hpp>

#include "blockio/http_client.h"
#include "cli/output.h"

namespace barge::cli {

// Registers --ca-file, --netrc-file, --header-file, --http-timeout,
// --s3-endpoint, --s3-region and --s3-addressing-style on `app`, filling `options` (which must outlive the parse),
// and fills options.s3 from the environment after parsing. The files are
// read and checked when the source opens (pipeline::HttpOptionsFor).
void AddHttpFlags(CLI::App* app, HttpOptions& options);

// The flags of a command that takes a chain location (list, verify,
// restore, merge, export, files, forget, sync): --ca-file, --http-timeout,
// --s3-endpoint, --s3-region and --s3-addressing-style, as AddHttpFlags
// registers them, for its s3:// locations (SetBucketHttpOptions).
void AddBucketFlags(CLI::App* app);

// ResolveS3Access of `flags` with this process's environment and the AWS
// files read through the POSIX Env: the one place the cli reads them.
Result<S3Access> ResolveS3AccessFromEnvironment(const S3Access& flags);

struct HttpFlags {
  HttpOptions options;

  // AddHttpFlags(app, options).
  void AddTo(CLI::App* app);

  // The options for reading `source`, with on_sequential telling `out` (a
  // "sequential_read" notice, docs/json.md) when a server without byte
  // ranges is read once, front to back. kInvalidArgument (a usage error)
  // for --ca-file with an http:// source: TLS asked for is TLS required,
  // so a plain http URL is a mistake, never silently read in the clear.
  Result<HttpOptions> OptionsFor(Output& out, const std::string& source) const;
};

}  // namespace barge::cli
