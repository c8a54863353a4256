// Full and incremental backups into a chain folder.
#include "pipeline/backup.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>
#include <thread>

#include "blockio/env.h"
#include "blockio/path.h"
#include "formats/digest_table.h"
#include "formats/extents_file.h"
#include "formats/json_fields.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_format.h"
#include "formats/units.h"
#include "pipeline/backup_resume.h"
#include "pipeline/backup_steps.h"
#include "pipeline/base_refs.h"
#include "pipeline/chain.h"
#include "pipeline/chain_folder.h"
#include "pipeline/destination_spec.h"
#include "pipeline/digest_changes.h"
#include "pipeline/disk_identity.h"
#include "pipeline/export_lock.h"

namespace barge::pipeline {

namespace {

using namespace backup_steps;

Status CheckDiskName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name[0] == '.') {
    return Error::InvalidArgument("disk name '" + name +
                                  "' must be a plain, non-hidden folder name (use --name)");
  }
  return OkStatus();
}

// dirty.source of extents read from a pipe (docs/formats/backup.md).
constexpr std::string_view kExtentsFromAPipe = "extents:pipe";

Result<RangeList> DirtySet(Env& env, const BackupRequest& req, OpenedSource& src, std::string& description) {
  uint64_t size = src.image->size_bytes();
  if (req.dirty_ranges) {
    description = req.dirty_description.empty() ? "caller" : req.dirty_description;
    return *req.dirty_ranges;
  }
  if (!req.dirty_extents_file.empty()) {
    BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(req.dirty_extents_file));
    if (st.is_directory()) {
      return Error::InvalidArgument("a folder, not an extents file (JSON)").set_path(req.dirty_extents_file);
    }
    // A pipe's name (`--dirty-extents <(cbt-tool ...)`: /dev/fd/63) is
    // gone when the backup ends: the manifest says a pipe instead.
    description = st.is_regular() || st.is_block_device() ? "extents:" + req.dirty_extents_file
                                                          : std::string(kExtentsFromAPipe);
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(env, req.dirty_extents_file, 4ull << 30));
    auto file = formats::DecodeExtentsFile(text);
    if (!file.ok()) {
      // The user's input, not barge's data: a bad file is invalid input
      // (exit 1), as a wrong size or an extent out of range is.
      Error e = std::move(file).error();
      return Error::InvalidArgument("not a valid extents file: " + e.message()).set_path(req.dirty_extents_file);
    }
    if (file->virtual_size && *file->virtual_size != size) {
      return Error::InvalidArgument("extents file is for a disk of " + formats::HumanBytesExact(*file->virtual_size) +
                                    ", the source has " + formats::HumanBytesExact(size))
          .set_path(req.dirty_extents_file);
    }
    for (const Range& r : file->dirty) {
      if (r.end() > size) {
        return Error::InvalidArgument("extents file names bytes beyond the end of the source")
            .set_path(req.dirty_extents_file)
            .set_range(r.offset, r.length);
      }
    }
    return file->dirty;
  }
  if (src.nbd != nullptr) {
    description = "nbd:" + src.image->name() + ":" + req.dirty_bitmap;
    return src.nbd->DirtyRanges(0, size);
  }
  description = "bitmap:" + req.dirty_bitmap;
  for (const auto& b : src.image->info().bitmaps) {
    if (b.name == req.dirty_bitmap && b.in_use) {
      return Error::InvalidArgument("bitmap '" + req.dirty_bitmap +
                                    "' is inconsistent (in use: the VM or qemu-nbd did not close "
                                    "it cleanly); take a full backup")
          .set_path(src.image->name());
    }
  }
  return formats::ReadBitmapDirtyRanges(*src.image, req.dirty_bitmap);
}

// What changed on the disk since a staged run's checkpoint
// (req.staged_earlier): the NBD export's meta context, or the qcow2 file's
// persistent bitmap of that name (refused when in use: not closed cleanly).
Result<RangeList> ChangedSinceStaged(const BackupRequest& req, OpenedSource& src) {
  uint64_t size = src.image->size_bytes();
  if (src.nbd != nullptr) return src.nbd->DirtyRanges(0, size);
  const std::string& name = req.staged_earlier->changes_bitmap;
  for (const auto& b : src.image->info().bitmaps) {
    if (b.name == name && b.in_use) {
      return Error::InvalidArgument("bitmap '" + name +
                                    "' of the interrupted run's checkpoint is inconsistent (in use: the VM did "
                                    "not close it cleanly)")
          .set_path(src.image->name());
    }
  }
  return formats::ReadBitmapDirtyRanges(*src.image, name);
}


}  // namespace

