// ResolveS3Access and the credentials file reader (blockio/s3_config.h).
#include "blockio/s3_config.h"

namespace barge {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string Get(const GetEnvFn& getenv, const char* name) {
  auto v = getenv(name);
  return v ? *v : std::string();
}

// The text of an AWS file; "/dev/null" (how users and the tests turn a file
// off, which the AWS CLI accepts) is an empty one.
Result<std::string> ReadAwsFile(const ReadFileFn& read_file, const std::string& path) {
  if (path == "/dev/null") return std::string();
  return read_file(path);
}

}  // namespace

Result<AwsKeys> ParseAwsCredentials(std::string_view text, std::string_view profile) {
  AwsKeys keys;
  bool in_section = false, found = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = Trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      const size_t close = line.find(']');
      std::string_view name = Trim(line.substr(1, close == std::string_view::npos ? 0 : close - 1));
      if (name.starts_with("profile ")) name = Trim(name.substr(8));
      in_section = name == profile;
      found = found || in_section;
      continue;
    }
    if (!in_section) continue;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view key = Trim(line.substr(0, eq));
    const std::string value(Trim(line.substr(eq + 1)));
    if (key == "aws_access_key_id") keys.access_key_id = value;
    else if (key == "aws_secret_access_key") keys.secret_access_key = value;
    else if (key == "aws_session_token") keys.session_token = value;
  }
  if (!found) return Error::NotFound("no profile [" + std::string(profile.substr(0, 64)) + "] in the credentials file");
  if (keys.access_key_id.empty() || keys.secret_access_key.empty()) {
    return Error::NotFound("the profile [" + std::string(profile.substr(0, 64)) +
                           "] lacks aws_access_key_id or aws_secret_access_key");
  }
  return keys;
}

Result<AwsConfigProfile> ParseAwsConfig(std::string_view text, std::string_view profile) {
  AwsConfigProfile out;
  bool in_section = false, any_section = false;
  for (int number = 1; !text.empty(); ++number) {
    const size_t nl = text.find('\n');
    const std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    const auto bad = [number](const char* what) {
      return Error::InvalidArgument("line " + std::to_string(number) + ": " + what + " (not an AWS config file)");
    };
    for (size_t i = 0; i < raw.size(); ++i) {  // tabs, and a CR ending the line (CRLF files), are no harm
      const char c = raw[i];
      const bool line_end = c == '\r' && i + 1 == raw.size();
      if (static_cast<unsigned char>(c) < ' ' && c != '\t' && !line_end) return bad("a control character");
    }
    const std::string_view line = Trim(raw);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (raw.front() == ' ' || raw.front() == '\t') {  // a sub-setting of the key above
      if (!any_section) return bad("an indented line before the first [section]");
      continue;
    }
    if (line.front() == '[') {
      if (line.back() != ']') return bad("a section header without ']'");
      std::string_view name = Trim(line.substr(1, line.size() - 2));
      if (name.starts_with("profile ") || name.starts_with("profile\t")) {
        in_section = Trim(name.substr(8)) == profile;
      } else {
        in_section = name == "default" && profile == "default";
      }
      any_section = true;
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || Trim(line.substr(0, eq)).empty()) {
      return bad("neither a comment, a [section] nor a 'key = value' line");
    }
    if (!any_section) return bad("a setting before the first [section]");
    if (!in_section) continue;
    const std::string_view key = Trim(line.substr(0, eq));
    if (key == "region") out.region = std::string(Trim(line.substr(eq + 1)));
    else if (key == "endpoint_url") out.endpoint_url = std::string(Trim(line.substr(eq + 1)));
  }
  return out;
}

Result<S3Access> ResolveS3Access(S3Access flags, const GetEnvFn& getenv, const ReadFileFn& read_file) {
  S3Access a = std::move(flags);
  if (a.endpoint.empty()) a.endpoint = Get(getenv, "AWS_ENDPOINT_URL_S3");
  if (a.endpoint.empty()) a.endpoint = Get(getenv, "AWS_ENDPOINT_URL");
  if (a.region.empty()) a.region = Get(getenv, "AWS_REGION");
  if (a.region.empty()) a.region = Get(getenv, "AWS_DEFAULT_REGION");
  const std::string named_profile = Get(getenv, "AWS_PROFILE");
  if (a.endpoint.empty() || a.region.empty()) {
    std::string config = Get(getenv, "AWS_CONFIG_FILE");
    if (config.empty() && !Get(getenv, "HOME").empty()) config = Get(getenv, "HOME") + "/.aws/config";
    auto text = config.empty() ? Result<std::string>(Error::NotFound("no HOME")) : ReadAwsFile(read_file, config);
    if (!text.ok() && text.error().code() != ErrorCode::kNotFound) return Error(text.error()).set_path(config);
    if (text.ok()) {
      auto profile = ParseAwsConfig(*text, named_profile.empty() ? "default" : named_profile);
      if (!profile.ok()) return Error(profile.error()).set_path(config);
      if (a.endpoint.empty()) a.endpoint = std::move(profile->endpoint_url);
      if (a.region.empty()) a.region = std::move(profile->region);
    }
  }
  if (Get(getenv, "AWS_S3_ADDRESSING_STYLE") == "virtual") a.virtual_host = true;
  if (!a.access_key_id.empty() && !a.secret_access_key.empty()) return a;
  a.access_key_id = Get(getenv, "AWS_ACCESS_KEY_ID");
  a.secret_access_key = Get(getenv, "AWS_SECRET_ACCESS_KEY");
  a.session_token = Get(getenv, "AWS_SESSION_TOKEN");
  if (!a.access_key_id.empty() && !a.secret_access_key.empty()) return a;
  a = S3Access{a.endpoint, a.region, a.virtual_host, "", "", ""};
  std::string file = Get(getenv, "AWS_SHARED_CREDENTIALS_FILE");
  if (file.empty()) {
    const std::string home = Get(getenv, "HOME");
    if (home.empty()) return a;
    file = home + "/.aws/credentials";
  }
  auto text = ReadAwsFile(read_file, file);
  if (!text.ok()) {
    if (text.error().code() == ErrorCode::kNotFound && named_profile.empty()) return a;
    return Error(text.error()).set_path(file);
  }
  auto keys = ParseAwsCredentials(*text, named_profile.empty() ? "default" : named_profile);
  if (!keys.ok()) {
    if (named_profile.empty()) return a;  // no default profile: no keys
    return Error(keys.error()).set_path(file);
  }
  a.access_key_id = std::move(keys->access_key_id);
  a.secret_access_key = std::move(keys->secret_access_key);
  a.session_token = std::move(keys->session_token);
  return a;
}

}  // namespace barge
