// The NBD flags (cli/nbd_flags.h).
#include "cli/nbd_flags.h"

namespace barge::cli {

void NbdFlags::AddTo(CLI::App* app, const std::string& which) {
  app->add_option("--nbd-connections", access.connections,
                  "NBD connections for " + which + " when the server allows several (multi-conn); 0 = "
                  "automatic: 4, over TLS one per core up to 4")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app->add_option("--tls-certificates", access.tls_certificates,
                  "NBD over TLS (x509) for " + which +
                      ": folder with ca-cert.pem (and client-cert.pem, client-key.pem); TLS is then required")
      ->type_name("DIR");
  app->add_option("--tls-psk-file", access.tls_psk_file,
                  "NBD over TLS (PSK) for " + which + ": file of username:hexkey lines, mode 0600; TLS is then "
                  "required")
      ->type_name("FILE");
  app->add_option("--tls-username", access.tls_username,
                  "PSK identity for --tls-psk-file (default: the URI's user, else the login name)")
      ->type_name("NAME");
}

}  // namespace barge::cli
