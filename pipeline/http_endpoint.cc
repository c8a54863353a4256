// Checks of the files an http(s) source reads (CA bundle, netrc).
#include "pipeline/http_endpoint.h"

#include "pipeline/nbd_endpoint.h"

namespace barge::pipeline {

Result<HttpOptions> HttpOptionsFor(Env& env, const HttpOptions& options) {
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
  return options;
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
