// TCP ports for the NBD exports of remote pull-mode backups (qemu+tls://):
// each job takes one port of a range on the hypervisor, so parallel jobs on
// one host never ask QEMU for the same port (docs/orchestration.md, "Remote
// hypervisors").
#pragma once

#include <memory>
#include <set>
#include <string>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

// An inclusive range of TCP ports, LO-HI.
struct PortRange {
  int low = 10809;  // NBD's registered port
  int high = 10872;
  int size() const { return high - low + 1; }
  std::string ToString() const { return std::to_string(low) + "-" + std::to_string(high); }
};

// The default range, as --help and docs print it ("10809-10872").
inline constexpr const char* kDefaultNbdPortRange = "10809-10872";

// Where the port leases' lock files live: machine-wide, so that every barge
// process of the backup server sees them, whichever catalog it uses.
inline constexpr const char* kDefaultNbdPortLockDir = "/run/lock/barge/nbd-ports";

// "LO-HI" (or one port "P"), 1 <= LO <= HI <= 65535.
// kInvalidArgument naming the text otherwise.
Result<PortRange> ParsePortRange(const std::string& text);

// One port of one host, held: an exclusive flock on
// <lock_dir>/<host>-<port>.lock, released when the lease is destroyed or
// the process dies (the kernel drops the flock), so a killed barge never
// keeps a port. The lock file stays (a waiter may have it open). One
// thread at a time.
class NbdPortLease {
 public:
  NbdPortLease(int port, std::unique_ptr<EnvLock> lock) : port_(port), lock_(std::move(lock)) {}
  int port() const { return port_; }
  const std::string& lock_path() const { return lock_->path(); }

 private:
  int port_;
  std::unique_ptr<EnvLock> lock_;
};

// The lock file of `port` on `host` (a host key, LibvirtHostKey) in
// `lock_dir`.
std::string NbdPortLockPath(const std::string& lock_dir, const std::string& host, int port);

// Leases the first port of `range` on `host` that no other lease holds
// (in this process or another) and that is not in `skip` (ports libvirt
// found in use on the host by something else). The folder is created when
// missing (mode 01777: every user's barge shares it).
// Returns:
//   the lease;
//   kBusy (retryable) when every port of the range is held or skipped,
//     saying how many of each and naming the range;
//   an errno Error when the folder or a lock file cannot be made.
Result<std::unique_ptr<NbdPortLease>> LeaseNbdPort(Env& env, const std::string& lock_dir, const std::string& host,
                                                   const PortRange& range, const std::set<int>& skip = {});

// Whether libvirt's error `message` says the port was taken on the host
// (QEMU's "Failed to find an available port: Address already in use").
bool IsAddressInUse(const std::string& message);

}  // namespace barge::orchestrate
