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

}  // namespace barge::pipeline
