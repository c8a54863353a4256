// barge's entry point: the only place that catches exceptions.
#include <signal.h>

#include <exception>
#include <iostream>
#include <new>

#include "cli/commands.h"
#include "cli/interrupt.h"
#include "cli/output.h"

int main(int argc, char** argv) {
  barge::cli::InstallTerminateHandler(argc, argv);
  // A daemon that dies mid-run (libvirtd, an NBD server) closes a socket
  // barge writes to: the write must fail (EPIPE) and end in barge's error
  // line, not end barge by SIGPIPE (libvirt's client installs no handler;
  // a vm backup killed so left no message). Children get the default back
  // (InitChildSpawnAttr).
  ::signal(SIGPIPE, SIG_IGN);
  try {
    return barge::cli::Main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::cerr << "barge: NoSpace: out of memory (lower --memory or --threads)\n";
    return barge::cli::kExitError;
  } catch (const std::exception& e) {
    std::cerr << "barge: Internal: " << e.what() << " (a bug in barge: please report it)\n";
    return barge::cli::kExitInternal;
  }
}