std::string DefaultDiskName(const std::string& location) {
  std::string s = location;
  if (auto q = s.find('?'); q != std::string::npos) s = s.substr(0, q);
  if (IsNbdUri(s)) {
    // Only the export name counts: "nbd+unix:///?socket=S" has none, and
    // "nbd://host:10809" must not name the chain after the host.
    auto authority = s.find("://");
    auto slash = s.find('/', authority == std::string::npos ? 0 : authority + 3);
    s = slash == std::string::npos ? "" : s.substr(slash);
  }
  while (!s.empty() && s.back() == '/') s.pop_back();
  std::string base = s.substr(s.find_last_of('/') == std::string::npos ? 0 : s.find_last_of('/') + 1);
  // Only the last extension goes ("disk.v1.raw" -> "disk.v1"), as the
  // documented "base name without its extension".
  if (auto dot = base.rfind('.'); dot != std::string::npos && dot > 0) base = base.substr(0, dot);
  return base.empty() ? "disk" : base;
}

Result<uint64_t> EstimateBackupBytes(BlockSource& source, const RangeList& work,
                                     uint32_t cluster_bytes, const std::atomic<bool>* cancel) {
  uint64_t data = 0;
  constexpr uint64_t kWindow = 1ull << 30;
  for (const Range& r : work) {
    for (uint64_t off = r.offset; off < r.end(); off += kWindow) {
      // Each window asks the source (an NBD server may take its time).
      BARGE_RETURN_IF_ERROR(CheckCancel(cancel, "backup interrupted while estimating its size", source.name()));
      uint64_t n = std::min(kWindow, r.end() - off);
      BARGE_ASSIGN_OR_RETURN(ExtentList extents, source.Extents(off, n));
      for (const Extent& e : extents) {
        if (e.kind == ExtentKind::kData) data += e.length;
      }
    }
  }
  // L2 entries (8 bytes per cluster), refcounts and header: a generous 1%
  // plus a few clusters.
  uint64_t metadata = data / 100 + 16ull * cluster_bytes + (1u << 20);
  return data + metadata;
}

Result<uint64_t> FreeBytes(Env& env, const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(SpaceInfo space, env.Space(dir));
  return space.free_bytes;
}

