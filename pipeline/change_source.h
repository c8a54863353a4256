// Where an incremental backup's changes come from, as a command line names
// it (`barge backup --incremental --dirty-bitmap|--dirty-extents|
// --changed-by`): the choice checked and set on a BackupRequest, so the cli
// only declares the flags.
#pragma once

#include <string>

#include "blockio/error.h"
#include "pipeline/backup.h"

namespace barge::pipeline {

// The flags as given (strings empty when not given).
struct ChangeSourceFlags {
  bool incremental = false;          // --incremental
  std::string changed_by;            // --changed-by: "", "bitmap", "digests", "bitmap+digests"
  std::string dirty_bitmap;          // --dirty-bitmap
  std::string dirty_extents;         // --dirty-extents
  bool cluster_size_given = false;   // --cluster-size was given
};

// Sets req.incremental, changed_by, dirty_bitmap and dirty_extents_file
// from `flags`. A full with --changed-by digests keeps the SHA-256 table
// for the chain's next digest incremental.
// Returns kInvalidArgument, its message naming the flags to change, when:
// digests with a bitmap or extents file; bitmap+digests without
// --incremental; an incremental (not by digests) without exactly one of
// --dirty-bitmap and --dirty-extents; --cluster-size on an incremental (it
// keeps its chain's). req is then partly set and not to be run.
Status ApplyChangeSource(const ChangeSourceFlags& flags, BackupRequest& req);

// The record an incremental of `req` reads, for messages: "bitmap 'NAME'"
// or "the extents file" (`req` names no bitmap).
std::string ChangeRecordText(const BackupRequest& req);

// The same as a field value: "bitmap:NAME" or "extents:FILE".
std::string ChangeRecordField(const BackupRequest& req);

}  // namespace barge::pipeline
