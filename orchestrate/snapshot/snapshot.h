// Internal snapshots of one VM disk, for `barge snapshot ...`: an image file
// edited offline under QEMU's image lock (formats/qcow2_snapshot_edit.h),
// or a disk of a running libvirt domain through QEMU itself (QMP
// blockdev-snapshot-internal-sync / -delete-internal-sync). Consistency
// hooks, guest quiesce and the free-space check around create. Behaviour and
// errors in docs/snapshots.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/image.h"
#include "formats/qcow2_snapshot_metrics.h"
#include "orchestrate/base/hooks.h"

namespace barge::orchestrate {

// Whose snapshots: an image file, or disk `disk` of libvirt domain `domain`.
// A domain that runs is edited through QEMU; a domain that is shut off
// through its disk's file, like an image. A shut-off domain on another host
// (its file is that host's) is started paused for create, delete and list,
// which then go through QEMU, and shut off again (PausedStart); its rename
// and rollback are refused (kNotSupported).
struct SnapshotTarget {
  std::string image;        // path (exclusive with domain)
  std::string domain;       // libvirt domain name
  std::string disk;         // its target, e.g. "vda"
  std::string libvirt_uri;  // "" = ResolveLibvirtUri
};

// How a create is made consistent.
struct SnapshotConsistency {
  // Freeze the guest's file systems through the guest agent around the
  // snapshot (running domains only; thaw is always attempted).
  bool quiesce = false;
  HookSpec hooks;
};

// Space a create must leave free, past the metadata it writes: QEMU needs
// room to copy on write once the snapshot shares the disk's clusters.
struct SpacePolicy {
  uint64_t margin_bytes = 64ull << 20;
};

struct SnapshotCreateRequest {
  SnapshotTarget target;
  std::string name;
  bool allow_duplicate_name = false;  // offline only; QEMU refuses duplicates online
  SnapshotConsistency consistency;
  SpacePolicy space;
};

// The image file of a target: the path given, or the disk's file (as the
// running QEMU has it open, or as the shut-off domain's XML names it; for a
// domain on another host, a path on that host).
Result<std::string> SnapshotImagePath(const SnapshotTarget& target);

// What one operation did.
struct SnapshotOpResult {
  std::string mode;   // "offline" (barge edited the file) or "online" (QEMU did)
  std::string image;  // the image file
  formats::SnapshotInfo snapshot;                // created, renamed, deleted or rolled back to
  std::vector<formats::SnapshotInfo> discarded;  // rollback with discard_newer
  std::vector<HookRun> hooks;
  std::vector<std::string> warnings;  // a failed post-hook, a thaw that needed retries...
};

// Creates snapshot `name`. Order: pre-hook, guest freeze (quiesce), the
// snapshot, thaw, post-hook. Offline, the image lock is taken and free
// space checked before the pre-hook runs.
// Returns:
//   kInvalidArgument  bad target (image and domain, or neither; a domain
//                     disk that is not a qcow2 file), a taken name, quiesce
//                     without a running domain;
//   kBusy             another process (a QEMU, named with its pid) has the
//                     image open;
//   kNoSpace          "not enough space": the file system cannot hold the
//                     metadata plus the margin (nothing changed);
//   kCancelled        the pre-hook failed (nothing created, post-hook ran);
//   kNotSupported     what QEMU refuses (external data file, 1-bit
//                     refcounts, ...), or no guest agent for quiesce;
//   formats' errors for the image itself.
Result<SnapshotOpResult> CreateDiskSnapshot(Env& env, const SnapshotCreateRequest& request);

// Deletes the snapshot `id_or_name` (id first, then a unique name).
Result<SnapshotOpResult> DeleteDiskSnapshot(Env& env, const SnapshotTarget& target, const std::string& id_or_name);

// Renames it (offline only: QEMU has no command for it; a running domain is
// kNotSupported).
Result<SnapshotOpResult> RenameDiskSnapshot(Env& env, const SnapshotTarget& target, const std::string& id_or_name,
                                            const std::string& new_name);

// Rolls the disk back to the snapshot, keeping newer snapshots unless
// `discard_newer` (then deleted in the same transaction and returned in
// `discarded`). A running domain is refused with kBusy: shut it off first.
Result<SnapshotOpResult> RollbackDiskSnapshot(Env& env, const SnapshotTarget& target, const std::string& id_or_name,
                                              bool discard_newer);

struct SnapshotListEntry {
  formats::SnapshotInfo info;
  formats::SnapshotUsage usage;
  bool has_usage = false;  // false when the metrics could not be read (see warnings)
};

struct SnapshotListing {
  std::string mode;   // "offline" or "online"
  std::string image;
  uint32_t cluster_size = 0;
  std::vector<SnapshotListEntry> snapshots;  // table order
  formats::SnapshotUsage active;             // the disk's current state
  bool has_usage = false;
  std::vector<std::string> warnings;
};

// The snapshots with their metrics (one pass over the tables). Offline the
// image is read under a shared image lock (kBusy while a QEMU writes it:
// name the domain and disk instead); online the list is QEMU's and the
// metrics are read from the file as QEMU last wrote it (a warning says so
// if that fails).
Result<SnapshotListing> ListDiskSnapshots(Env& env, const SnapshotTarget& target);

using Labels = std::vector<std::pair<std::string, std::string>>;

// The listing in Prometheus text format: barge_snapshot_<metric>_bytes
// gauges (vol_size, referenced, logical_referenced, used, written),
// barge_snapshot_compress_ratio and barge_snapshot_creation_time_seconds,
// labelled image, id, name, plus what `extra_labels` gives for each
// snapshot (e.g. uuid and state from apply).
std::string SnapshotMetricsText(const SnapshotListing& listing,
                                const std::function<Labels(const SnapshotListEntry&)>& extra_labels = {});

}  // namespace barge::orchestrate