namespace {


// An incremental reads exactly one record of changes; a full reads none.
Status CheckChangeInputs(const BackupRequest& req) {
  int dirty_inputs = !req.dirty_bitmap.empty() + !req.dirty_extents_file.empty() +
                     req.dirty_ranges.has_value();
  if (req.changed_by == ChangedBy::kDigests) {
    if (dirty_inputs != 0) {
      return Error::InvalidArgument("--changed-by digests reads no change record: drop --dirty-bitmap/--dirty-extents, "
                                    "or use --changed-by bitmap+digests");
    }
    return OkStatus();
  }
  if (req.changed_by == ChangedBy::kRecordAndDigests && (!req.incremental || dirty_inputs != 1)) {
    return Error::InvalidArgument("--changed-by bitmap+digests is for an incremental with one of --dirty-bitmap or "
                                  "--dirty-extents");
  }
  if (req.incremental && dirty_inputs != 1) {
    return Error::InvalidArgument("an incremental backup needs exactly one of --dirty-bitmap or --dirty-extents");
  }
  if (!req.incremental && dirty_inputs != 0) {
    return Error::InvalidArgument("--dirty-bitmap/--dirty-extents need --incremental");
  }
  return OkStatus();
}

// 1. Opens the source (an NBD export with its dirty bitmap's context) and
// takes the disk's identity.
Status OpenBackupSource(Env& env, const BackupRequest& req, BackupRun& run) {
  run.spec = req.source;
  run.spec.nbd_retry = req.copy.nbd_retry;
  if (req.incremental && !req.dirty_bitmap.empty() && IsNbdUri(run.spec.location)) {
    run.spec.nbd_dirty_context = req.dirty_bitmap.starts_with("qemu:")
                                     ? req.dirty_bitmap
                                     : "qemu:dirty-bitmap:" + req.dirty_bitmap;
  }
  const bool nbd = IsNbdUri(run.spec.location);
  if (req.staged_earlier) {
    // The changes since the staged run's checkpoint: an NBD export's meta
    // context (a pull job incremental from that checkpoint, which is then
    // also an incremental's dirty bitmap), or a persistent bitmap of the
    // qcow2 file read (a CBT overlay of a shut-off domain).
    if (!req.resume || req.changed_by != ChangedBy::kRecord || req.staged_earlier->changes_bitmap.empty() ||
        (nbd && req.incremental && req.dirty_bitmap != req.staged_earlier->changes_bitmap) ||
        (!nbd && req.incremental && req.dirty_bitmap.empty())) {
      return Error::InvalidArgument("resuming a backup staged at an earlier checkpoint needs resume, its changes "
                                    "as an NBD export's dirty bitmap or a qcow2 file's persistent bitmap, and an "
                                    "incremental's changes as a dirty bitmap");
    }
    if (nbd) run.spec.nbd_dirty_context = req.staged_earlier->changes_bitmap;
  }
  BARGE_ASSIGN_OR_RETURN(run.src, OpenSource(env, run.spec));
  run.size = run.src.image->size_bytes();
  if (req.disk_identity && req.disk_identity->kind == kNamedDiskKind) {
    // --disk-id: a word of the user's, checked as the CLI checks it.
    BARGE_RETURN_IF_ERROR(CheckDiskId(req.disk_identity->location));
    run.identity = NamedIdentity(req.disk_identity->location, run.size);
  } else if (req.disk_identity) {
    run.identity = *req.disk_identity;
    run.identity.virtual_size = run.size;  // the size read now (IdentityOf sets its own)
  } else {
    run.identity = IdentityOf(env, run.spec, run.src);
  }
  return OkStatus();
}

// Refuses a disk larger than a qcow2 image of `cluster_bytes` clusters can
// hold (qemu caps the L1 table at 32 MiB: 4 Mi entries, each covering an
// L2 table of cluster/8 entries of a cluster: 2 PiB at 64 KiB clusters).
// Checked as soon as the source's size is known, before any extent is
// asked for: an export that large would otherwise be walked for minutes
// first (issue 35).
Status CheckQcow2Holds(uint64_t size_bytes, uint32_t cluster_bytes, const std::string& source) {
  if (cluster_bytes == 0 || (cluster_bytes & (cluster_bytes - 1)) != 0) return OkStatus();  // checked elsewhere
  const auto cluster_bits = static_cast<uint32_t>(std::countr_zero(cluster_bytes));
  const uint64_t l2_covers = formats::qcow2::L2Entries(cluster_bits, false) << cluster_bits;
  const uint64_t max_l1_entries = formats::qcow2::kMaxL1Bytes / 8;
  if (cluster_bits >= 32 || l2_covers > UINT64_MAX / max_l1_entries) return OkStatus();
  const uint64_t limit = max_l1_entries * l2_covers;
  if (size_bytes <= limit) return OkStatus();
  return Error::InvalidArgument("the disk holds " + formats::HumanBytesExact(size_bytes) + "; a qcow2 image of " +
                                formats::HumanBytes(cluster_bytes) + " clusters holds at most " +
                                formats::HumanBytesExact(limit) + " (use larger clusters: --cluster-size)")
      .set_path(source);
}

// 2. Opens the output: the disk's chain folder, made when missing, locked
// and loaded, its leftovers removed.
Status OpenChain(Env& env, const BackupRequest& req, BackupRun& run) {
  std::string disk = req.disk_name.empty() ? DefaultDiskName(run.spec.location) : req.disk_name;
  BARGE_RETURN_IF_ERROR(CheckDiskName(disk));
  ChainWriterOptions options;
  options.job = "backup";
  options.create = true;
  options.parent_dir = req.target_dir;
  options.access = req.access;
  // Leftovers go in FindStaged, once it knows whether a staged image is
  // resumed.
  BARGE_ASSIGN_OR_RETURN(run.writer, ChainWriter::Open(env, JoinPath(req.target_dir, disk), options));
  run.m.disk = disk;
  return OkStatus();
}

// An incremental's parent: the chain's latest point, of this disk, at the
// checkpoint and size the changes were read against, with its digests.
Status ExtendChain(Env& env, const BackupRequest& req, BackupRun& run) {
  const ChainFolder& chain = run.writer->chain();
  if (chain.empty()) {
    return Error::InvalidArgument("no earlier backup in the chain folder: take a full backup first")
        .set_path(chain.dir);
  }
  const formats::BackupManifest& pm = chain.latest().manifest;
  // Another disk's changes on this chain would restore to neither disk.
  BARGE_ASSIGN_OR_RETURN(std::string other_disk, OtherDiskReason(chain, run.identity));
  if (!other_disk.empty() && req.previous_location &&
      (run.identity.kind == "file" || run.identity.kind == "block")) {
    // The chain's disk moved by `barge state migrate`: the point records
    // where it came from, so the chain stays one disk (CheckOneDisk).
    formats::DiskIdentity moved = run.identity;
    moved.moved_from = req.previous_location(run.identity.location);
    if (!moved.moved_from.empty()) {
      BARGE_ASSIGN_OR_RETURN(std::string still_other, OtherDiskReason(chain, moved));
      if (still_other.empty()) {
        run.identity = std::move(moved);
        other_disk.clear();
      }
    }
  }
  if (!other_disk.empty()) {
    return Error::InvalidArgument(other_disk + ": an incremental only extends its own disk's chain; to start a "
                                  "new chain, back this disk up under another --name (or, if it replaced the "
                                  "chain's disk, take a full backup: no --incremental)")
        .set_path(chain.dir);
  }
  if (!req.since_checkpoint.empty() && pm.checkpoint != req.since_checkpoint) {
    return Error::InvalidArgument("the changes read are since checkpoint " + req.since_checkpoint +
                                  ", the chain's latest backup " + pm.id + " ends at " +
                                  (pm.checkpoint.empty() ? "no checkpoint" : "checkpoint " + pm.checkpoint) +
                                  ": take a full backup")
        .set_path(chain.dir);
  }
  if (pm.virtual_size != run.size) {
    return Error::InvalidArgument("the disk's size changed from " + formats::HumanBytesExact(pm.virtual_size) +
                                  " to " + formats::HumanBytesExact(run.size) + " since backup " + pm.id +
                                  ": take a full backup")
        .set_path(RedactNbdUri(run.spec.location));
  }
  run.cluster = pm.cluster_size;  // a chain keeps one cluster size
  auto digests = EffectiveDigests(env, chain, chain.points.size() - 1);
  if (!digests.ok()) {
    return Error(digests.error()).Wrap("the parent chain does not verify; take a full backup");
  }
  run.parent_digests = std::move(digests).value();
  if (req.changed_by != ChangedBy::kRecord) {
    if (pm.strong_digest_table.empty() && req.on_computing_strong) req.on_computing_strong(pm.id);
    auto strong = LoadPointStrongTable(env, chain, chain.points.size() - 1, req.copy);
    if (!strong.ok()) return Error(strong.error()).Wrap("the parent chain does not verify; take a full backup");
    run.parent_strong = std::move(strong).value();
  } else if (!pm.strong_digest_table.empty()) {
    // A chain that detects by digest keeps its table through record
    // incrementals too (only the copied clusters are hashed). A table
    // that does not load is not carried: the next digest incremental
    // computes it from the chain.
    auto strong = LoadPointStrongTable(env, chain, chain.points.size() - 1, req.copy);
    if (strong.ok()) run.parent_strong = std::move(strong).value();
  }
  run.m.parent = formats::ManifestParent{pm.id, pm.image, pm.image_digest};
  // A chain written before chain ids gets one from its first incremental.
  run.m.chain_id = pm.chain_id.empty() ? NewChainId() : pm.chain_id;
  return OkStatus();
}

// A full on a chain whose latest point is of another size is most likely
// another disk backed up under this chain's name.
Status CheckFullSize(const BackupRequest& req, const BackupRun& run) {
  const ChainFolder& chain = run.writer->chain();
  if (chain.empty() || chain.latest().manifest.virtual_size == run.size || req.allow_resize) return OkStatus();
  const formats::BackupManifest& pm = chain.latest().manifest;
  return Error::InvalidArgument("the chain's latest backup " + pm.id + " is of a " +
                                formats::HumanBytesExact(pm.virtual_size) + " disk (" + pm.source + "), this one has " +
                                formats::HumanBytesExact(run.size) +
                                ": another disk? back it up under another --name; if this disk was resized, "
                                "pass --allow-resize")
      .set_path(chain.dir);
}

// --base: locks and opens the base point (another chain's), which takes
// the place of a parent: same size, its cluster size, its digests.
Status OpenBase(Env& env, const BackupRequest& req, BackupRun& run) {
  if (req.base.empty()) return OkStatus();
  if (req.incremental) return Error::InvalidArgument("--base starts a chain: it takes no --incremental");
  std::string chain_name = req.base, at;
  if (auto a = req.base.rfind('@'); a != std::string::npos) {
    chain_name = req.base.substr(0, a);
    at = req.base.substr(a + 1);
  }
  if (chain_name.empty()) return Error::InvalidArgument("--base needs a chain: CHAIN[@POINT]");
  run.base_dir = LexicallyNormal(AbsolutePath(chain_name.find('/') == std::string::npos
                                                  ? JoinPath(req.target_dir, chain_name)
                                                  : chain_name));
  const std::string own = LexicallyNormal(AbsolutePath(run.writer->dir()));
  if (run.base_dir == own) {
    return Error::InvalidArgument("--base names this backup's own chain folder; a base is another chain")
        .set_path(run.base_dir);
  }
  if (auto st = env.Stat(run.base_dir); !st.ok() || !st->is_directory()) {
    return Error::NotFound("no base chain folder here (--base " + req.base + ")").set_path(run.base_dir);
  }
  // Clones backed up side by side each take the base's writer lock for a
  // moment: a few short waits before Busy is the answer (a backup or merge
  // of the base itself running).
  auto lock = ExportLock::Take(env, run.base_dir, &run.base_chain);
  for (int attempt = 0; attempt < 50 && !lock.ok() && lock.error().code() == ErrorCode::kBusy; ++attempt) {
    BARGE_RETURN_IF_ERROR(CheckCancel(req.copy.cancel, "backup interrupted while waiting for its base", run.base_dir));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    lock = ExportLock::Take(env, run.base_dir, &run.base_chain);
  }
  if (!lock.ok()) return Error(lock.error()).Wrap("base chain");
  run.base_lock = std::move(lock).value();
  // A reference a killed run left half written (never renamed): swept.
  IgnoreError(SweepStaleTemporaries(env, JoinPath(run.base_dir, kBaseRefsDir)),
              "the next job on the base chain sweeps it");
  BARGE_ASSIGN_OR_RETURN(size_t index, run.base_chain.Resolve(at));
  auto opened = OpenPoint(env, run.base_chain, index);
  if (!opened.ok()) return Error(opened.error()).Wrap("the base does not verify");
  run.base_point.emplace(std::move(opened).value());
  const formats::BackupManifest& bm = run.base_point->point->manifest;
  if (bm.virtual_size != run.size) {
    return Error::InvalidArgument("the base " + bm.id + " is of a " + formats::HumanBytesExact(bm.virtual_size) +
                                  " disk, this one has " + formats::HumanBytesExact(run.size) +
                                  ": a base must be of the disk's size")
        .set_path(run.base_dir);
  }
  run.cluster = bm.cluster_size;  // the chain reads through the base's clusters
  run.parent_digests = run.base_point->digests;
  formats::ManifestBase base;
  base.chain = RelativeFolderPath(own, run.base_dir);
  base.id = bm.id;
  base.image = bm.image;
  base.image_digest = bm.image_digest;
  base.chain_id = bm.chain_id;
  run.m.base = base;
  return OkStatus();
}

// What to copy (the whole disk, or an incremental's changes rounded to
// clusters), refused when the target has no room for it.
Status PlanWork(Env& env, const BackupRequest& req, BackupRun& run) {
  run.work = {{0, run.size}};
  // A first point over a base keeps the strong table of the whole source
  // its comparison with the base computed (StrongTableOf).
  run.write_strong = run.base_point || req.changed_by != ChangedBy::kRecord || run.parent_strong.has_value();
  if (req.staged_earlier && !req.incremental) {
    // A full's work is the whole disk; the changes only say which staged
    // clusters still hold.
    BARGE_ASSIGN_OR_RETURN(RangeList changed, ChangedSinceStaged(req, run.src));
    run.changed_since_staged = AlignRanges(changed, run.cluster, run.size);
    return OkStatus();
  }
  if (!req.incremental) {
    if (run.base_point) {
      auto diff = DiffFromBase(env, *run.src.image, run.base_chain, run.base_point->index, req.copy);
      if (!diff.ok()) return Error(diff.error()).Wrap("backup");
      run.base_compared_bytes = diff->base_bytes_read;
      run.scan = std::move(diff->changes);
      run.work = run.scan->changed;
    }
    return OkStatus();
  }
  RangeList recorded;
  if (req.changed_by != ChangedBy::kDigests) {
    BARGE_ASSIGN_OR_RETURN(RangeList dirty, DirtySet(env, req, run.src, run.dirty_description));
    recorded = AlignRanges(dirty, run.cluster, run.size);
  }
  if (req.staged_earlier && run.src.nbd != nullptr) {
    // The changes since the staged run's checkpoint, on top of its work
    // (the changes since the parent's checkpoint up to it): the changes
    // since the parent's checkpoint now.
    run.changed_since_staged = recorded;
    run.work = UniteRanges(AlignRanges(req.staged_earlier->work, run.cluster, run.size), recorded);
    return OkStatus();
  }
  if (req.staged_earlier) {
    // A file's bitmaps: `recorded` is what changed since the parent's
    // checkpoint now (which holds the staged run's work), the staged
    // checkpoint's bitmap what changed since it; the work is all three, so
    // that no write is missed whichever bitmap saw it.
    BARGE_ASSIGN_OR_RETURN(RangeList changed, ChangedSinceStaged(req, run.src));
    run.changed_since_staged = AlignRanges(changed, run.cluster, run.size);
    run.work = UniteRanges(UniteRanges(AlignRanges(req.staged_earlier->work, run.cluster, run.size), recorded),
                           run.changed_since_staged);
    return OkStatus();
  }
  if (req.changed_by == ChangedBy::kRecord) {
    run.work = std::move(recorded);
    return OkStatus();
  }
  auto scan = FindChangedClusters(*run.src.image, run.parent_strong->table, req.copy);
  if (!scan.ok()) return Error(scan.error()).Wrap("backup");
  run.scan = std::move(scan).value();
  if (req.changed_by == ChangedBy::kDigests) {
    run.dirty_description = "digests:sha256";
    run.work = run.scan->changed;
    return OkStatus();
  }
  run.missed = SubtractRanges(run.scan->changed, recorded);
  for (const Range& r : run.missed) {
    run.missed_clusters += (r.length + run.cluster - 1) / run.cluster;
    if (req.on_missed) req.on_missed(r);
  }
  run.work = UniteRanges(recorded, run.scan->changed);
  return OkStatus();
}

// A record incremental's check that the disk is still the chain's: a
// sample of the clusters the record calls unchanged must read as the
// latest point has them. Sets run.replaced when any differs.
Status CheckCleanSample(const BackupRequest& req, BackupRun& run) {
  if (!req.incremental || req.changed_by != ChangedBy::kRecord || !req.check_clean) return OkStatus();
  auto sample = SampleCleanClusters(*run.src.image, run.parent_digests, run.work, run.src.kind != SourceKind::kNbd);
  if (!sample.ok()) return Error(sample.error()).Wrap("sampling the clusters the change record calls unchanged");
  run.clean_sample = *sample;
  if (sample->differing > 0) {
    run.replaced =
        ReplacedDiskReason(*sample, run.writer->chain().latest().manifest.id, RedactNbdUri(run.spec.location));
  }
  return OkStatus();
}

// Refuses a target without room for what is left to copy.
Status CheckSpace(Env& env, const BackupRequest& req, BackupRun& run) {
  const std::string& chain_dir = run.writer->dir();
  BARGE_ASSIGN_OR_RETURN(uint64_t needed,
                         EstimateBackupBytes(*run.src.image, run.remaining, run.cluster, req.copy.cancel));
  BARGE_ASSIGN_OR_RETURN(uint64_t free_bytes, FreeBytes(env, chain_dir));
  if (needed > free_bytes) {
    return Error::NoSpace("the target needs up to " + formats::HumanBytesExact(needed) + " for this backup, " +
                          formats::HumanBytesExact(free_bytes) + " are free")
        .set_path(chain_dir);
  }
  return OkStatus();
}

// The manifest's fields known before the copy. A manifest that cannot be
// written (text that is not UTF-8) fails now, not after the copy, naming
// what to change.
Status StartManifest(const BackupRequest& req, const std::string& started_at, BackupRun& run) {
  const ChainFolder& chain = run.writer->chain();
  formats::BackupManifest& m = run.m;
  m.id = IdFor(chain.next_sequence(), started_at);
  m.type = req.incremental ? formats::BackupType::kIncremental : formats::BackupType::kFull;
  m.reason = !req.reason.empty() ? req.reason
             : req.incremental && req.changed_by == ChangedBy::kDigests
                 ? std::string("changed clusters found by SHA-256 digests")
             : req.incremental   ? "changed blocks from " + (run.dirty_description == kExtentsFromAPipe
                                                                   ? std::string("extents read from a pipe")
                                                                   : run.dirty_description)
             : m.base            ? "differences from base " + m.base->chain + "@" + m.base->id
             : chain.empty()     ? "first backup of the disk"
                                 : "full backup requested";
  m.source = RedactNbdUri(run.spec.location);  // never its credentials
  m.source_format = run.src.format_name();
  m.virtual_size = run.size;
  m.cluster_size = run.cluster;
  m.compression = formats::CompressionSpec{req.compression, req.compression_level}.ToString();
  m.image = m.id + ".qcow2";
  m.digest_table = m.id + ".digests";
  m.checkpoint = req.checkpoint;
  m.dirty_source = run.dirty_description;
  if (req.incremental) {
    m.changed_by = req.changed_by == ChangedBy::kDigests           ? "digests"
                   : req.changed_by == ChangedBy::kRecordAndDigests ? "bitmap+digests"
                                                                    : "";
    if (req.changed_by == ChangedBy::kRecordAndDigests) m.missed_clusters = run.missed_clusters;
  }
  m.disk_identity = run.identity;
  if (m.chain_id.empty()) m.chain_id = NewChainId();  // a full starts a chain
  m.dirty_bytes = req.incremental ? TotalBytes(run.work) : 0;
  m.started_at = started_at;
  m.tool_version = req.tool_version;
  struct UserText {
    const std::string& text;
    const char* what;
    const char* remedy;
    const std::string& file;
  };
  const std::string& location = run.spec.location;
  for (const UserText& t : {UserText{m.source, "the source's path", "; link the source under a UTF-8 name", location},
                            UserText{m.disk, "the chain name", "; pass --name", location},
                            UserText{req.dirty_extents_file, "the --dirty-extents path", "", req.dirty_extents_file}}) {
    if (!formats::IsUtf8(t.text)) {
      return Error::InvalidArgument(std::string(t.what) + " is not valid UTF-8, which a manifest (JSON) cannot record" +
                                    t.remedy)
          .set_path(t.file);
    }
  }
  BARGE_RETURN_IF_ERROR(formats::EncodeManifest(m));  // anything else (a --reason, a checkpoint name)
  return OkStatus();
}

// One attempt at the backup `req` asks for: done, or (a record
// incremental whose clean sample differs) stopped before writing anything,
// with `replaced` set.
Result<BackupResult> RunBackupOnce(Env& env, const BackupRequest& req) {
  auto start = std::chrono::steady_clock::now();
  std::string started_at = formats::NowRfc3339();
  BARGE_RETURN_IF_ERROR(CheckChangeInputs(req));
  BackupRun run;
  run.cluster = req.copy.cluster_bytes;
  BARGE_RETURN_IF_ERROR(OpenBackupSource(env, req, run));
  // A full's clusters are the request's (an incremental's are its chain's,
  // whose image of this size exists; --base's are the base's).
  if (!req.incremental && req.base.empty()) {
    BARGE_RETURN_IF_ERROR(CheckQcow2Holds(run.size, run.cluster, run.src.image->name()));
  }
  BARGE_RETURN_IF_ERROR(OpenChain(env, req, run));
  BARGE_RETURN_IF_ERROR(req.incremental ? ExtendChain(env, req, run) : CheckFullSize(req, run));
  std::string other_disk;  // a full is allowed of another disk, with a warning
  if (!req.incremental) {
    BARGE_ASSIGN_OR_RETURN(other_disk, OtherDiskReason(run.writer->chain(), run.identity));
  }
  BARGE_RETURN_IF_ERROR(OpenBase(env, req, run));
  BARGE_RETURN_IF_ERROR(PlanWork(env, req, run));
  BARGE_RETURN_IF_ERROR(CheckCleanSample(req, run));
  if (!run.replaced.empty()) {
    BackupResult stopped;
    stopped.clean_sample = run.clean_sample;
    stopped.replaced = std::move(run.replaced);
    return stopped;
  }
  run.started_at = started_at;
  BARGE_RETURN_IF_ERROR(FindStaged(env, req, run));
  BARGE_RETURN_IF_ERROR(CheckSpace(env, req, run));
  BARGE_RETURN_IF_ERROR(StartManifest(req, run.started_at, run));
  std::unique_ptr<ResumedSink> resumed_sink;  // outlives the destination
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Qcow2Destination> image, MakeImage(env, req, run, resumed_sink));
  std::optional<JournaledDestination> journaled;
  Destination* dest = image.get();
  if (run.journal != nullptr) {
    journaled.emplace(*image, *run.journal, run.over_parent(), CheckpointBytes(TotalBytes(run.remaining)),
                      kCheckpointInterval);
    dest = &*journaled;
  }
  auto copied = CopyWork(req, run, *dest);
  if (!copied.ok()) return KeepOrDrop(env, req, run, journaled ? &*journaled : nullptr, std::move(copied).error());
  Status committed = CommitPoint(env, run, *copied, *dest->qcow2_stats(), start);
  if (run.journal != nullptr) {
    run.journal.reset();
    DiscardResume(env, run.site);  // a journal whose point was committed never matches a later run
  }
  BARGE_RETURN_IF_ERROR(committed);

