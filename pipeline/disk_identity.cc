// Disk identities of sources and the one-disk-per-chain checks.
#include "pipeline/disk_identity.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <random>

#include "formats/units.h"

namespace barge::pipeline {

formats::DiskIdentity IdentityOf(Env& env, const SourceSpec& spec, const OpenedSource& source) {
  formats::DiskIdentity id;
  switch (source.kind) {
    case SourceKind::kNbd:
      id.kind = "nbd";
      id.location = RedactNbdUri(spec.location);
      break;
    case SourceKind::kHttp:
      id.kind = "url";
      id.location = RedactHttpUrl(spec.location);
      break;
    case SourceKind::kBlockDevice:
      id.kind = "block";
      id.location = CanonicalPath(env, spec.location);
      break;
    case SourceKind::kFile:
      id.kind = "file";
      id.location = CanonicalPath(env, spec.location);
      break;
  }
  id.virtual_size = source.image->size_bytes();
  return id;
}

Status CheckDiskId(std::string_view disk_id) {
  auto allowed = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string_view("._:@/+-").find(c) != std::string_view::npos;
  };
  if (disk_id.empty() || disk_id.size() > 200 || disk_id.front() == '-' ||
      !std::all_of(disk_id.begin(), disk_id.end(), allowed)) {
    return Error::InvalidArgument("a disk id is 1 to 200 characters of A-Z a-z 0-9 . _ : @ / + - not starting "
                                  "with '-'");
  }
  return OkStatus();
}

formats::DiskIdentity NamedIdentity(std::string_view disk_id, uint64_t virtual_size) {
  // Nothing of what it is read through: a later point of the disk is read
  // through another URI, and every field here is compared.
  formats::DiskIdentity id;
  id.kind = std::string(kNamedDiskKind);
  id.location = std::string(disk_id);
  id.virtual_size = virtual_size;
  return id;
}

Result<formats::DiskIdentity> IdentifySource(Env& env, const SourceSpec& spec) {
  BARGE_ASSIGN_OR_RETURN(OpenedSource source, OpenSource(env, spec));
  return IdentityOf(env, spec, source);
}

std::string DescribeDisk(const formats::DiskIdentity& disk) {
  if (disk.kind == kNamedDiskKind) {
    return "disk named " + disk.location + " by --disk-id" +
           (disk.virtual_size == 0 ? "" : " (" + formats::HumanBytes(disk.virtual_size) + ")");
  }
  const std::string what = disk.kind == "domain" ? "disk " + disk.target + " of domain " + disk.location
                           : disk.kind == "nbd"  ? "NBD export " + disk.location
                           : disk.kind == "block" ? "block device " + disk.location
                                                  : disk.kind + " " + disk.location;
  return what + (disk.source.empty() ? "" : " on " + disk.source) + " (" + formats::HumanBytes(disk.virtual_size) +
         ")";
}

bool SameDiskMaybeMoved(const formats::DiskIdentity& older, const formats::DiskIdentity& newer) {
  if (older.kind != newer.kind || older.target != newer.target) return false;
  // A domain disk's file (`source`) is compared where both record one.
  if (!older.source.empty() && !newer.source.empty() && older.source != newer.source) return false;
  return older.location == newer.location || (!newer.moved_from.empty() && newer.moved_from == older.location);
}

Result<std::string> OtherDiskReason(const ChainFolder& chain, const formats::DiskIdentity& source) {
  if (chain.empty()) return std::string();
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(chain.points.size() - 1));
  for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
    const formats::BackupManifest& m = chain.points[*it].manifest;
    if (!m.disk_identity) continue;
    const formats::DiskIdentity& d = *m.disk_identity;
    // Sizes are not compared: the same disk resized is the size check's
    // case (a full with --allow-resize), not another disk.
    if (SameDiskMaybeMoved(d, source)) return std::string();
    const std::string latest = chain.latest().manifest.id;
    // A named chain says how a source takes its name: the name is all that
    // makes a source read through another URI (port) the chain's disk.
    const std::string hint = d.kind != kNamedDiskKind || source.kind == kNamedDiskKind
                                 ? ""
                                 : " with no disk id (the chain's disk is named " + d.location +
                                       ": only a source given that id, by --disk-id or a policy's "
                                       "disk_id, extends its chain)";
    return "the chain's latest backup " + latest + " is of " + DescribeDisk(*m.disk_identity) +
           (*it == chain.points.size() - 1 ? "" : " (as its layer " + m.id + " records)") + ", this source is " +
           DescribeDisk(source) + hint;
  }
  return std::string();
}

Status CheckOneDisk(const ChainFolder& chain, const std::vector<size_t>& layers) {
  std::optional<size_t> disk_from, chain_id_from;
  for (size_t i : layers) {
    const ChainPoint& p = chain.points[i];
    const formats::BackupManifest& m = p.manifest;
    if (m.disk_identity) {
      // Each layer is compared with the one before it that records a disk,
      // so a disk moved by `state migrate` (moved_from) stays one disk.
      if (disk_from) {
        const auto& previous = chain.points[*disk_from].manifest;
        if (!SameDiskMaybeMoved(*previous.disk_identity, *m.disk_identity) ||
            previous.disk_identity->virtual_size != m.disk_identity->virtual_size) {
          return Error::Corruption("the chain mixes disks: backup " + m.id + " is of " + DescribeDisk(*m.disk_identity) +
                                 ", backup " + previous.id + " before it in its chain of " +
                                 DescribeDisk(*previous.disk_identity) + "; the points from " + m.id +
                                 " on do not restore that disk (the earlier points do)")
              .set_path(p.manifest_path);
        }
      }
      disk_from = i;
    }
    if (!m.chain_id.empty()) {
      if (!chain_id_from) {
        chain_id_from = i;
      } else if (const auto& first = chain.points[*chain_id_from].manifest; first.chain_id != m.chain_id) {
        return Error::Corruption("the chain mixes disks: backup " + m.id + " belongs to chain " + m.chain_id +
                                 ", backup " + first.id + " before it to chain " + first.chain_id +
                                 "; the points from " + m.id + " on do not restore that disk (the earlier "
                                 "points do)")
            .set_path(p.manifest_path);
      }
    }
  }
  return OkStatus();
}

std::string NewChainId() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    out += buf;
  }
  return out;
}

}  // namespace barge::pipeline
