// A shut-off remote domain started paused for a job (paused_start.h).
#include "orchestrate/libvirt/paused_start.h"

#include <utility>

#include "orchestrate/libvirt/libvirt_conn.h"

namespace barge::orchestrate {

Result<std::unique_ptr<PausedStart>> PausedStart::Start(virDomainPtr dom, const std::string& domain,
                                                        const std::string& uri, const std::string& job) {
  if (virDomainCreateWithFlags(dom, VIR_DOMAIN_START_PAUSED | VIR_DOMAIN_START_AUTODESTROY) < 0) {
    Error e = LastVirError("start domain '" + domain + "' paused on " + uri);
    return Error(e.code(), "domain '" + domain + "' on " + uri + " is shut off and its disks are on that host: barge "
                           "starts it paused to " + job + ", and that failed (" + e.message() + ")");
  }
  return std::unique_ptr<PausedStart>(new PausedStart(dom, domain, uri));
}

PausedStart::~PausedStart() {
  IgnoreError(Stop(), "libvirt destroys the domain when this connection closes (AUTODESTROY)");
}

Status PausedStart::Stop() {
  if (dom_ == nullptr) return OkStatus();
  virDomainPtr dom = std::exchange(dom_, nullptr);
  if (!DomainIsActive(dom)) return OkStatus();
  if (virDomainDestroy(dom) < 0) return LastVirError("shut domain '" + domain_ + "' on " + uri_ + " off again");
  return OkStatus();
}

std::string PausedStart::Warning(const std::string& what) const {
  return "domain '" + domain_ + "' on " + uri_ + " was shut off: barge started it paused for " + what +
         " (no guest code ran) and shut it off again";
}

}  // namespace barge::orchestrate
