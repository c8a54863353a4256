// Backup policies (docs/policies.md): what to back up, when, where, and how
// many points to keep, read from a YAML file and validated with errors
// that name the line. A parsed Policy is a plain value.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/image.h"
#include "orchestrate/schedule/cron.h"

namespace barge::orchestrate {

enum class PolicySourceKind : uint8_t {
  kImage,   // a disk image file (qcow2 or raw); incremental with `bitmap`
  kDomain,  // a libvirt domain, incremental through its backup tracker
  kNbd,     // an NBD export (always full)
};
std::string_view PolicySourceKindName(PolicySourceKind kind);  // "image", "domain", "nbd"

struct PolicySource {
  PolicySourceKind kind = PolicySourceKind::kImage;
  // Unique within the policy; names the source in records, metrics and
  // chain folders. `name:` in the file, else the image's or export's base
  // name without extension, or the domain name.
  std::string name;
  std::string location;  // image path, domain name or NBD URI
  std::string bitmap;    // image: persistent bitmap the incrementals read ("" = every backup full)
  std::string tracker;   // domain: backup tracker (created when missing)
  // image and nbd: the disk's name (`disk_id:`, as `barge backup
  // --disk-id`): the chain is that named disk's, whatever URI (port) or
  // path reads it (pipeline::kNamedDiskKind); "" = the location names it.
  std::string disk_id;
  // image and nbd: how incrementals find changes (docs/policies.md):
  // "bitmap" (the default with a bitmap), "digests" (read the source and
  // compare SHA-256 digests with the chain: the default for an image
  // without a bitmap), "bitmap+digests" (the bitmap, checked by digests),
  // "full" (every backup full: the default for nbd). "" for domains.
  std::string changed_by;
  std::string connect;   // domain: libvirt URI ("" = $BARGE_LIBVIRT_URI, else qemu:///system); may hold a password
  // domain on a remote host, its export over TCP with TLS (vm backup's
  // --tls-certificates and --nbd-port-range): the client certificates'
  // folder ("" = none) and the ports to lease ("" = kDefaultNbdPortRange).
  std::string tls_certificates;
  std::string nbd_port_range;
  // domain: freeze the guest's filesystems through its guest agent for the
  // checkpoint (vm backup without --skip-quiesce). `quiesce: false` for a
  // domain without a guest agent: its points are crash-consistent.
  bool quiesce = true;
  int line = 0;          // where the entry starts in the file (1-based)
};

// A command run before or after each source's backup (docs/policies.md,
// "Hooks"). Run through a HookRunner (orchestrate/policy/policy_runner.h). Not
// named HookSpec: orchestrate/base/hooks.h (snapshots' pre/post pair) has that.
struct PolicyHook {
  std::string command;                        // run by /bin/sh -c
  std::chrono::seconds timeout{std::chrono::minutes(5)};
};

// A target's offsite copy (`offsite:` on a target, docs/policies.md,
// "Offsite copies"): after each successful backup to `target`, the source's
// chain is synced to `location` (pipeline::SyncChain: the points it lacks,
// each verified), then `retention_count` points are kept there.
struct PolicyOffsite {
  std::string target;    // one of Policy::targets
  std::string location;  // an absolute folder or s3://BUCKET/PREFIX
  uint32_t retention_count = 15;  // default: the policy's retention_count
};

// Whether a target (or offsite) is a bucket, s3://BUCKET/PREFIX: the
// free-space rule does not apply there (docs/policies.md).
bool IsBucketTarget(std::string_view location);

struct Policy {
  std::string name;                   // [A-Za-z0-9_.-]+
  std::vector<PolicySource> sources;  // at least one
  // A value different from the one last run triggers one backup of every
  // source.
  std::string reason;
  // When backups are due; absent: only a changed reason or a manual run.
  std::optional<CronSchedule> schedule;
  // The alert threshold; 0 disables the alert.
  std::chrono::seconds max_duration_without_backup{0};
  uint32_t retention_count = 15;      // restorable points kept per source, >= 1
  // Absolute folders or s3://BUCKET/PREFIX locations, at least one.
  std::vector<std::string> targets;
  std::vector<PolicyOffsite> offsites;  // at most one per target
  // A group that may read the chains on the targets (`target_group`; as
  // `backup --group`); "" = the owner alone.
  std::string target_group;
  // A target qualifies when its free bytes >= this x the source's
  // allocated bytes. 0 disables the check.
  double free_space_multiple = 1.0;
  std::chrono::seconds max_run_time{0};  // a run is stopped after this; 0 = no limit
  uint32_t max_parallel = 1;          // sources backed up at once, 1..64
  uint32_t full_every = 0;            // a new chain after this many points; 0 = never
  formats::Compression compression = formats::Compression::kZstd;
  int compression_level = formats::kDefaultZstdLevel;
  std::optional<PolicyHook> pre_hook;
  std::optional<PolicyHook> post_hook;
  // The file it was read from (LoadPolicy: its canonical path; "" from
  // ParsePolicy): the owner of its folders on the targets (policy_runner.h).
  std::string file;

  const PolicySource* FindSource(std::string_view source_name) const;
  const PolicyOffsite* OffsiteOf(std::string_view target) const;  // null: none
};

// Every location the policy writes: its targets, then its offsites.
std::vector<std::string> PolicyLocations(const Policy& policy);

// Parses and validates a policy. `file_name` prefixes every message;
// `env` reads the time zone file a schedule names.
// Returns: the policy; kInvalidArgument listing every problem found, one
// per line, as "FILE:LINE:COLUMN: message" (unknown keys with "did you
// mean ...?", wrong types, bad values, missing required fields, duplicate
// keys or source names); YAML syntax errors the same way.
Result<Policy> ParsePolicy(Env& env, std::string_view yaml, std::string_view file_name = "policy");

// Reads `path` through `env` (at most 1 MiB) and parses it.
Result<Policy> LoadPolicy(Env& env, const std::string& path);

// The next `count` scheduled run times after `after` (empty without a
// schedule).
std::vector<std::chrono::sys_seconds> NextRunTimes(const Policy& policy, std::chrono::sys_seconds after,
                                                   size_t count);

}  // namespace barge::orchestrate
