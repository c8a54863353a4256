// Flags of every command that reads http(s):// URLs: the authorities TLS
// verifies the server with, a netrc file of credentials, the stall timeout.
#pragma once

#include <CLI/CLI.hpp>

#include "blockio/http_client.h"

namespace barge::cli {

struct HttpFlags {
  HttpOptions options;

  // Registers --ca-file, --netrc-file and --http-timeout on `app`.
  void AddTo(CLI::App* app);
};

}  // namespace barge::cli
