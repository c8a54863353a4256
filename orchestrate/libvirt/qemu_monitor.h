// QMP commands to a running domain's QEMU through libvirt's passthrough
// (virDomainQemuMonitorCommand, libvirt-qemu), for what libvirt has no API
// of its own: internal snapshots of one disk while the domain runs.
#pragma once

#include <libvirt/libvirt.h>

#include <cstdint>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "formats/image.h"

namespace barge::orchestrate {

// Runs one QMP command (a JSON object text: {"execute": ..., "arguments": ...})
// and returns the reply's "return" value as JSON text. A QMP error becomes
// kInvalidArgument with QEMU's description ("Snapshot ... already exists").
Result<std::string> QmpCommand(virDomainPtr dom, const std::string& command_json);

// A disk of the running domain as QEMU's block layer names it.
struct QemuDisk {
  std::string node_name;  // the top (format) node, e.g. "libvirt-1-format"
  std::string qdev;       // "/machine/peripheral/virtio-disk0/virtio-backend"
  std::string file;       // the image file QEMU has open
  std::string format;     // "qcow2"
  // The internal snapshots QEMU lists for it (id, name, date, vm state,
  // vm clock; l1 fields are not reported and stay 0).
  std::vector<formats::SnapshotInfo> snapshots;
  // The dirty bitmaps QEMU has for it (name, granularity; in_use: QEMU
  // reports it "inconsistent", e.g. after a crash; enabled: "recording").
  std::vector<formats::BitmapInfo> bitmaps;
};

// Finds disk `target` (e.g. "vda") of the running domain: its alias in the
// live domain XML (<alias name='virtio-disk0'/>) matched against
// query-block's qdev, else its source file against the node's file name.
// kNotFound when the domain has no such disk or QEMU does not list it.
Result<QemuDisk> FindQemuDisk(virDomainPtr dom, const std::string& target);

// blockdev-snapshot-internal-sync: QEMU writes the snapshot itself (it
// refuses a name the disk already has).
Status QemuCreateInternalSnapshot(virDomainPtr dom, const QemuDisk& disk, const std::string& name);
// blockdev-snapshot-delete-internal-sync by id (and name when given).
// Returns what QEMU reports about the deleted snapshot.
Result<formats::SnapshotInfo> QemuDeleteInternalSnapshot(virDomainPtr dom, const QemuDisk& disk,
                                                         const std::string& id, const std::string& name);

}  // namespace barge::orchestrate
