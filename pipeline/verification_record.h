// The outcome of the last `barge verify` of a backup point, kept beside its
// manifest as <id>.verified (format: docs/formats/backup.md), so that
// `barge list` can say when each point was last proven intact.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "blockio/error.h"
#include "formats/digest.h"
#include "pipeline/chain.h"

namespace barge::pipeline {

struct VerificationRecord {
  std::string id;                  // the point's backup id
  bool ok = false;                 // result: "ok" or "failed"
  std::string error;               // when failed: what was wrong
  std::string verified_at;         // RFC 3339 UTC, when the check ended
  double duration_seconds = 0;
  uint64_t clusters_checked = 0;
  std::string image;               // the image file name at the time
  uint64_t image_bytes = 0;        // its size at the time
  formats::Digest128 image_digest; // the manifest's image digest at the time
  formats::ImageDigestAlgorithm image_digest_algorithm = formats::kCurrentImageDigestAlgorithm;  // and its fold
  // The newest modification time among the point's layer images when the
  // check began (NewestLayerMtime); 0: not recorded (older records).
  int64_t layers_mtime_ns = 0;
};

// The newest modification time (ns since the epoch) among the image files
// of point `index`'s layers; 0 when its layers cannot be followed or a file
// cannot be stat'ed.
int64_t NewestLayerMtime(Env& env, const ChainFolder& chain, size_t index);

// "<id>.verified".
std::string VerificationFileName(std::string_view id);

Result<std::string> EncodeVerificationRecord(const VerificationRecord& record);
// Parses untrusted JSON: unknown fields are ignored; a missing or mistyped
// field (verified_at not RFC 3339, duration_seconds negative included),
// another format or a newer version is kCorruption.
Result<VerificationRecord> DecodeVerificationRecord(std::string_view json);

// Replaces point `index`'s record atomically (Env::WriteFileAtomic: a
// crash leaves the old record or the new one). May block.
Status WriteVerificationRecord(Env& env, const ChainFolder& chain, size_t index, const VerificationRecord& record);

// What `list` shows for a point.
struct LastVerification {
  VerificationRecord record;
  // The record is for other bytes than the point has now (its image file
  // was replaced, e.g. by a merge, the digest differs, or the file or a
  // layer under it was modified since the check): it proves nothing about
  // them.
  bool stale = false;
};

// Point `index`'s record: nullopt when it was never verified; kCorruption
// naming the file when the record cannot be read as one. For the stale
// check: `image` is the image file's stat now, `newest_layer_mtime_ns` what
// NewestLayerMtime would say now (the caller has the stats). May block.
Result<std::optional<LastVerification>> ReadLastVerification(Env& env, const ChainFolder& chain, size_t index,
                                                             const FileStat& image, int64_t newest_layer_mtime_ns);

}  // namespace barge::pipeline
