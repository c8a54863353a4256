// What a command's flags say about the NBD exports it reads or writes
// (--nbd-connections, --tls-certificates, --tls-psk-file, --tls-username),
// and the checks made on the credential files before libnbd reads them.
#pragma once

#include <cstdint>
#include <string>

#include "blockio/env.h"
#include "blockio/nbd.h"

namespace barge::pipeline {

// The same for every NBD URI of one command; ignored for files.
struct NbdAccess {
  uint32_t connections = 0;      // with multi-conn; 0: automatic (NbdOptions::connections)
  std::string tls_certificates;  // x509 folder (NbdTls::certificates_dir)
  std::string tls_psk_file;      // PSK keys file (NbdTls::psk_file)
  std::string tls_username;      // PSK identity (NbdTls::username)
  // Whether any TLS flag was given (TLS is then required for every URI).
  bool tls() const { return !tls_certificates.empty() || !tls_psk_file.empty() || !tls_username.empty(); }
};

// The options to open `uri` with under `access`, after checking, through
// `env`, every credential file named by the flags or by the URI's
// tls-certificates= and tls-psk-file= parameters:
//   a PSK file, and the certificates folder's client-key.pem when present,
//   must be regular files readable by their owner only, as ssh demands of
//   its keys (kInvalidArgument "permissions 0644 for FILE are too open");
//   the certificates folder must exist and hold ca-cert.pem;
//   a file or folder that does not exist is kNotFound naming it.
// Errors name the file, never the URI's other parts.
// A key or credentials file: it exists (else kNotFound), is a regular file
// (after links) and only its owner may read or write it (else
// kInvalidArgument "... are too open"). `what` says what it is, for messages.
Status CheckPrivateFile(Env& env, const std::string& path, const std::string& what);

Result<NbdOptions> NbdOptionsFor(Env& env, const std::string& uri, const NbdAccess& access);

}  // namespace barge::pipeline
