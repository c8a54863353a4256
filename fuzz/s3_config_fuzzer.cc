// Fuzzes the readers of the AWS shared files (blockio/s3_config.h), which
// take whatever ~/.aws/config and ~/.aws/credentials hold: any bytes are
// accepted or refused with one line, a setting read is one line without
// control characters, and a refusal quotes nothing of the file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "blockio/s3_config.h"

namespace {

void CheckOneLine(std::string_view s) {
  if (s.find('\n') != std::string_view::npos) std::abort();
}

// A setting of the config file: no control character but tabs.
void CheckSetting(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) < ' ' && c != '\t') std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (std::string_view profile : {"default", "ceph", "p"}) {
    if (auto c = barge::ParseAwsConfig(text, profile); c.ok()) {
      CheckSetting(c->region);
      CheckSetting(c->endpoint_url);
    } else {
      CheckOneLine(c.error().message());
      if (c.error().message().find("line ") != 0) std::abort();
    }
    if (auto k = barge::ParseAwsCredentials(text, profile); k.ok()) {
      CheckOneLine(k->access_key_id);
      CheckOneLine(k->secret_access_key);
      if (k->access_key_id.empty() || k->secret_access_key.empty()) std::abort();
    }
  }
  // The whole resolution with both files holding the input.
  auto getenv = [](const std::string& name) -> std::optional<std::string> {
    if (name == "HOME") return std::string("/home/fuzz");
    return std::nullopt;
  };
  auto read = [&text](const std::string&) -> barge::Result<std::string> { return std::string(text); };
  if (auto a = barge::ResolveS3Access({}, getenv, read); a.ok()) {
    CheckOneLine(a->endpoint);
    CheckOneLine(a->region);
  } else {
    CheckOneLine(a.error().message());
  }
  return 0;
}
