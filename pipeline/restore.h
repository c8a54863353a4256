// Restore and verify jobs over a chain folder: any point in time flattened
// in one parallel pass, every cluster checked against the chain's digests.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "blockio/env.h"
#include "formats/manifest.h"
#include "pipeline/copy.h"
#include "pipeline/endpoints.h"
#include "pipeline/file_access.h"

namespace barge::pipeline {

struct RestoreRequest {
  std::string chain_dir;       // chain folder, or one of its manifests or images (LocatePoint)
  std::string at;              // "", "latest", id, position or time
  std::string destination;     // file path, block device or NBD URI
  NbdAccess destination_nbd;   // connections and TLS when `destination` is an NBD URI
  std::string output_format = "raw";  // raw or qcow2 (qcow2: files only)
  bool force = false;          // allow writing over a non-empty destination
  // Who may read a destination file made anew (OutputSpec::access):
  // private unless `--group`; nullopt: 0644 with the umask (a disk QEMU
  // opens: instant restore's).
  std::optional<FileAccess> access = FileAccess::Private();
  // false: file and device outputs are not fsynced at the end (faster; a
  // crash may lose the restored data, as with qemu-img convert).
  bool sync = true;
  formats::Compression compression = formats::Compression::kNone;  // qcow2 output
  int compression_level = 0;
  CopyOptions copy;            // knobs; cluster size and verify are set here
  // Called once the point is chosen, before any data moves: its position
  // (index in the folder's list, oldest first) and manifest. May be null.
  std::function<void(size_t position, const formats::BackupManifest&)> on_point;
};

struct RestoreResult {
  formats::BackupManifest manifest;  // of the restored point
  size_t position = 0;               // its index in the folder's list
  size_t layers = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;        // data bytes sent to the destination
  formats::Digest128 image_digest;
  double seconds = 0;
};

// Restores a point. Every cluster is checked against the chain's digests as
// it passes (kCorruption naming the guest offset of the first bad one) and
// the result's image digest must equal the manifest's. A file destination is
// written under a temporary name and renamed when verified; an existing
// non-empty file, a block device or an NBD export holding data needs force.
// An NBD destination gets zero ranges as NBD zero requests.
// Reads the chain and writes a file destination through `env`.
Result<RestoreResult> RunRestore(Env& env, const RestoreRequest& request);

// What verify found for one point.
struct VerifyOutcome {
  enum class State : uint8_t {
    kPassed,   // its data verified (with `against`: see source_differs)
    kFailed,   // damaged, unreadable or missing data: `error`
    kSkipped,  // not checked: it reads through `failed_layer`, which failed
  };
  State state = State::kPassed;
  size_t position = 0;
  std::string id;
  std::string started_at;
  std::string error;         // kFailed: Error::ToString()
  std::string failed_layer;  // kSkipped: id of the earlier point that failed
  bool source_differs = false;  // kPassed: `against` does not match the point
  uint64_t clusters_checked = 0;  // kPassed
  uint64_t bytes_read = 0;        // kPassed: of the point (and the source it matched)
};

// A base point (`backup --base`) a verified point reads through, checked
// as a point of its own chain (structure, every cluster, image digest).
struct BaseVerifyOutcome {
  std::string chain_dir;  // the base chain's folder (normalized path)
  std::string id;         // the base point
  bool passed = false;
  std::string error;      // failed: Error::ToString()
  uint64_t clusters_checked = 0;
};

struct VerifyRequest {
  std::string path;       // chain folder, manifest or image
  std::string at;         // with a chain folder
  bool all_points = false;  // verify every point of the folder
  SourceSpec against;     // location empty: none
  CopyOptions copy;
};

// What one verify run found: every point it reached, the totals, and its
// verdict (`failure`).
struct VerifyReport {
  // In position order, one per point reached: passed, failed or skipped.
  // A failure that is not about one point's data (an interruption, an
  // unreadable source) has no outcome of its own.
  std::vector<VerifyOutcome> points;
  // The bases the passed points stand on (and the bases' bases), each
  // verified once after the points; a base that fails is the failure.
  std::vector<BaseVerifyOutcome> bases;
  // Totals over the points that passed (bytes_read: the source's too).
  uint64_t clusters_checked = 0;
  uint64_t bytes_read = 0;
  bool against_checked = false;  // `against` was read and matches
  // `against` differs from a point that verified: `failure` is the
  // mismatch (kInvalidArgument naming the source, no damage to the backup).
  bool source_differs = false;
  // The first point's failure, or the error that stopped the run early
  // (an interruption, an unreadable source); unset: every point passed.
  std::optional<Error> failure;
  double seconds = 0;
  // Verification records that could not be written (a read-only folder).
  std::vector<std::string> warnings;

  bool ok() const { return !failure; }
  size_t Count(VerifyOutcome::State state) const;
};

// Verifies a point: manifests and digest tables, the qcow2 structure of every
// layer (refcounts, references, flags), every stored cluster's digest, and
// the image digest; with `against`, the source's contents too.
// Returns an error when there is nothing to check: the path, the point
// or the chain folder cannot be found or read, or the request is invalid.
// Otherwise the report. Its `failure` is the first problem: kCorruption
// naming the file and guest offset for damaged data; for a source that
// differs from a point that verified, kInvalidArgument naming the source
// (source_differs). Without `all_points` the first failure stops the run
// (a point that fails still has its outcome). With `all_points`, a point
// whose data fails does not stop the others: each later point that reads
// through it is skipped, every other one is still checked, and `failure`
// is the first one (an interruption or any other error stops at once and
// is the failure).
// Each point's outcome (passed, or failed with damaged, unreadable or
// missing data) is kept beside its manifest as <id>.verified
// (pipeline/verification_record.h); `against` does not change it.
// Reads the chain (and the `against` source) through `env`.
Result<VerifyReport> RunVerify(Env& env, const VerifyRequest& request);

}  // namespace barge::pipeline
