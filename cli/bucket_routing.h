// Chains in buckets (issue 38): the cli makes s3:// locations reach a
// BucketEnv (blockio/bucket_env.h) through Env::Default(), so every job
// that takes a folder takes s3://BUCKET/PREFIX, while every other path
// still goes to the POSIX Env.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "blockio/env.h"
#include "blockio/http_client.h"

namespace barge::cli {

// The S3 settings of the command being run (its --s3-endpoint, --ca-file,
// timeouts, with the environment's keys and region): AddHttpFlags calls it
// once the flags are parsed. Commands without those flags use the
// environment's alone.
void SetBucketHttpOptions(const HttpOptions& options);

// When an s3:// location is among the arguments (a word starting with it,
// or an option's "=s3://..."), installs a RoutingEnv as Env::Default() for
// the returned object's lifetime; null otherwise (nothing changes).
std::unique_ptr<ScopedDefaultEnv> InstallBucketRouting(int argc, char** argv);

// Registers --encryption-key-file and --encryption-passphrase-file on a
// command that writes or reads chains (encryption at rest of chains in
// buckets, blockio/crypt_env.h). The key is loaded as the option is
// parsed: a file that cannot be (missing, readable by others, malformed)
// is a usage error naming it, never quoting it. Without either flag, an
// encrypted chain is refused with a line saying so. `new_root`: where a
// chain may start encrypted (backup's --target, read once the flags are
// parsed); null for a reader.
void AddEncryptionFlags(CLI::App* app, const std::string* new_root);

// The same when one of `locations` (a policy's targets and offsites, read
// from its file rather than the arguments) is an s3:// location.
std::unique_ptr<ScopedDefaultEnv> InstallBucketRoutingFor(const std::vector<std::string>& locations);

}  // namespace barge::cli
