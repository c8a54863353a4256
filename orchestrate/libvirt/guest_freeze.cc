// Guest agent freeze and thaw with retries.
#include "orchestrate/libvirt/guest_freeze.h"

#include <chrono>
#include <thread>

#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {

Status FreezeGuest(virDomainPtr dom) {
  if (virDomainFSFreeze(dom, nullptr, 0, 0) < 0) return LastVirError("freeze the guest's file systems");
  return OkStatus();
}

std::string ThawGuest(virDomainPtr dom) {
  std::string why;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(250 * attempt));
    if (virDomainFSThaw(dom, nullptr, 0, 0) >= 0) return {};
    why = LastVirError("thaw").message();
  }
  return "the guest's file systems may still be frozen: thaw failed 3 times (" + why +
         "); thaw them with 'virsh domfsthaw " + std::string(virDomainGetName(dom)) + "'";
}

GuestFreeze::~GuestFreeze() {
  // Nobody is left to hear why a thaw failed here; the callers that care
  // call Thaw() themselves, and this is the last attempt on the way out.
  std::string ignored = Thaw();
}

Status GuestFreeze::Freeze(virDomainPtr dom) {
  BARGE_RETURN_IF_ERROR(FreezeGuest(dom));
  dom_ = dom;
  return OkStatus();
}

std::string GuestFreeze::Thaw() {
  if (!dom_) return {};
  std::string why = ThawGuest(dom_);
  if (why.empty()) dom_ = nullptr;
  return why;
}

}  // namespace barge::orchestrate
