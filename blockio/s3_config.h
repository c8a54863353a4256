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

// The settings barge takes from the profile's section of an AWS config file
// (~/.aws/config: "[default]", else "[profile NAME]"; "[NAME]" is read for
// "default" only, as the AWS CLI does). Other keys, and the indented
// sub-settings of a key ("s3 =" then "  addressing_style = ..."), are
// ignored; so are [services ...] and [sso-session ...] sections. A profile
// the file lacks is no error (empty settings). kInvalidArgument "line N:
// ..." for text that is no such file: a section header without "]", a
// line that is neither a comment, a header nor "key = value", a setting
// before the first header, a control character. Errors never quote the
// file's lines.
struct AwsConfigProfile {
  std::string region;        // "region"
  std::string endpoint_url;  // "endpoint_url"
};
Result<AwsConfigProfile> ParseAwsConfig(std::string_view text, std::string_view profile);

using GetEnvFn = std::function<std::optional<std::string>(const std::string& name)>;
using ReadFileFn = std::function<Result<std::string>(const std::string& path)>;

// `flags` (what --s3-endpoint, --s3-region and the like set) completed
// from the environment, then the config file, as the AWS CLI does: endpoint
// AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then the profile's
// endpoint_url; region AWS_REGION, then AWS_DEFAULT_REGION, then the
// profile's region. The config file is AWS_CONFIG_FILE ($HOME/.aws/config),
// read only when the endpoint or the region is still unset; a missing file
// is no error, a malformed or unreadable one is (naming the file);
// "/dev/null" for either file reads as an empty file. The
// profile is AWS_PROFILE ("default") there too. Virtual-host addressing when
// AWS_S3_ADDRESSING_STYLE=virtual (path style otherwise); keys AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN), else the profile
// AWS_PROFILE ("default") of AWS_SHARED_CREDENTIALS_FILE
// ($HOME/.aws/credentials). A missing file leaves the keys empty (the
// client then says how to give them); an unreadable file, or a profile
// named by AWS_PROFILE that the file lacks, is an error.
Result<S3Access> ResolveS3Access(S3Access flags, const GetEnvFn& getenv, const ReadFileFn& read_file);

}  // namespace barge
