// The HTTP(S) source flags (cli/http_flags.h).
#include "cli/http_flags.h"

#include <algorithm>

namespace barge::cli {

void AddHttpFlags(CLI::App* app, HttpOptions& options) {
  app->add_option("--ca-file", options.ca_file,
                  "https:// source: PEM file of the authorities to verify the server with (default: the "
                  "system's); verification is never turned off")
      ->type_name("FILE");
  app->add_option("--netrc-file", options.netrc_file,
                  "http(s):// source: credentials as netrc lines (machine HOST login USER password PASS), "
                  "mode 0600; never put them in the URL")
      ->type_name("FILE");
  app->add_option("--header-file", options.header_file,
                  "http(s):// source: request headers sent with every request, one 'Name: value' a line "
                  "(e.g. Authorization: Bearer TOKEN), mode 0600; never shown")
      ->type_name("FILE");
  HttpOptions* o = &options;
  app->add_option_function<double>(
         "--http-timeout",
         [o](double seconds) {
           o->stall_timeout_ms = static_cast<int>(seconds * 1000);
           o->connect_timeout_ms = std::min(o->connect_timeout_ms, o->stall_timeout_ms);
         },
         "http(s):// source: seconds without a byte before a transfer is cut and resumed (default 30)")
      ->check(CLI::Range(1.0, 3600.0))
      ->type_name("SECONDS");
}

void HttpFlags::AddTo(CLI::App* app) { AddHttpFlags(app, options); }

}  // namespace barge::cli
