// A unix socket on a remote hypervisor made reachable here through OpenSSH
// (`ssh -N -L LOCAL:REMOTE`), with the ssh settings of a qemu+ssh:// libvirt
// URI: the pull-mode backup of a remote domain reads its NBD export through
// it, so one open ssh port is enough (docs/orchestration.md, "Remote
// hypervisors").
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/libvirt/libvirt_uri.h"

namespace barge::orchestrate {

// The ssh command line for forwarding `local_socket` to `remote_socket` on
// the host of `uri` (a qemu+ssh:// URI): `ssh -N -n -T -o ExitOnForwardFailure=yes
// -o BatchMode=yes -o ServerAliveInterval=10 -o ServerAliveCountMax=3 (a
// silent server ends ssh after 30 s, and the forward is restarted) [-p PORT] [-i KEYFILE] [-o StrictHostKeyChecking=no -o
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
// on a second signal.
//
// A cut ssh session ends ssh (the process killed, its TCP connection
// reset, or the server silent for 30 s: ServerAliveInterval): a thread of
// the forward's own (it starts the new ssh, and lives until Stop, so the
// new ssh still ends with barge) then starts ssh again on the same local
// socket, so the NBD reader's URI stays valid and its reconnects
// (NbdRetryPolicy's attempts with backoff) reach the host again instead of
// a dead socket. It checks the new session as Start does, and tries again
// with backoff (1 s, doubled, at most 5 s) until Stop; a forward that the
// server refuses is not tried again. Start and Stop: one thread at a time;
// Restore: any thread.
class SshForward {
 public:
  // Starts ssh, waits up to `timeout` until the local socket exists, then
  // connects through it once to see the forward work (the NBD server's
  // greeting, or the channel's refusal on ssh's stderr: OpenSSH opens a
  // unix socket forward only at the first connection, and a refused one
  // just closes it).
  // Errors: kInvalidArgument (not an ssh URI), kIoError naming the host
  // (redacted URI) and ssh's last line of stderr when ssh exits first or
  // the socket does not appear in time, kNotSupported (not retryable)
  // when the SSH server refuses to forward the socket
  // (AllowStreamLocalForwarding no in its sshd_config, or the socket gone
  // from the host), kCancelled once `cancel` (may be null; must outlive
  // the forward) is set while it waits (SIGINT during a slow ssh login).
  // ssh is stopped on every error.
  static Result<std::unique_ptr<SshForward>> Start(Env& env, const LibvirtUri& uri,
                                                   const std::string& remote_socket,
                                                   const std::atomic<bool>* cancel = nullptr,
                                                   std::chrono::seconds timeout = std::chrono::seconds(30));
  ~SshForward();
  SshForward(const SshForward&) = delete;
  SshForward& operator=(const SshForward&) = delete;

  const std::string& local_socket() const { return local_socket_; }
  // The running ssh process; -1 when none (stopped, or between sessions).
  pid_t pid() const;
  // The NBD reader's reconnect hook (NbdRetryPolicy::restore_transport):
  // makes sure the forward carries connections before an attempt. A
  // running ssh is checked (a connection through it must get the NBD
  // greeting within 5 s); one that fails the check is stopped. Then it
  // waits (up to the start timeout) for the watching thread to bring ssh
  // back, so the reader spends no attempt on a forward being restarted.
  // Returns OK when ssh runs and the check passed or a new session came
  // up; kNotSupported (not retryable) when the SSH server refuses the
  // forward; kIoError (retryable) naming why ssh is not back yet;
  // kCancelled once stopping. Thread-safe (any thread, several at once);
  // not after Stop has begun to destroy the forward.
  Status Restore();
  // How many times ssh was started again after its session was cut.
  int restarts() const;
  // Stops the watching thread and ssh, removes the socket and folder;
  // idempotent.
  Status Stop();

 private:
  SshForward(Env& env, const LibvirtUri& uri, std::string remote_socket, const std::atomic<bool>* cancel,
             std::chrono::seconds timeout, std::string dir, std::string local_socket);
  // Runs ssh and waits for the local socket, then checks the forward
  // (Probe). Requires mu_.
  Status Launch();
  // Connects through the local socket and waits up to `wait` for the NBD
  // server's first bytes. Requires mu_.
  Status Probe(std::chrono::milliseconds wait);
  // The watching thread's loop: restarts ssh once it has exited.
  void Watch();
  // Stops the ssh process (not the folder). Requires mu_.
  void StopProcess();
  // Appends what ssh wrote to its stderr (non-blocking). Requires mu_.
  void DrainStderr();
  bool Stopping() const;

  Env& env_;
  const LibvirtUri uri_;
  const std::string remote_socket_;
  const std::atomic<bool>* const cancel_;  // may be null
  const std::chrono::seconds timeout_;
  std::string dir_;
  const std::string local_socket_;
  TempRegistration registration_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::condition_variable wake_;      // Stop and Restore wake the watching thread
  std::condition_variable launched_;  // the watching thread ended a restart
  // Why the last restart failed (retryable), or the refusal (not); guarded by mu_.
  std::optional<Error> restart_error_;
  pid_t pid_ = -1;           // guarded by mu_
  int stderr_fd_ = -1;       // our end of ssh's stderr; guarded by mu_
  std::string stderr_text_;  // guarded by mu_
  int restarts_ = 0;         // guarded by mu_
  std::thread watcher_;
};

// The note a run over `uri` gives about `known_hosts=`: libvirt reads it
// only for its libssh and libssh2 transports (qemu+libssh://,
// qemu+libssh2://); over qemu+ssh:// (the ssh binary) libvirt's own
// connection checks the host key with ssh's own known hosts files
// (~/.ssh/known_hosts, ssh_config's UserKnownHostsFile), and only barge's
// forward reads the file named. "" when the URI names none, or names it
// with no_verify=1 (then no file is read at all).
std::string KnownHostsNote(const LibvirtUri& uri);

}  // namespace barge::orchestrate
