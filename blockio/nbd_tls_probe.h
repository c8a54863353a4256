// Why an NBD server's certificate was refused. libnbd (1.14) reports every
// failed verification alike ("gnutls_handshake: Error in the certificate
// verification"), whether the CA did not sign the server, the certificate
// expired or names another host, and exposes no session to ask. After such
// a failure, ProbeNbdServerCertificate opens one short connection of its
// own: the NBD fixed-newstyle greeting, NBD_OPT_STARTTLS, and a GnuTLS
// handshake that stops as soon as the server's certificate has arrived
// (before the client would send a certificate of its own). No export is
// opened and no credential is sent.
#ifndef BARGE_BLOCKIO_NBD_TLS_PROBE_H_
#define BARGE_BLOCKIO_NBD_TLS_PROBE_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blockio/error.h"

namespace barge {

// What the probe learned: GnuTLS's verification status, in our own bits,
// and the facts about the server's certificate the words need.
struct ServerCertificateCheck {
  enum Problem : unsigned {
    kSignerNotFound = 1u << 0,   // no CA in the trust list signed it
    kExpired = 1u << 1,          // past its expiration date
    kNotActivated = 1u << 2,     // before its activation date
    kUnexpectedOwner = 1u << 3,  // names another host
    kRevoked = 1u << 4,
    kInsecureAlgorithm = 1u << 5,
    kSignatureFailure = 1u << 6,  // the signature does not check out
    kOther = 1u << 7,             // any other reason GnuTLS gave
  };
  unsigned problems = 0;
  // Seconds since the epoch; nullopt when the certificate did not say.
  std::optional<int64_t> activation;
  std::optional<int64_t> expiration;
  // The host names and addresses the certificate is for (subject
  // alternative names, else its common name).
  std::vector<std::string> names;
};

// The words for `check` of the certificate of the server reached as
// `host`, verified against `ca` (how the trusted CA is named, e.g. "the
// CA of the certificates folder (its ca-cert.pem)"): each problem in one
// clause, joined by "; ". Empty when `check` names no problem.
std::string ServerCertificateWords(const ServerCertificateCheck& check, const std::string& host,
                                   const std::string& ca);

// Connects to host:port (TCP), asks for TLS the NBD way and verifies the
// server's certificate for `host` against the CA certificates in
// `ca_file` ("" = the system's trusted CAs). Gives up after `timeout`.
// An error says why the probe itself could not tell.
Result<ServerCertificateCheck> ProbeNbdServerCertificate(const std::string& host, const std::string& port,
                                                         const std::string& ca_file,
                                                         std::chrono::milliseconds timeout);

}  // namespace barge

#endif  // BARGE_BLOCKIO_NBD_TLS_PROBE_H_
