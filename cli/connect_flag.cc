// --connect URI.
#include "cli/connect_flag.h"

namespace barge::cli {

void AddConnectOption(CLI::App* cmd, std::string& uri) {
  cmd->add_option("-c,--connect", uri,
                  "libvirt URI: qemu:///system, qemu+ssh://[user@]host[:port]/system[?keyfile=K&no_verify=1], "
                  "qemu+tls://host/system (default: $BARGE_LIBVIRT_URI, else qemu:///system)")
      ->option_text("URI");
}

}  // namespace barge::cli
