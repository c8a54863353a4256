// Checks of the files an http(s) source reads (CA bundle, netrc, headers).
#include "pipeline/http_endpoint.h"

#include <algorithm>
#include <cctype>

#include "pipeline/nbd_endpoint.h"

namespace barge::pipeline {

Result<std::vector<std::string>> ReadHeaderFile(Env& env, const std::string& path) {
  BARGE_RETURN_IF_ERROR(CheckPrivateFile(env, path, "header file"));
  BARGE_ASSIGN_OR_RETURN(std::string text, env.ReadFile(path, 64 << 10));
  std::vector<std::string> headers;
  size_t line_no = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    // Only the line's number and the header's name are ever shown.
    const std::string where = "line " + std::to_string(line_no) + " of the header file";
    const size_t colon = line.find(':');
    const bool name_ok =
        colon != std::string::npos && colon > 0 &&
        std::all_of(line.begin(), line.begin() + static_cast<std::ptrdiff_t>(colon), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
        });
    if (!name_ok) {
      return Error::InvalidArgument(where + " is not 'Name: value' (its text is not shown)").set_path(path);
    }
    for (char c : line) {
      if (static_cast<unsigned char>(c) < ' ' && c != '\t') {
        return Error::InvalidArgument(where + " holds a control character").set_path(path);
      }
    }
    headers.push_back(std::move(line));
  }
  if (headers.empty()) return Error::InvalidArgument("the header file holds no 'Name: value' line").set_path(path);
  return headers;
}

Result<HttpOptions> HttpOptionsFor(Env& env, const HttpOptions& options) {
  HttpOptions out = options;
  if (!options.header_file.empty()) {
    BARGE_ASSIGN_OR_RETURN(std::vector<std::string> lines, ReadHeaderFile(env, options.header_file));
    out.extra_headers.insert(out.extra_headers.end(), lines.begin(), lines.end());
  }
  if (!options.netrc_file.empty()) {
    BARGE_RETURN_IF_ERROR(CheckPrivateFile(env, options.netrc_file, "netrc file"));
  }
  if (!options.ca_file.empty()) {
    auto st = env.Stat(options.ca_file);
    if (!st.ok()) {
      if (st.error().code() == ErrorCode::kNotFound) {
        return Error::NotFound("CA file not found").set_path(options.ca_file);
      }
      return st.error();
    }
    if (!st->is_regular()) return Error::InvalidArgument("CA file is not a regular file").set_path(options.ca_file);
  }
  return out;
}

Result<std::unique_ptr<formats::Image>> OpenObjectImage(std::unique_ptr<BlockSource> object, const std::string& name,
                                                        formats::OpenOptions options) {
  auto held = std::make_shared<std::unique_ptr<BlockSource>>(std::move(object));
  formats::SourceOpener opener = [held, name](const std::string&) -> Result<std::unique_ptr<BlockSource>> {
    if (!*held) {
      return Error::InvalidArgument(
                 "the image names a backing or data file; barge reads one object from a URL or a stream and "
                 "follows no file or URL an image names (flatten it first, or give the chain as files)")
          .set_path(name);
    }
    return std::unique_ptr<BlockSource>(std::move(*held));
  };
  // Names inside the image are never resolved against this machine's folders.
  options.allow_any_path = false;
  options.allowed_dirs = {};
  return formats::OpenImage(name, opener, options);
}

}  // namespace barge::pipeline
