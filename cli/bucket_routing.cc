// s3:// locations routed to a BucketEnv (cli/bucket_routing.h).
#include "cli/bucket_routing.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <string_view>

#include "blockio/bucket_env.h"
#include "blockio/crypt_env.h"
#include "blockio/encryption_key.h"
#include "blockio/s3_client.h"
#include "blockio/s3_config.h"
#include "cli/http_flags.h"

namespace barge::cli {

namespace {

std::mutex g_mu;
std::optional<HttpOptions> g_options;  // guarded by g_mu
CryptEnv* g_crypt = nullptr;           // the routing's, once installed

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

// The one routing of s3:// paths, made on first use: a RoutingEnv under the
// CryptEnv of encrypted chains (without a key, it refuses them). Lives to
// the process's end: jobs may outlive main's scope.
Env& Routed() {
  static CryptEnv& crypt = []() -> CryptEnv& {
    // A human line on stderr, as Output::Notice writes one (the job's
    // Output is not known down here).
    SetBucketNoticeHandler([](const std::string& line) { std::cerr << "barge: " + line + "\n" << std::flush; });
    static RoutingEnv routing(PosixEnv(), Current);
    static CryptEnv env(routing);
    g_crypt = &env;
    return env;
  }();
  return crypt;
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
  return std::make_unique<ScopedDefaultEnv>(Routed());
}

std::unique_ptr<ScopedDefaultEnv> InstallBucketRoutingFor(const std::vector<std::string>& locations) {
  if (std::none_of(locations.begin(), locations.end(), [](const std::string& l) { return IsS3Url(l); })) {
    return nullptr;
  }
  // Already routed (an s3:// argument): nothing to add.
  if (&Env::Default() == &Routed()) return nullptr;
  return std::make_unique<ScopedDefaultEnv>(Routed());
}

void AddEncryptionFlags(CLI::App* app, const std::string* new_root) {
  auto load = [new_root](const std::string& path, bool passphrase) {
    if (g_crypt == nullptr) {
      throw CLI::ValidationError(std::string(passphrase ? "--encryption-passphrase-file" : "--encryption-key-file") +
                                 " encrypts chains in buckets: give an s3:// chain location");
    }
    auto key = passphrase ? LoadPassphraseFile(PosixEnv(), path) : LoadEncryptionKeyFile(PosixEnv(), path);
    if (!key.ok()) {
      const Error& e = key.error();
      throw CLI::ValidationError(e.path() + ": " + e.message() +
                                 (e.errno_value() != 0 ? std::string(": ") + std::strerror(e.errno_value()) : ""));
    }
    g_crypt->SetKey(std::move(*key), new_root);
  };
  CLI::Option* key_file =
      app->add_option_function<std::string>(
             "--encryption-key-file", [load](const std::string& path) { load(path, false); },
             "s3:// chain: encrypt its objects (a backup starting a chain) or read them encrypted with this key: "
             "32 random bytes (raw or 64 hex digits), mode 0600; never shown, never stored (docs/s3.md)")
          ->type_name("FILE");
  app->add_option_function<std::string>(
         "--encryption-passphrase-file", [load](const std::string& path) { load(path, true); },
         "s3:// chain: as --encryption-key-file, with a key derived (scrypt) from the first line of FILE, mode 0600")
      ->type_name("FILE")
      ->excludes(key_file);
}

}  // namespace barge::cli
