// Credential checks for NBD over TLS, and NbdOptions from a command's flags.
#include "pipeline/nbd_endpoint.h"

#include <cstdio>

#include "blockio/path.h"

namespace barge::pipeline {

namespace {

std::string OctalMode(uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode & 07777);
  return buf;
}

}  // namespace

Status CheckPrivateFile(Env& env, const std::string& path, const std::string& what) {
  auto st = env.Stat(path);
  if (!st.ok()) {
    if (st.error().code() == ErrorCode::kNotFound) return Error::NotFound(what + " not found").set_path(path);
    return st.error();
  }
  if (!st->is_regular()) return Error::InvalidArgument(what + " is not a regular file").set_path(path);
  if ((st->mode & 077) != 0) {
    return Error::InvalidArgument("permissions " + OctalMode(st->mode) + " for " + what + " '" + path +
                                  "' are too open: it must be readable by its owner only (chmod 600)")
        .set_path(path);
  }
  return OkStatus();
}

namespace {

// An x509 client folder as libnbd reads it: ca-cert.pem to verify the
// server; client-cert.pem and client-key.pem when the server verifies us.
Status CheckCertificatesDir(Env& env, const std::string& dir) {
  auto st = env.Stat(dir);
  if (!st.ok()) {
    if (st.error().code() == ErrorCode::kNotFound) return Error::NotFound("TLS certificates folder not found").set_path(dir);
    return st.error();
  }
  if (!st->is_directory()) return Error::InvalidArgument("TLS certificates: not a folder").set_path(dir);
  const std::string ca = JoinPath(dir, "ca-cert.pem");
  if (auto ca_st = env.Stat(ca); !ca_st.ok()) {
    if (ca_st.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("TLS certificates folder holds no ca-cert.pem (the CA that signed the server's certificate)")
          .set_path(ca);
    }
    return ca_st.error();
  }
  const std::string key = JoinPath(dir, "client-key.pem");
  if (env.Stat(key).ok()) BARGE_RETURN_IF_ERROR(CheckPrivateFile(env, key, "TLS client key"));
  return OkStatus();
}

}  // namespace

Result<NbdOptions> NbdOptionsFor(Env& env, const std::string& uri, const NbdAccess& access) {
  NbdOptions options;
  options.connections = access.connections;
  options.tls.required = access.tls();
  options.tls.certificates_dir = access.tls_certificates;
  options.tls.psk_file = access.tls_psk_file;
  options.tls.username = access.tls_username;
  for (const std::string& dir : {access.tls_certificates, NbdUriParam(uri, "tls-certificates")}) {
    if (!dir.empty()) BARGE_RETURN_IF_ERROR(CheckCertificatesDir(env, dir));
  }
  for (const std::string& file : {access.tls_psk_file, NbdUriParam(uri, "tls-psk-file")}) {
    if (!file.empty()) BARGE_RETURN_IF_ERROR(CheckPrivateFile(env, file, "TLS PSK file"));
  }
  return options;
}

}  // namespace barge::pipeline
