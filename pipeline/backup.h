// Backup jobs: a full or incremental backup of one disk into its chain
// folder (docs/formats/backup.md), on the copy pipeline.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "blockio/env.h"
#include "blockio/extent.h"
#include "blockio/source.h"
#include "formats/manifest.h"
#include "pipeline/backup_resume.h"
#include "pipeline/clean_sample.h"
#include "pipeline/copy.h"
#include "pipeline/endpoints.h"
#include "pipeline/file_access.h"

namespace barge::pipeline {

// How an incremental finds what changed since the chain's latest point.
enum class ChangedBy : uint8_t {
  // The change record only: the dirty bitmap, extents file or ranges given.
  kRecord,
  // No record: every allocated cluster of the source is read and compared
  // by SHA-256 with the latest point's strong digest table (computed from
  // the chain when that point has none). On a full: keep the table, so the
  // chain's next digest incremental compares without reading the chain.
  kDigests,
  // The record's changes, plus every cluster the digests find changed that
  // the record missed (reported: on_missed, BackupResult::missed).
  kRecordAndDigests,
};

struct BackupRequest {
  SourceSpec source;
  std::string target_dir;  // the chain folder is target_dir/disk_name
  std::string disk_name;   // "" = the source's base name without extension
  // Who may read the chain (ChainWriterOptions::access): unset, a new
  // chain folder (and a target folder made for it) is private and an
  // existing one keeps its access; set (`--group`), it is given this one.
  std::optional<FileAccess> access;
  bool incremental = false;
  // What changed since the parent (incrementals; exactly one):
  std::string dirty_bitmap;        // a qcow2 persistent bitmap, or the NBD
                                   // export's qemu:dirty-bitmap:NAME
  std::string dirty_extents_file;  // an extents file (docs/formats/extents.md)
  std::optional<RangeList> dirty_ranges;  // given by the caller (orchestrate)
  std::string dirty_description;   // recorded when dirty_ranges is given
  ChangedBy changed_by = ChangedBy::kRecord;
  // kRecord incrementals: before trusting the record, a sample of the
  // clusters it calls unchanged (SampleCleanClusters, up to
  // kCleanSampleClusters) is read from the source and compared with the
  // chain's latest point. Any that differ mean the disk is not the chain's
  // (its file replaced under the same path, carrying its own bitmaps) or
  // the record missed writes: the backup is then taken as a full, with
  // ReplacedDiskReason as its reason (BackupResult::replaced). false: no
  // sample (`--no-clean-check`).
  bool check_clean = true;
  // kRecordAndDigests: told, before the copy, each run of clusters (guest
  // bytes) that changed but the record did not name. May be empty.
  std::function<void(const Range& missed)> on_missed;
  // Digest modes: told, before the scan, when the chain's latest point has
  // no strong digest table and it is computed by reading that point (its
  // id). May be empty.
  std::function<void(const std::string& point_id)> on_computing_strong;
  std::string reason;              // recorded why; "" = a default per type
  std::string checkpoint;          // recorded libvirt checkpoint name
  // Incrementals from a libvirt checkpoint: the checkpoint the changes are
  // since, which must be the one the chain's latest point recorded.
  std::string since_checkpoint;
  // The disk read, where the source's location does not name it (a domain's
  // disk via a one-run socket; kind kNamedDiskKind: a --disk-id, checked by
  // CheckDiskId); nullopt = the source's own identity (disk_identity.h).
  // Its virtual size is always the source's.
  std::optional<formats::DiskIdentity> disk_identity;
  // For a file source whose path is not the one the chain records: the
  // path it had before `barge state migrate` moved it (from the migration's
  // marker; orchestrate's MovedFromLocation), or "". Unset: moves are not
  // looked for (the incremental is refused as another disk's).
  std::function<std::string(const std::string& canonical_path)> previous_location;
  // A full backup of a disk whose size differs from the chain's latest
  // point is refused (another disk backed up under this name?) unless
  // this says the disk was resized.
  bool allow_resize = false;
  // A full written as an increment over another chain's point
  // (docs/formats/backup.md, "Chains over a base"): "CHAIN[@POINT]", CHAIN
  // a chain folder's path, or a chain name (no '/') in target_dir; POINT
  // as restore --at (default: latest). "" = none.
  std::string base;
  formats::Compression compression = formats::Compression::kZstd;
  int compression_level = formats::kDefaultZstdLevel;
  // Resumable (docs/formats/resume.md): a journal beside the staged image
  // records what is stored, at checkpoints; a copy whose source fails
  // (not a cancel, nor a failed write to the target) keeps both; and a later run of the same
  // backup (same source, size, chain point, changes, options) checks what
  // was staged against its digests and copies only the rest. false: what a
  // killed run staged is swept, and a failed run leaves nothing.
  bool resume = false;
  // Told once, before the copy, when a staged backup was found (resumed or
  // not, and why). May be empty.
  std::function<void(const ResumeNote&)> on_resume;
  // With resume: what a copy whose source failed keeps of its staged image
  // and journal. kAfterSourceFailure: kept (`barge backup`). kWhenDisconnected:
  // kept only when the source's connection was lost for good (an I/O error
  // marked retryable: reconnecting gave up, or was off), not when the source
  // answered with an error (a vm backup keeps its checkpoint for exactly that
  // case: docs/formats/resume.md, "vm backup"). kNever: only a killed run
  // leaves them.
  enum class KeepStaged { kAfterSourceFailure, kWhenDisconnected, kNever };
  KeepStaged keep_staged = KeepStaged::kAfterSourceFailure;
  // With resume: the work set is kept beside the journal (kResumeWorkName),
  // so that a later run at another point in time can resume (StagedEarlier).
  bool keep_work = false;
  // Resuming what a killed run staged at an earlier point in time (a vm
  // backup; docs/formats/resume.md, "vm backup"): its journal's key names
  // `checkpoint` and its work set was `work`; `changes_bitmap` gives what
  // changed on the disk since that checkpoint: the NBD source's meta
  // context (for an incremental, also its dirty_bitmap), or a persistent
  // bitmap of a qcow2 file source (a shut-off domain's CBT overlay; an
  // incremental's dirty_bitmap is then the parent's, and the work also
  // holds what it records now). The work is then `work` plus those changes
  // (a full: the whole disk), and the staged clusters are kept only below
  // the first changed one. Needs resume.
  struct StagedEarlier {
    std::string checkpoint;
    RangeList work;
    std::string changes_bitmap;
  };
  std::optional<StagedEarlier> staged_earlier;
  // Why a staged backup found cannot be resumed, where the caller knows
  // (its note says so, and it is swept); "" = decided here.
  std::string resume_refused;
  // Pipeline knobs (cluster_bytes, memory, threads, progress, stats,
  // cancel). Compression fields are taken from above.
  CopyOptions copy;
  std::string tool_version = "0.1.0";
};

struct BackupResult {
  formats::BackupManifest manifest;
  std::string chain_dir;
  std::string image_path;
  std::string manifest_path;
  std::string digests_path;
  std::string strong_digests_path;  // "" when the point keeps no strong table
  // Digest modes: the clusters found changed by digest; kRecordAndDigests:
  // those the record missed (written all the same).
  uint64_t digest_changed_clusters = 0;
  RangeList missed;
  uint64_t missed_clusters = 0;
  // The latest point's strong table was computed from the chain (bytes read).
  bool strong_computed = false;
  uint64_t strong_computed_bytes = 0;
  uint64_t bytes_read = 0;
  uint64_t image_bytes = 0;
  double seconds = 0;
  std::optional<ResumeNote> resume;  // when a staged backup was found
  // The temporaries of killed runs that this run's sweep removed, by name
  // (".NAME.barge-tmp" in the chain folder): what could not be resumed. In
  // a bucket each is an unfinished multipart upload, aborted.
  std::vector<std::string> stale;
  // --base: bytes of the base point read to compute its strong table (0
  // when it keeps one).
  uint64_t base_compared_bytes = 0;
  // The sampled check of the record's clean clusters (check_clean): what it
  // read and found (clusters 0: not sampled), and, when it found the disk
  // replaced, the reason this point was taken as a full instead of the
  // incremental requested ("" otherwise).
  CleanSample clean_sample;
  std::string replaced;
  // A full under a name whose chain holds another disk (same size, or
  // --allow-resize): OtherDiskReason's sentence, a warning ("" otherwise).
  std::string other_disk;
};

// Runs one backup. Before writing anything it checks: the source opens; for
// an incremental, the chain has a latest point whose manifests and digest
// tables verify, that point is of this disk (OtherDiskReason; otherwise
// kInvalidArgument naming both disks and how to start a new chain), its
// checkpoint is since_checkpoint (when given), the virtual size is
// unchanged, and the dirty set is valid;
// for a full into a chain that has points, the size is the latest's (or
// allow_resize); for a record incremental, the sample of its clean clusters
// matches the latest point (check_clean; otherwise the backup is a full);
// the target has room for the estimate (kNoSpace saying how much is
// needed). Files go under temporary names and are renamed image, digests,
// manifest last (recording the disk's identity and the chain id: a new one
// for a full, the parent's for an incremental); on any error nothing new is left in the chain folder (and
// a first backup that fails leaves no chain folder and no lock file).
// With request.resume, a failed copy keeps its staged image and journal
// (the error then says the next run resumes), and a staged backup is
// resumed or swept as ResumeNote says.
// A second backup of the same chain folder at the same time fails at once
// (kBusy). Every file is opened, written, renamed and synced through `env`
// (tests wrap it to fail or stop any call, blockio/env.h).
Result<BackupResult> RunBackup(Env& env, const BackupRequest& request);

// The default disk name for a source: its base name without extension
// ("vm1.qcow2" -> "vm1"; "nbd://host/vda" -> "vda"; an NBD URI without an
// export name, "nbd+unix:///?socket=S" -> "disk").
std::string DefaultDiskName(const std::string& location);

// Bytes a backup of `work` of `image` may need on the target at most
// (allocated data stored uncompressed, plus metadata). kCancelled once
// `cancel` (may be null) is set, polled between 1 GiB extent queries.
Result<uint64_t> EstimateBackupBytes(BlockSource& source, const RangeList& work,
                                     uint32_t cluster_bytes, const std::atomic<bool>* cancel = nullptr);

// Free bytes for an unprivileged writer on the filesystem holding `dir`.
Result<uint64_t> FreeBytes(Env& env, const std::string& dir);

}  // namespace barge::pipeline