  const ChainFolder& chain = run.writer->chain();
  BackupResult result;
  result.chain_dir = chain.dir;
  result.image_path = chain.PathOf(run.m.image);
  result.manifest_path = chain.PathOf(run.m.id + ".json");
  result.digests_path = chain.PathOf(run.m.digest_table);
  if (!run.m.strong_digest_table.empty()) result.strong_digests_path = chain.PathOf(run.m.strong_digest_table);
  if (run.scan) result.digest_changed_clusters = run.scan->changed_clusters;
  result.missed = run.missed;
  result.missed_clusters = run.missed_clusters;
  if (run.parent_strong && run.parent_strong->computed) {
    result.strong_computed = true;
    result.strong_computed_bytes = run.parent_strong->bytes_read;
  }
  result.bytes_read = run.m.bytes_read;
  result.image_bytes = run.m.bytes_written;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.resume = run.note;
  result.stale = std::move(run.stale);
  result.base_compared_bytes = run.base_compared_bytes;
  result.clean_sample = run.clean_sample;
  result.other_disk = std::move(other_disk);
  result.manifest = std::move(run.m);
  return result;
}

}  // namespace

Result<BackupResult> RunBackup(Env& env, const BackupRequest& req) {
  BARGE_ASSIGN_OR_RETURN(BackupResult first, RunBackupOnce(env, req));
  if (first.replaced.empty()) return first;
  // The disk is not the chain's: a full of it, which starts a new chain in
  // the folder (the chain lock was let go in between).
  BackupRequest full = req;
  full.incremental = false;
  full.dirty_bitmap.clear();
  full.dirty_extents_file.clear();
  full.dirty_ranges.reset();
  full.dirty_description.clear();
  full.since_checkpoint.clear();
  full.on_missed = nullptr;
  full.reason = first.replaced;
  if (full.staged_earlier) {
    full.staged_earlier.reset();
    full.resume_refused = "the disk was replaced under its path";
  }
  BARGE_ASSIGN_OR_RETURN(BackupResult result, RunBackupOnce(env, full));
  result.clean_sample = first.clean_sample;
  result.replaced = std::move(first.replaced);
  result.stale.insert(result.stale.begin(), first.stale.begin(), first.stale.end());
  return result;
}

}  // namespace barge::pipeline
