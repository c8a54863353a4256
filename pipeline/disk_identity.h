// Which disk a chain holds (docs/formats/backup.md, "Which disk a chain
// holds"): the identity of a source, and the checks that keep one chain to
// one disk (an incremental extends only its own disk's chain; a chain whose
// points record different disks is damaged).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/manifest.h"
#include "pipeline/chain.h"
#include "pipeline/endpoints.h"

namespace barge::pipeline {

// The kind of a disk the user named (`barge backup --disk-id ID`, a policy
// source's `disk_id:`): its location is the name. Whatever URI, port or
// path it is read through (the manifest's `source` says which), a disk of
// one name is one disk, and no other source is (docs/formats/backup.md).
inline constexpr std::string_view kNamedDiskKind = "named";

// kInvalidArgument unless `disk_id` is 1 to 200 characters of
// [A-Za-z0-9._:@/+-] that do not start with '-'.
Status CheckDiskId(std::string_view disk_id);

// The identity of the disk named `disk_id`: kind kNamedDiskKind, location
// `disk_id`, the virtual size given (0 = not known: not said in messages).
formats::DiskIdentity NamedIdentity(std::string_view disk_id, uint64_t virtual_size);

// The identity of an opened source: "file" or "block" with its canonical
// path (symbolic links and ".." resolved through `env`), or "nbd" with the
// URI as RedactNbdUri (blockio/nbd.h) gives it; the source's virtual size.
formats::DiskIdentity IdentityOf(Env& env, const SourceSpec& spec, const OpenedSource& source);

// Opens `spec` (through `env`) and returns IdentityOf it.
Result<formats::DiskIdentity> IdentifySource(Env& env, const SourceSpec& spec);

// For an incremental onto the latest point of `chain`: "" when the chain
// records no disk (written before barge recorded one: usable as before) or
// records `source`'s kind, location, target and (where both record one)
// the file behind a domain's target (a size change is the
// caller's size check's to report); else a sentence naming both disks
// (the chain's from the newest layer of its latest point that records
// one). kCorruption when
// the latest point's parent links are broken.
// A source whose `moved_from` names the chain's recorded location is the
// chain's disk moved by `barge state migrate`.
Result<std::string> OtherDiskReason(const ChainFolder& chain, const formats::DiskIdentity& source);

// The disk in words, for messages: "file /var/lib/a.qcow2 (1 GiB)",
// "block device /dev/vg/lv (8 GiB)", "NBD export nbd://h/x (2 GiB)",
// "disk vda of domain vm1 on /var/lib/vm1.qcow2 (10 GiB)",
// "disk named db1 by --disk-id (2 GiB)".
std::string DescribeDisk(const formats::DiskIdentity& disk);

// Whether `newer` is the disk `older` records: same kind, target and
// location, or a location `newer` records it was moved to from `older`'s;
// for domain disks the same `source` where both record one (named disks:
// the same name). Sizes are not compared.
bool SameDiskMaybeMoved(const formats::DiskIdentity& older, const formats::DiskIdentity& newer);

// Checks that the layers of one point (indexes into `chain`, the full
// first, as ChainFolder::LayersOf gives them) record one disk and one
// chain id. Layers that record none (older manifests) are passed over; a
// layer that records a move (moved_from) from the previous layer's location
// is the same disk.
// kCorruption naming the first layer whose disk differs from that of the
// layer before it that records one, or whose chain id differs from that of
// the oldest layer that records one, and both disks (or chain ids).
Status CheckOneDisk(const ChainFolder& chain, const std::vector<size_t>& layers);

// A new chain id: 32 random hex digits.
std::string NewChainId();

}  // namespace barge::pipeline
