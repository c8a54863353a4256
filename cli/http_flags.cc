// The HTTP(S) source flags (cli/http_flags.h).
#include "cli/http_flags.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "blockio/env.h"
#include "blockio/s3_client.h"
#include "blockio/s3_config.h"

#include "cli/bucket_routing.h"
#include "cli/common.h"

namespace barge::cli {

Result<S3Access> ResolveS3AccessFromEnvironment(const S3Access& flags) {
  auto getenv = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    return v == nullptr ? std::nullopt : std::optional<std::string>(v);
  };
  auto read = [](const std::string& path) { return PosixEnv().ReadFile(path, 1 << 20); };
  return ResolveS3Access(flags, getenv, read);
}

namespace {

// --ca-file, --http-timeout and the S3 flags into `options`, and the
// environment read once they are parsed. `keep` (the owner of `options`,
// or null) lives as long as the command's callback.
void AddS3Flags(CLI::App* app, HttpOptions& options, std::shared_ptr<const void> keep) {
  app->add_option("--ca-file", options.ca_file,
                  "https:// source or S3 endpoint: PEM file of the authorities to verify the server with "
                  "(default: the system's); verification is never turned off")
      ->type_name("FILE");
  HttpOptions* o = &options;
  app->add_option_function<double>(
         "--http-timeout",
         [o](double seconds) {
           o->stall_timeout_ms = static_cast<int>(seconds * 1000);
           o->connect_timeout_ms = std::min(o->connect_timeout_ms, o->stall_timeout_ms);
         },
         "http(s):// source or S3 endpoint: seconds without a byte before a transfer is cut and resumed "
         "(default 30)")
      ->check(CLI::Range(1.0, 3600.0))
      ->type_name("SECONDS");
  app->add_option("--s3-endpoint", options.s3.endpoint,
                  "s3:// location: the object store's URL, http(s)://HOST[:PORT] (default: AWS_ENDPOINT_URL, else "
                  "AWS in AWS_REGION); keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials")
      ->type_name("URL");
  app->add_option("--s3-region", options.s3.region,
                  "s3:// location: the store's region, signed into every request (default: AWS_REGION, "
                  "AWS_DEFAULT_REGION, the profile's region in ~/.aws/config, else us-east-1)")
      ->type_name("REGION");
  auto style = std::make_shared<std::string>();
  app->add_option("--s3-addressing-style", *style,
                  "s3:// location: path (HOST/BUCKET, the default) or virtual (BUCKET.HOST); default: "
                  "AWS_S3_ADDRESSING_STYLE, else path")
      ->check(CLI::IsMember({"path", "virtual"}))
      ->type_name("STYLE");
  // The environment is read here, at the edge, once the flags are known.
  app->parse_complete_callback([o, app, style, keep = std::move(keep)] {
    // A profile the credentials file lacks (NotFound) matters only to
    // s3:// locations: the keys stay empty and the S3 client says how to
    // give them. A malformed or unreadable file is a usage error of a
    // command given an s3:// location, and no matter to the others.
    auto s3 = ResolveS3AccessFromEnvironment(o->s3);
    if (s3.ok()) o->s3 = std::move(*s3);
    if (!style->empty()) o->s3.virtual_host = *style == "virtual";  // the flag over the environment
    SetBucketHttpOptions(*o);  // s3:// chain folders use the same settings
    if (s3.ok() || s3.error().code() == ErrorCode::kNotFound) return;
    for (const CLI::Option* option : app->get_options()) {
      for (const std::string& given : option->results()) {
        if (IsS3Url(given)) throw CLI::ValidationError(s3.error().path() + ": " + s3.error().message());
      }
    }
  });
}

}  // namespace

void AddHttpFlags(CLI::App* app, HttpOptions& options) {
  AddS3Flags(app, options, nullptr);
  app->add_option("--netrc-file", options.netrc_file,
                  "http(s):// source: credentials as netrc lines (machine HOST login USER password PASS), "
                  "mode 0600; never put them in the URL")
      ->type_name("FILE");
  app->add_option("--header-file", options.header_file,
                  "http(s):// source: request headers sent with every request, one 'Name: value' a line "
                  "(e.g. Authorization: Bearer TOKEN), mode 0600; never shown")
      ->type_name("FILE");
}

void AddBucketFlags(CLI::App* app) {
  auto options = std::make_shared<HttpOptions>();
  AddS3Flags(app, *options, options);
}

Result<HttpOptions> HttpFlags::OptionsFor(Output& out, const std::string& source) const {
  std::string scheme = source.substr(0, source.find("://"));
  std::transform(scheme.begin(), scheme.end(), scheme.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!options.ca_file.empty() && scheme == "http") {
    return Error::InvalidArgument("--ca-file asks for TLS, but the source is a plain http:// URL (" +
                                  RedactHttpUrl(source) + "): use its https:// URL, or drop --ca-file");
  }
  HttpOptions o = options;
  o.on_sequential = [&out](const std::string& url, uint64_t length_bytes, const std::string& dir) {
    out.Notice("sequential_read",
               "sequential read: " + url + ": the server does not serve byte ranges; reading it once, front to "
               "back (" + HumanBytes(length_bytes) + "), into a private file under " +
               dir + " (a cut starts it again from the first byte)",
               {{"url", url}, {"size", length_bytes}});
  };
  return o;
}

void HttpFlags::AddTo(CLI::App* app) { AddHttpFlags(app, options); }

}  // namespace barge::cli
