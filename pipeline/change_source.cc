#include "pipeline/change_source.h"

namespace barge::pipeline {

Status ApplyChangeSource(const ChangeSourceFlags& flags, BackupRequest& req) {
  req.incremental = flags.incremental;
  req.dirty_bitmap = flags.dirty_bitmap;
  req.dirty_extents_file = flags.dirty_extents;
  const bool has_record = !flags.dirty_bitmap.empty() || !flags.dirty_extents.empty();
  if (flags.changed_by == "digests") {
    req.changed_by = ChangedBy::kDigests;
    if (has_record) {
      return Error::InvalidArgument("--changed-by digests reads no bitmap or extents file: drop "
                                    "--dirty-bitmap/--dirty-extents, or use --changed-by bitmap+digests");
    }
  } else if (flags.changed_by == "bitmap+digests") {
    req.changed_by = ChangedBy::kRecordAndDigests;
    if (!flags.incremental) return Error::InvalidArgument("--changed-by bitmap+digests needs --incremental");
  } else {
    req.changed_by = ChangedBy::kRecord;
  }
  if (flags.incremental && req.changed_by != ChangedBy::kDigests &&
      flags.dirty_bitmap.empty() == flags.dirty_extents.empty()) {
    return Error::InvalidArgument("--incremental needs exactly one of --dirty-bitmap or --dirty-extents (where the "
                                  "changes are), or --changed-by digests");
  }
  if (flags.incremental && flags.cluster_size_given) {
    return Error::InvalidArgument("--cluster-size does not apply to an incremental: it keeps its chain's cluster size");
  }
  return OkStatus();
}

std::string ChangeRecordText(const BackupRequest& req) {
  return req.dirty_bitmap.empty() ? "the extents file" : "bitmap '" + req.dirty_bitmap + "'";
}

std::string ChangeRecordField(const BackupRequest& req) {
  return req.dirty_bitmap.empty() ? "extents:" + req.dirty_extents_file : "bitmap:" + req.dirty_bitmap;
}

}  // namespace barge::pipeline
