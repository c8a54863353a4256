// --connect URI, shared by every command that talks to libvirt (vm, tracker,
// checkpoint, cbt, doctor, snapshot --domain): which hypervisor, local or
// remote (qemu+ssh://, qemu+tls://).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace barge::cli {

// Adds --connect to `cmd`, filling `uri` ("" = $BARGE_LIBVIRT_URI, else
// qemu:///system: orchestrate::ResolveLibvirtUri). `uri` must outlive the
// command's parse.
void AddConnectOption(CLI::App* cmd, std::string& uri);

}  // namespace barge::cli
