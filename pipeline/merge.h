// Merge (retention): folds the full backup and the increments up to a point
// into a new full backup of that point, then removes the folded layers. The
// on-disk protocol is in docs/formats/backup.md ("Merge").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "formats/manifest.h"
#include "pipeline/chain.h"
#include "pipeline/copy.h"
#include "pipeline/file_access.h"
#include "pipeline/merge_journal.h"

namespace barge::pipeline {

// Whether `dir` holds a manifest or a merge journal: a folder without
// either has nothing to merge or forget (and gets no lock file). kNotFound
// naming the folder when it is missing or not a folder.
Result<bool> HoldsBackups(Env& env, const std::string& dir);

struct MergeRequest {
  std::string chain_dir;
  std::string through;  // the point to fold into a full: id, position, time, latest
  // Only say what the merge would do (folded ids, files removed): nothing
  // is written, not even the lock file.
  bool dry_run = false;
  // The caller's lock of `chain_dir` (ChainLock::Acquire; a forget that
  // plans and merges under one lock), or null to take it here.
  const ChainLock* held = nullptr;
  // Shares the chain with a group from now on (ChainWriterOptions::access;
  // `merge --group`); unset: the chain keeps its folder's access.
  std::optional<FileAccess> access;
  // Knobs (memory, threads, progress, stats, cancel); cluster size,
  // compression and verify are the chain's.
  CopyOptions copy;
};

struct MergeResult {
  bool merged = false;                  // false: the point already was a full, or a dry run
  bool dry_run = false;
  formats::BackupManifest manifest;     // the point's new (full) manifest
  std::vector<std::string> folded_ids;  // the layers folded, oldest first (incl. the point)
  std::vector<std::string> removed_files;  // (a dry run: would be removed)
  uint64_t bytes_read = 0;
  uint64_t image_bytes = 0;             // size of the new image file
  double seconds = 0;
};

// Merges under the chain lock; every file operation goes through `env`
// (tests fail or stop it at any call to check the protocol). Steps: complete any interrupted merge (as
// LoadChainFolder does); flatten the point into a staged full qcow2 (same
// cluster size and compression, zero clusters omitted), every cluster
// verified against the chain's digests; stage its digest table (data
// clusters only) and a manifest with the point's id, file names and image
// digest, type full, no parent; re-read and verify the staged image; write
// the journal; rename image, digests, manifest; remove the folded layers
// (manifests first); remove the journal. Points after the point are
// untouched and restore as before.
// Returns: the result (merged=false if the point already is a full); on an
// error before the journal nothing in the folder changed; after it, the
// next job that loads the folder completes the merge.
// kNotFound naming the chain folder when it is missing or holds no backups
// (and then no lock file is left behind); kInvalidArgument when a point of
// another branch still depends on a layer that would be removed; kBusy when
// another job holds the folder; kCancelled when options.copy.cancel is set
// before the journal is written (nothing changed).
Result<MergeResult> RunMerge(Env& env, const MergeRequest& request);

}  // namespace barge::pipeline
