// A shut-off domain on another host, started paused for a job that goes
// through its QEMU (a pull-mode backup, a snapshot): its disks are that
// host's files, which barge cannot open, and QEMU can. No guest code runs
// (the disks stay as the shut-off domain left them). Started with libvirt's
// AUTODESTROY, so that a barge killed outright (its connection closed)
// leaves the domain shut off as well; destroyed again by Stop or the
// destructor (QEMU stores the disks' persistent bitmaps and closes its
// images as it exits on libvirt's SIGTERM).
#pragma once

#include <libvirt/libvirt.h>

#include <memory>
#include <string>

#include "blockio/error.h"

namespace barge::orchestrate {

class PausedStart {
 public:
  // Starts `dom` (shut off) paused. `uri` is the connection's, without its
  // secrets; `job` says what for ("read them over NBD", ...), in the error.
  static Result<std::unique_ptr<PausedStart>> Start(virDomainPtr dom, const std::string& domain,
                                                    const std::string& uri, const std::string& job);
  ~PausedStart();
  PausedStart(const PausedStart&) = delete;
  PausedStart& operator=(const PausedStart&) = delete;
  // Shuts the domain off again (once; later calls do nothing).
  Status Stop();
  // What the run tells its user: that the domain was started paused for
  // `what` ("this backup") and shut off again.
  std::string Warning(const std::string& what) const;

 private:
  PausedStart(virDomainPtr dom, std::string domain, std::string uri)
      : dom_(dom), domain_(std::move(domain)), uri_(std::move(uri)) {}
  virDomainPtr dom_;
  std::string domain_;
  std::string uri_;
};

}  // namespace barge::orchestrate
