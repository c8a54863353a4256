// s3:// locations routed to a BucketEnv (cli/bucket_routing.h).
#include "cli/bucket_routing.h"

#include <algorithm>
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

// The one RoutingEnv; lives to the process's end: jobs may outlive main's scope.
RoutingEnv& Routing() {
  static RoutingEnv routing(PosixEnv(), Current);
  return routing;
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
  return std::make_unique<ScopedDefaultEnv>(Routing());
}

std::unique_ptr<ScopedDefaultEnv> InstallBucketRoutingFor(const std::vector<std::string>& locations) {
  if (std::none_of(locations.begin(), locations.end(), [](const std::string& l) { return IsS3Url(l); })) {
    return nullptr;
  }
  // Already routed (an s3:// argument): nothing to add.
  if (&Env::Default() == &Routing()) return nullptr;
  return std::make_unique<ScopedDefaultEnv>(Routing());
}

}  // namespace barge::cli
