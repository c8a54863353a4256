// Flags of every command that reads or writes NBD exports: connections
// (multi-conn) and TLS, applied to all the command's NBD URIs.
#pragma once

#include <CLI/CLI.hpp>

#include "pipeline/nbd_endpoint.h"

namespace barge::cli {

struct NbdFlags {
  pipeline::NbdAccess access;

  // Registers --nbd-connections, --tls-certificates, --tls-psk-file and
  // --tls-username on `app`; `which` says what the URIs are ("the source",
  // "--to") in the help texts.
  void AddTo(CLI::App* app, const std::string& which);
};

}  // namespace barge::cli
