// Guest file system freeze and thaw through the QEMU guest agent (libvirt's
// virDomainFSFreeze/virDomainFSThaw), shared by vm backup and snapshots:
// thaw is retried, and a guard thaws on every path out of a scope.
#pragma once

#include <libvirt/libvirt.h>

#include <string>

#include "blockio/error.h"

namespace barge::orchestrate {

// Freezes every guest file system. kNotSupported (no or unresponsive guest
// agent) or kIoError with libvirt's message; nothing is frozen then.
Status FreezeGuest(virDomainPtr dom);

// Thaws, trying up to 3 times with a short pause. Returns "" when thawed,
// otherwise why the guest may still be frozen and how to thaw it by hand.
std::string ThawGuest(virDomainPtr dom);

// Holds a freeze: Thaw() ends it (and says why it could not); the
// destructor thaws when Thaw() was not called, so an early return cannot
// leave a guest frozen. One thread at a time. `dom` must outlive it.
class GuestFreeze {
 public:
  GuestFreeze() = default;
  ~GuestFreeze();
  GuestFreeze(const GuestFreeze&) = delete;
  GuestFreeze& operator=(const GuestFreeze&) = delete;

  Status Freeze(virDomainPtr dom);
  // "" when thawed (or never frozen), else ThawGuest's warning.
  std::string Thaw();
  bool frozen() const { return dom_ != nullptr; }

 private:
  virDomainPtr dom_ = nullptr;  // set while frozen
};

}  // namespace barge::orchestrate
