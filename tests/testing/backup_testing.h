// A raw file backed up through the pipeline, for the pipeline's own tests
// (merge, point reader, thin disks): disk "d" of a chain folder, a full or
// an incremental of the given ranges.
#pragma once

#include <optional>
#include <string>

#include "blockio/extent.h"
#include "formats/image.h"
#include "pipeline/backup.h"

namespace barge::testing {

// RunBackup of `raw` (format raw) into `target` as disk "d": a full when
// `dirty` is empty, else an incremental of those ranges. Small knobs (8 MiB
// of memory, 2 threads); `uncompressed` stores clusters as they are, so a
// test can find a cluster's bytes in the file.
inline Status BackupRawFile(const std::string& raw, const std::string& target, std::optional<RangeList> dirty,
                            bool uncompressed = false) {
  pipeline::BackupRequest req;
  req.source.location = raw;
  req.source.format = "raw";
  req.target_dir = target;
  req.disk_name = "d";
  req.incremental = dirty.has_value();
  req.dirty_ranges = std::move(dirty);
  if (uncompressed) {
    req.compression = formats::Compression::kNone;
    req.compression_level = 0;
  }
  req.copy.memory_bytes = 8 * 1024 * 1024;
  req.copy.threads = 2;
  auto r = pipeline::RunBackup(PosixEnv(), req);
  if (!r.ok()) return std::move(r).error();
  return OkStatus();
}

}  // namespace barge::testing
