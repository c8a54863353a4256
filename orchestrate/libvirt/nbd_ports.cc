// NBD port leases: flock'ed lock files per host and port.
#include "orchestrate/libvirt/nbd_ports.h"

#include <charconv>

#include "orchestrate/base/file_lock.h"

namespace barge::orchestrate {
namespace {

bool ParsePort(std::string_view text, int& port) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), port);
  return ec == std::errc() && end == text.data() + text.size() && port >= 1 && port <= 65535;
}

}  // namespace

Result<PortRange> ParsePortRange(const std::string& text) {
  PortRange r;
  const size_t dash = text.find('-');
  const std::string_view low = std::string_view(text).substr(0, dash);
  const std::string_view high = dash == std::string::npos ? low : std::string_view(text).substr(dash + 1);
  if (!ParsePort(low, r.low) || !ParsePort(high, r.high) || r.low > r.high) {
    return Error::InvalidArgument("bad port range '" + text + "' (LO-HI, 1 <= LO <= HI <= 65535, e.g. " +
                                  kDefaultNbdPortRange + ")");
  }
  return r;
}

std::string NbdPortLockPath(const std::string& lock_dir, const std::string& host, int port) {
  return lock_dir + "/" + EscapeLockName(host.empty() ? "localhost" : host) + "-" + std::to_string(port) + ".lock";
}

Result<std::unique_ptr<NbdPortLease>> LeaseNbdPort(Env& env, const std::string& lock_dir, const std::string& host,
                                                   const PortRange& range, const std::set<int>& skip) {
  if (!env.Stat(lock_dir).ok()) {
    BARGE_RETURN_IF_ERROR(env.CreateDirs(lock_dir));
    // Shared by every user's barge, as /tmp is; a lock file is its maker's.
    IgnoreError(env.SetMode(lock_dir, 01777), "a folder only its maker can write still serves its maker's runs");
  }
  int held = 0;
  for (int port = range.low; port <= range.high; ++port) {
    if (skip.count(port)) continue;
    auto lock = TryLockFile(env, NbdPortLockPath(lock_dir, host, port), "NBD port in use");
    if (lock.ok()) return std::make_unique<NbdPortLease>(port, std::move(lock).value());
    if (lock.error().code() != ErrorCode::kBusy) return std::move(lock).error().Wrap("lease an NBD port");
    ++held;
  }
  return Error::Busy("no free NBD port in " + range.ToString() + " on " + (host.empty() ? "this machine" : host) +
                     ": " + std::to_string(held) + " held by other backups, " + std::to_string(skip.size()) +
                     " in use on the host (widen --nbd-port-range)")
      .set_path(lock_dir);
}

bool IsAddressInUse(const std::string& message) {
  return message.find("Address already in use") != std::string::npos ||
         message.find("address already in use") != std::string::npos;
}

}  // namespace barge::orchestrate
