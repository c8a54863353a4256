// Flags of every command that reads http(s):// URLs: the authorities TLS
// verifies the server with, a netrc file or a header file of credentials,
// the stall timeout.
#pragma once

#include <CLI/CLI.hpp>

#include "blockio/http_client.h"

namespace barge::cli {

// Registers --ca-file, --netrc-file, --header-file and --http-timeout on
// `app`, filling `options` (which must outlive the parse). The files are
// read and checked when the source opens (pipeline::HttpOptionsFor).
void AddHttpFlags(CLI::App* app, HttpOptions& options);

struct HttpFlags {
  HttpOptions options;

  // AddHttpFlags(app, options).
  void AddTo(CLI::App* app);
};

}  // namespace barge::cli
