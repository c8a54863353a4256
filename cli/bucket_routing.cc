// s3:// locations routed to a BucketEnv (cli/bucket_routing.h).
#include "cli/bucket_routing.h"

#include <iostream>
#include <mutex>
#include <optional>
#include <string_view>

#include "blockio/bucket_env.h"
#include "blockio/s3_client.h"
#include "blockio/s3_config.h"
#include "cli/http_flags.h"

namespace barge::cli {

namespace {

std::mutex g_mu;
std::optional<HttpOptions> g_options;  // guarded by g_mu

// The environment's S3 settings (keys, region, endpoint), as AddHttpFlags
// reads them for a command without its flags.
HttpOptions FromEnvironment() {
  HttpOptions o;
  if (auto s3 = ResolveS3AccessFromEnvironment(o.s3); s3.ok()) o.s3 = std::move(*s3);
  return o;
}

HttpOptions Current() {
  std::lock_guard lock(g_mu);
  if (!g_options) g_options = FromEnvironment();
  return *g_options;
}

}  // namespace

void SetBucketHttpOptions(const HttpOptions& options) {
  std::lock_guard lock(g_mu);
  g_options = options;
  g_options->on_sequential = nullptr;  // an s3 chain is always read by ranges
}

std::unique_ptr<ScopedDefaultEnv> InstallBucketRouting(int argc, char** argv) {
  bool any = false;
  for (int i = 1; i < argc && !any; ++i) {
    std::string_view word(argv[i]);
    const size_t eq = word.find('=');
    any = IsS3Url(word) || (word.starts_with("-") && eq != std::string_view::npos && IsS3Url(word.substr(eq + 1)));
  }
  if (!any) return nullptr;
  // A human line on stderr, as Output::Notice writes one (the job's Output
  // is not known down here).
  SetBucketNoticeHandler([](const std::string& line) { std::cerr << "barge: " + line + "\n" << std::flush; });
  static RoutingEnv routing(PosixEnv(), Current);  // lives to the process's end: jobs may outlive main's scope
  return std::make_unique<ScopedDefaultEnv>(routing);
}

}  // namespace barge::cli
