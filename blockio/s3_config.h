// Where an S3Access comes from: flags, then the environment and the shared
// credentials file, as the AWS tools read them. The library reads no
// environment itself: the cli passes its getenv and a file reader here.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "blockio/error.h"
#include "blockio/http_client.h"

namespace barge {

// The [PROFILE] section of an AWS shared credentials file (INI:
// aws_access_key_id, aws_secret_access_key, aws_session_token; "#" and ";"
// comments). kNotFound naming the profile when it has no section, or lacks
// a key or secret. Errors never quote the file's lines.
struct AwsKeys {
  std::string access_key_id, secret_access_key, session_token;
};
Result<AwsKeys> ParseAwsCredentials(std::string_view text, std::string_view profile);

using GetEnvFn = std::function<std::optional<std::string>(const std::string& name)>;
using ReadFileFn = std::function<Result<std::string>(const std::string& path)>;

// `flags` (what --s3-endpoint and the like set) completed from the
// environment: endpoint AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL; region
// AWS_REGION, then AWS_DEFAULT_REGION; virtual-host addressing when
// AWS_S3_ADDRESSING_STYLE=virtual (path style otherwise); keys AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN), else the profile
// AWS_PROFILE ("default") of AWS_SHARED_CREDENTIALS_FILE
// ($HOME/.aws/credentials). A missing file leaves the keys empty (the
// client then says how to give them); an unreadable file, or a profile
// named by AWS_PROFILE that the file lacks, is an error.
Result<S3Access> ResolveS3Access(S3Access flags, const GetEnvFn& getenv, const ReadFileFn& read_file);

}  // namespace barge
