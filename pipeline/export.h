// barge export: serves one point of a chain folder over NBD until stopped,
// through nbdkit (a maintained NBD server) and barge's plugin
// (nbdkit/barge_plugin.cc), every cluster read checked against its digest.
// docs/export.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/manifest.h"

namespace barge::pipeline {

struct ExportRequest {
  std::string chain;   // chain folder, or one of its manifests or images (LocatePoint)
  std::string at;      // "", "latest", id, position or time
  // Exactly one of the two: a unix socket path, or ADDR:PORT for TCP
  // ("127.0.0.1:10809", "[::1]:10809").
  std::string socket_path;
  std::string listen;
  // Writes go to nbdkit's cow filter (a throwaway overlay); the chain is
  // never written either way.
  bool writable = false;
  // TLS required (nbdkit --tls=require): x509 certificates in a folder
  // (ca-cert.pem, server-cert.pem, server-key.pem), or a PSK file.
  std::string tls_certificates;
  std::string tls_psk_file;
  // The nbdkit program and barge's plugin ("": FindExportPlugin).
  std::string nbdkit = "nbdkit";
  std::string plugin;
  // Polled: once true, nbdkit is stopped (SIGTERM by PID, then SIGKILL
  // after 10 s) and RunExport returns. Must outlive the call.
  const std::atomic<bool>* cancel = nullptr;
  // Called once nbdkit accepts connections.
  std::function<void(const struct ExportReady&)> on_ready;
};

struct ExportReady {
  std::string uri;       // nbd+unix:///?socket=..., nbd://ADDR:PORT/, nbds... with TLS
  size_t position = 0;   // the point's index in the folder, oldest first
  formats::BackupManifest manifest;
  int64_t nbdkit_pid = 0;
  bool writable = false;
  std::string plugin;    // the plugin nbdkit loaded
};

struct ExportResult {
  ExportReady served;
  double seconds = 0;        // serving time
  bool stopped = false;      // true: stopped by `cancel`
};

// Checks the point before serving (LocatePoint, the chain's structure,
// manifests and digest tables: PointReader::Open, which also keeps merge
// and forget off the folder while it runs), starts nbdkit in the
// foreground (--exit-with-parent, its own process group), waits until it
// listens (its PID file), calls on_ready, and serves until `cancel` or
// until nbdkit ends. The socket and the PID file are removed at the end.
// Returns: the result when stopped by `cancel`; kCorruption (a damaged
// chain, refused before serving), kBusy (a backup, merge or forget runs),
// kNotFound (chain, point, plugin, nbdkit, TLS files), kInvalidArgument
// (a bad --listen, a file already at the socket path), kIoError when
// nbdkit fails to start or ends on its own (its messages are on stderr).
Result<ExportResult> RunExport(Env& env, const ExportRequest& request);

// Whether an nbdkit of this `nbdkit --version` text ("nbdkit 1.32.5")
// aborts as a whole when one client hangs up with several of its requests
// in flight (the assertion `raw_send_socket: sock >= 0`): every nbdkit
// before 1.33.10, where upstream fixed it (commit 9d82aa4f, "server: Don't
// assert on send if client hangs up early"). Text that names no version
// counts as affected. RunExport then runs nbdkit with --threads=1: one
// thread per connection, so no reply is ever sent on a socket another
// thread of the same connection closed. docs/export.md.
bool NbdkitAbortsOnHangup(const std::string& version_text);

// nbdkit-barge-plugin.so: beside the running program (the build tree's
// cli/ folder), in ../lib/barge from it (cmake --install), in the
// install folder the build was configured with. kNotFound listing where it
// looked.
Result<std::string> FindExportPlugin(Env& env);

}  // namespace barge::pipeline
