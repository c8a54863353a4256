// The JSON manifest beside each backup image: everything needed to restore
// and verify it without a database. Field list: docs/formats/backup.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "blockio/error.h"
#include "formats/digest.h"

namespace barge::formats {

inline constexpr uint32_t kManifestFormatVersion = 1;

enum class BackupType : uint8_t { kFull, kIncremental };
std::string_view BackupTypeName(BackupType type);  // "full" / "incremental"

struct ManifestParent {
  std::string id;
  std::string image;         // file name in the same chain folder
  Digest128 image_digest;    // the parent's whole-image digest
};

// The point of another chain (a golden image's) that a chain's first point
// is an increment over (`barge backup --base`): its image is that point's
// qcow2 backing file, by the relative name `chain + "/" + image`.
struct ManifestBase {
  std::string chain;        // the base's chain folder, relative to this
                            // chain's folder ("../golden"): ".." or plain
                            // names joined by '/'
  std::string id;           // the base point's id
  std::string image;        // its image file name in that folder
  Digest128 image_digest;   // its whole-image digest
  std::string chain_id;     // the base chain's id ("" if it has none)

  // The qcow2 backing file name: chain + "/" + image.
  std::string BackingName() const { return chain + "/" + image; }
};

// The disk a point was read from (docs/formats/backup.md, "Which disk a
// chain holds"): every point of one chain records the same one.
struct DiskIdentity {
  std::string kind;      // "file", "block", "nbd" or "domain"
  std::string location;  // file/block: canonical path; nbd: the URI without
                         // credentials; domain: the domain's name
  std::string target;    // domain: the disk's target ("vda"); else ""
  uint64_t virtual_size = 0;
  std::string source;    // domain: the canonical path of the file or device
                         // behind the target when backed up ("" in older
                         // manifests: not compared); else ""
  // file/block: the location the disk had in the chain's point before this
  // one, when `barge state migrate` moved it since (its marker says so);
  // "" = not moved. Recorded by the first point taken at the new location.
  std::string moved_from;

  bool operator==(const DiskIdentity&) const = default;
};

struct BackupManifest {
  uint32_t format_version = kManifestFormatVersion;
  std::string id;            // unique within the chain, e.g. 20261122T150102Z-0001
  std::string disk;          // chain (disk) name
  BackupType type = BackupType::kFull;
  std::string reason;        // why this type (e.g. "first backup", "--force-full")
  std::string source;        // path, device or URI that was read
  std::string source_format; // raw / qcow2 / nbd
  uint64_t virtual_size = 0;
  uint32_t cluster_size = 0;
  std::string compression;   // "zstd:3", "zlib:6", "none"
  std::string image;         // image file name (relative to the chain folder)
  std::string digest_table;  // digest table file name
  // Strong (SHA-256) digest table file name, "" when the point has none
  // (only chains that detect changes by digest keep one).
  std::string strong_digest_table;
  std::optional<ManifestParent> parent;
  // Only on a chain's first point (parent null): the other chain's point it
  // stores the differences from.
  std::optional<ManifestBase> base;
  std::string checkpoint;    // libvirt checkpoint, if any
  std::string dirty_source;  // "bitmap:NAME", "extents:FILE", "nbd:CONTEXT"
  uint64_t dirty_bytes = 0;
  // How the changes were found: "" (what dirty_source says: a bitmap or
  // extents), "digests" (every cluster compared by strong digest) or
  // "bitmap+digests" (the record's changes plus what the digests found).
  std::string changed_by;
  // bitmap+digests: changed clusters the record missed (written anyway).
  std::optional<uint64_t> missed_clusters;
  std::string started_at;    // RFC 3339 UTC
  std::string finished_at;
  // How long the backup took, to the microsecond; nullopt in manifests
  // written before barge recorded it (started_at/finished_at then tell it
  // to the second).
  std::optional<double> duration_seconds;
  std::string tool_version;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;    // size of the image file
  uint64_t data_clusters = 0;    // stored with data (raw or compressed)
  uint64_t compressed_clusters = 0;
  uint64_t zero_clusters = 0;    // stored as zero clusters
  Digest128 image_digest;        // fold of every cluster's digest at this point
  // How image_digest folds the clusters: new points the current algorithm;
  // points written before version 2 kClusterFold (their manifests say so).
  ImageDigestAlgorithm image_digest_algorithm = kCurrentImageDigestAlgorithm;
  // Absent in manifests written before barge recorded them: such a point
  // is of whatever disk the rest of its chain records.
  std::optional<DiskIdentity> disk_identity;
  std::string chain_id;          // made at the full, carried by its incrementals
};

Result<std::string> EncodeManifest(const BackupManifest& manifest);

// Parses untrusted JSON: unknown fields are ignored, missing or mistyped
// required fields, bad digests, file names with '/' or "..", and
// unsupported versions are errors (kCorruption / kNotSupported).
Result<BackupManifest> DecodeManifest(std::string_view json);

// True for a base chain path a manifest may record: relative, its parts
// ".." or plain non-hidden names ("../golden", "../../t2/golden").
bool IsBaseChainPath(std::string_view path);

// Current UTC time as RFC 3339 ("2026-11-22T15:01:02Z") and as a compact id
// stem ("20261122T150102Z").
std::string NowRfc3339();
std::string CompactTimestamp(std::string_view rfc3339);

}  // namespace barge::formats
