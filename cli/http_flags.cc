// The HTTP(S) source flags (cli/http_flags.h).
#include "cli/http_flags.h"

#include <algorithm>

namespace barge::cli {

void HttpFlags::AddTo(CLI::App* app) {
  app->add_option("--ca-file", options.ca_file,
                  "https:// source: PEM file of the authorities to verify the server with (default: the "
                  "system's); verification is never turned off")
      ->type_name("FILE");
  app->add_option("--netrc-file", options.netrc_file,
                  "http(s):// source: credentials as netrc lines (machine HOST login USER password PASS), "
                  "mode 0600; never put them in the URL")
      ->type_name("FILE");
  app->add_option_function<double>(
         "--http-timeout",
         [this](double seconds) {
           options.stall_timeout_ms = static_cast<int>(seconds * 1000);
           options.connect_timeout_ms = std::min(options.connect_timeout_ms, options.stall_timeout_ms);
         },
         "http(s):// source: seconds without a byte before a transfer is cut and resumed (default 30)")
      ->check(CLI::Range(1.0, 3600.0))
      ->type_name("SECONDS");
}

}  // namespace barge::cli
