// barge export: serve a point over NBD, every cluster verified, until
// SIGINT/SIGTERM (pipeline/export.h).
#include <csignal>
#include <iostream>

#include "cli/common.h"
#include "cli/http_flags.h"
#include "cli/interrupt.h"
#include "cli/owner_flag.h"
#include "pipeline/chain.h"
#include "pipeline/export.h"

namespace barge::cli {
namespace {

struct ExportArgs {
  std::string chain, at, socket, listen, tls_certificates, tls_psk_file;
  bool writable = false;
};

int RunExportCommand(ExportArgs& a, Output& out) {
  if (a.socket.empty() == a.listen.empty()) return out.Usage("give exactly one of --socket PATH and --listen ADDR:PORT");
  if (auto at = pipeline::ParsePointSelector(a.at); !at.ok()) return out.Usage("--at: " + at.error().message());
  pipeline::ExportRequest req;
  req.chain = a.chain;
  req.at = a.at;
  req.socket_path = a.socket;
  req.listen = a.listen;
  req.writable = a.writable;
  req.tls_certificates = a.tls_certificates;
  req.tls_psk_file = a.tls_psk_file;
  req.cancel = &CancelFlag();
  req.on_ready = [&](const pipeline::ExportReady& r) {
    out.Event("ready", {{"uri", r.uri},
                        {"id", r.manifest.id},
                        {"position", r.position},
                        {"started_at", TimeJson(r.manifest.started_at)},
                        {"virtual_size", r.manifest.virtual_size},
                        {"writable", r.writable},
                        {"nbdkit_pid", r.nbdkit_pid}});
    out.text() << "serving backup " << r.manifest.id << " (position " << r.position << ", "
               << HumanBytes(r.manifest.virtual_size) << (r.writable ? ", writes to a throwaway overlay" : ", read-only")
               << ", every cluster verified) at " << r.uri << "\n"
               << "stop with Ctrl-C or SIGTERM\n";
    out.text().flush();
  };
  auto r = pipeline::RunExport(Env::Default(), req);
  if (!r.ok()) return out.Fail(r.error());
  const int signal = InterruptSignal();
  out.Result({{"uri", r->served.uri},
              {"id", r->served.manifest.id},
              {"position", r->served.position},
              {"writable", r->served.writable},
              {"stopped_by", signal == SIGINT ? "SIGINT" : "SIGTERM"},
              {"duration_seconds", r->seconds}});
  out.text() << "export of " << r->served.manifest.id << " stopped after " << HumanSeconds(r->seconds) << "\n";
  // A server ends only by a signal: the result says what it served, the
  // error event after it why it stopped (exit 130/143, as barge serve).
  return out.Fail(Error::Cancelled(signal == SIGINT ? "stopped by SIGINT" : "stopped by SIGTERM"),
                  signal != 0 ? 128 + signal : kExitSigterm);
}

}  // namespace

void RegisterExportCommand(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = AddCommand(app, "export",
                         "Serve a backup point over NBD (nbdkit), every cluster verified, until SIGINT/SIGTERM",
                         exit_code, [a](Output& out) { return RunExportCommand(*a, out); });
  AddAllowOtherOwnerFlag(cmd);
  cmd->add_option("chain", a->chain, "The disk's chain folder (or a backup's manifest or image)")->required();
  cmd->add_option("--at", a->at,
                  "The point: latest (default), a position (0 = the oldest), a backup id, or an RFC 3339 time");
  cmd->add_option("--socket", a->socket, "Serve on this unix socket (removed when the export ends)");
  cmd->add_option("--listen", a->listen, "Serve on TCP ADDR:PORT (127.0.0.1:10809, [::1]:10809)");
  cmd->add_flag("--writable", a->writable,
                "Accept writes into a throwaway overlay (nbdkit's cow filter); the backup is never written");
  cmd->add_option("--tls-certificates", a->tls_certificates,
                  "Require TLS with x509 certificates from this folder (ca-cert.pem, server-cert.pem, server-key.pem)");
  cmd->add_option("--tls-psk-file", a->tls_psk_file, "Require TLS with pre-shared keys from this file (user:hexkey lines)");
  cmd->get_option("--tls-certificates")->excludes("--tls-psk-file");
  cmd->get_option("--socket")->excludes("--listen");
  AddBucketFlags(cmd);
}

}  // namespace barge::cli
