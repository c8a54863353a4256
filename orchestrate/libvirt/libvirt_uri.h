// libvirt connection URIs as barge needs to read them: which transport and
// host (a remote hypervisor), the ssh settings libvirt itself uses (to
// forward a backup job's NBD socket over the same ssh), and the URI without
// its secrets for messages, records and the tracker.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "blockio/error.h"

namespace barge::orchestrate {

// driver[+transport]://[user[:password]@][host][:port]/path[?query]
// (libvirt's remote URI, https://libvirt.org/uri.html).
struct LibvirtUri {
  std::string driver;     // "qemu"
  std::string transport;  // "" (local or default remote), "ssh", "tls", "tcp", "unix", "libssh", ...
  std::string user;
  std::string password;   // never printed: Redacted() leaves it out
  std::string host;       // "" = this machine
  int port = 0;           // 0 = the transport's default
  std::string path;       // "/system", "/session"
  std::vector<std::pair<std::string, std::string>> params;  // the query, decoded, in order

  // The value of query parameter `name`, "" when absent.
  std::string Param(const std::string& name) const;
  // A hypervisor on another machine: a host is named (libvirt then goes
  // through its remote driver, whatever the transport).
  bool remote() const { return !host.empty(); }
  // libvirt's ssh transport (the ssh binary): qemu+ssh://.
  bool ssh() const { return transport == "ssh"; }
  // The URI as given, without the password.
  std::string Redacted() const;
  // Where the domain's checkpoints live: the host, lower-case, without the
  // user, the transport or its port (ssh and tls to one host are one host);
  // "" for this machine. Two URIs name one host when their HostKey()s are
  // equal.
  std::string HostKey() const;
};

// kInvalidArgument for a URI without "://" or with a bad port.
Result<LibvirtUri> ParseLibvirtUri(const std::string& uri);

// `uri` without its password, for messages and records; a URI that does not
// parse is returned up to its "://" and "..." (it may hold anything).
std::string RedactLibvirtUri(const std::string& uri);

// HostKey() of `uri`, "" for a local one or one that does not parse.
std::string LibvirtHostKey(const std::string& uri);

}  // namespace barge::orchestrate
