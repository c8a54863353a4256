// A unix socket on a remote hypervisor made reachable here through OpenSSH
// (`ssh -N -L LOCAL:REMOTE`), with the ssh settings of a qemu+ssh:// libvirt
// URI: the pull-mode backup of a remote domain reads its NBD export through
// it, so one open ssh port is enough (docs/orchestration.md, "Remote
// hypervisors").
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/libvirt/libvirt_uri.h"

namespace barge::orchestrate {

// The ssh command line for forwarding `local_socket` to `remote_socket` on
// the host of `uri` (a qemu+ssh:// URI): `ssh -N -n -o ExitOnForwardFailure=yes
// -o BatchMode=yes [-p PORT] [-i KEYFILE] [-o StrictHostKeyChecking=no -o
// UserKnownHostsFile=/dev/null] -L LOCAL:REMOTE [user@]host`. The URI's
// `command=` names the ssh binary (default "ssh"), `keyfile=` the key,
// `no_verify=1` skips the host key check as libvirt does (and reads no
// known_hosts file: a known key that differs would make ssh refuse the
// forward), `known_hosts=` names the known hosts file otherwise.
std::vector<std::string> SshForwardCommand(const LibvirtUri& uri, const std::string& local_socket,
                                           const std::string& remote_socket);

// One running forward: the ssh process and a private folder (mode 0700,
// under $TMPDIR or /tmp) holding the local socket. Stopped by PID (SIGTERM,
// then SIGKILL after 5 s) and its folder removed by Stop() or the
// destructor, on every path out of the caller; the ssh process also gets
// SIGTERM when the thread that started it ends (PR_SET_PDEATHSIG: a barge
// killed outright leaves no ssh behind), and the local socket is a
// registered temporary (TempRegistration) for a process that exits at once
// on a second signal. One thread at a time.
class SshForward {
 public:
  // Starts ssh and waits up to `timeout` until the local socket exists.
  // Errors: kInvalidArgument (not an ssh URI), kIoError naming the host
  // (redacted URI) and ssh's last line of stderr when ssh exits first or
  // the socket does not appear in time, kCancelled once `cancel` (may be
  // null) is set while it waits (SIGINT during a slow ssh login). ssh is
  // stopped on every error.
  static Result<std::unique_ptr<SshForward>> Start(Env& env, const LibvirtUri& uri,
                                                   const std::string& remote_socket,
                                                   const std::atomic<bool>* cancel = nullptr,
                                                   std::chrono::seconds timeout = std::chrono::seconds(30));
  ~SshForward();
  SshForward(const SshForward&) = delete;
  SshForward& operator=(const SshForward&) = delete;

  const std::string& local_socket() const { return local_socket_; }
  pid_t pid() const { return pid_; }
  // Stops ssh and removes the socket and folder; idempotent.
  Status Stop();

 private:
  SshForward(Env& env, std::string dir, std::string local_socket);

  Env& env_;
  std::string dir_;
  std::string local_socket_;
  TempRegistration registration_;
  pid_t pid_ = -1;
  int stderr_fd_ = -1;  // our end of ssh's stderr
  std::string stderr_text_;
  void DrainStderr();
};

}  // namespace barge::orchestrate
