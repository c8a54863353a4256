// Full and incremental backups into a chain folder.
#include "pipeline/backup.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <set>

#include "blockio/env.h"
#include "blockio/path.h"
#include "formats/digest_table.h"
#include "formats/extents_file.h"
#include "formats/json_fields.h"
#include "formats/qcow2_bitmap.h"
#include "formats/units.h"
#include "pipeline/chain.h"
#include "pipeline/destination_spec.h"
#include "pipeline/disk_identity.h"
#include "pipeline/staged_file.h"
#include "pipeline/verification_record.h"

namespace barge::pipeline {

namespace {

Status CheckDiskName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name[0] == '.') {
    return Error::InvalidArgument("disk name '" + name +
                                  "' must be a plain, non-hidden folder name (use --name)");
  }
  return OkStatus();
}

// Removes images, digest tables and verification records that no manifest
// names (what a run killed between renames leaves, and the records of
// points a merge folded), and temporaries no live writer holds. Called
// with the chain lock held.
Status RemoveOrphans(Env& env, const ChainFolder& chain) {
  std::set<std::string> named;
  for (const auto& p : chain.points) {
    named.insert(p.manifest.image);
    named.insert(p.manifest.digest_table);
    named.insert(VerificationFileName(p.manifest.id));
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(chain.dir));
  for (const std::string& name : names) {
    std::string ext = Extension(name);
    bool ours = !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])) &&
                (ext == ".qcow2" || ext == ".digests" || ext == ".verified");
    if (ours && !named.count(name)) BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(chain.PathOf(name)));
  }
  auto swept = SweepStaleTemporaries(env, chain.dir);
  if (!swept.ok()) return swept.error();
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

std::string IdFor(uint32_t sequence, const std::string& started_at) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04u", sequence);
  return std::string(buf) + "-" + formats::CompactTimestamp(started_at);
}

// Writes and flushes a small output file (digest table, manifest) under its
// temporary name; `out` commits it later.
Status WriteSmallStaged(Env& env, const std::string& dir, const std::string& file_name,
                        std::span<const std::byte> bytes, std::unique_ptr<StagedFile>& out) {
  auto created = StagedFile::Create(env, dir + "/" + file_name);
  if (!created.ok()) return std::move(created).error().Wrap("backup: writing " + file_name);
  out = std::move(created).value();
  Status st = out->sink().WriteAt(0, bytes);
  if (st.ok()) st = out->sink().Flush();
  if (!st.ok()) return std::move(st).error().Wrap("backup: writing " + file_name);
  return OkStatus();
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

Result<BackupResult> RunBackup(Env& env, const BackupRequest& req) {
  auto start = std::chrono::steady_clock::now();
  std::string started_at = formats::NowRfc3339();
  int dirty_inputs = !req.dirty_bitmap.empty() + !req.dirty_extents_file.empty() +
                     req.dirty_ranges.has_value();
  if (req.incremental && dirty_inputs != 1) {
    return Error::InvalidArgument("an incremental backup needs exactly one of --dirty-bitmap or --dirty-extents");
  }
  if (!req.incremental && dirty_inputs != 0) {
    return Error::InvalidArgument("--dirty-bitmap/--dirty-extents need --incremental");
  }

  SourceSpec spec = req.source;
  if (req.incremental && !req.dirty_bitmap.empty() && IsNbdUri(spec.location)) {
    spec.nbd_dirty_context = req.dirty_bitmap.starts_with("qemu:")
                                 ? req.dirty_bitmap
                                 : "qemu:dirty-bitmap:" + req.dirty_bitmap;
  }
  BARGE_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(env, spec));
  const uint64_t size = src.image->size_bytes();
  formats::DiskIdentity identity;
  if (req.disk_identity) {
    identity = *req.disk_identity;
    identity.virtual_size = size;  // the size read now (IdentityOf sets its own)
  } else {
    identity = IdentityOf(env, spec, src);
  }

  std::string disk = req.disk_name.empty() ? DefaultDiskName(spec.location) : req.disk_name;
  BARGE_RETURN_IF_ERROR(CheckDiskName(disk));
  std::string chain_dir = JoinPath(req.target_dir, disk);
  // The folders this run creates (target, then chain folder): a first
  // backup that fails removes them again.
  std::vector<std::string> created_dirs;
  for (const std::string& d : {req.target_dir, chain_dir}) {
    if (d.empty()) continue;
    auto st = env.Stat(d);
    if (!st.ok() && st.error().code() == ErrorCode::kNotFound) created_dirs.push_back(d);
  }
  std::optional<ChainLock> lock;
  for (int attempt = 0; !lock; ++attempt) {
    BARGE_RETURN_IF_ERROR(env.CreateDirs(chain_dir));
    auto acquired = ChainLock::Acquire(env, chain_dir);
    // A failed first backup of the same chain may have removed the folder
    // between our mkdir and our lock: make it again.
    if (!acquired.ok() && acquired.error().code() == ErrorCode::kNotFound && attempt < 3) continue;
    if (!acquired.ok()) return acquired.error();
    lock.emplace(std::move(acquired).value());
  }
  BARGE_ASSIGN_OR_RETURN(ChainFolder chain, LoadChainFolder(env, chain_dir, &*lock));
  BARGE_RETURN_IF_ERROR(RemoveOrphans(env, chain));
  // A first backup that fails leaves no lock file and no empty folder
  // behind. Declared before the staged files: it runs after they removed
  // their temporaries, and while the lock is still held.
  struct FirstBackupCleanup {
    Env& env;
    ChainLock* lock = nullptr;  // null: disarmed
    std::vector<std::string> created;
    ~FirstBackupCleanup() {
      if (lock == nullptr) return;
      IgnoreError(lock->RemoveLockFile(), "a failed backup's error is on its way; a stale .lock is harmless");
      // Deepest first; RemoveDir fails on a folder someone else filled.
      for (auto it = created.rbegin(); it != created.rend(); ++it) {
        IgnoreError(env.RemoveDir(*it), "a folder another job filled meanwhile stays");
      }
    }
  } first_cleanup{env, chain.empty() ? &*lock : nullptr, created_dirs};

  uint32_t cluster = req.copy.cluster_bytes;
  formats::BackupManifest m;
  formats::DigestTable parent_digests;
  if (req.incremental) {
    if (chain.empty()) {
      return Error::InvalidArgument("no earlier backup in the chain folder: take a full backup first")
          .set_path(chain_dir);
    }
    const formats::BackupManifest& pm = chain.latest().manifest;
    // Another disk's changes on this chain would restore to neither disk.
    BARGE_ASSIGN_OR_RETURN(std::string other_disk, OtherDiskReason(chain, identity));
    if (!other_disk.empty() && req.previous_location && (identity.kind == "file" || identity.kind == "block")) {
      // The chain's disk moved by `barge state migrate`: the point records
      // where it came from, so the chain stays one disk (CheckOneDisk).
      formats::DiskIdentity moved = identity;
      moved.moved_from = req.previous_location(identity.location);
      if (!moved.moved_from.empty()) {
        BARGE_ASSIGN_OR_RETURN(std::string still_other, OtherDiskReason(chain, moved));
        if (still_other.empty()) {
          identity = std::move(moved);
          other_disk.clear();
        }
      }
    }
    if (!other_disk.empty()) {
      return Error::InvalidArgument(other_disk + ": an incremental only extends its own disk's chain; to start a "
                                    "new chain, back this disk up under another --name (or, if it replaced the "
                                    "chain's disk, take a full backup: no --incremental)")
          .set_path(chain_dir);
    }
    if (!req.since_checkpoint.empty() && pm.checkpoint != req.since_checkpoint) {
      return Error::InvalidArgument("the changes read are since checkpoint " + req.since_checkpoint +
                                    ", the chain's latest backup " + pm.id + " ends at " +
                                    (pm.checkpoint.empty() ? "no checkpoint" : "checkpoint " + pm.checkpoint) +
                                    ": take a full backup")
          .set_path(chain_dir);
    }
    if (pm.virtual_size != size) {
      return Error::InvalidArgument("the disk's size changed from " + formats::HumanBytesExact(pm.virtual_size) +
                                    " to " + formats::HumanBytesExact(size) + " since backup " + pm.id +
                                    ": take a full backup")
          .set_path(spec.location);
    }
    cluster = pm.cluster_size;  // a chain keeps one cluster size
    auto digests = EffectiveDigests(env, chain, chain.points.size() - 1);
    if (!digests.ok()) {
      return Error(digests.error()).Wrap("the parent chain does not verify; take a full backup");
    }
    parent_digests = std::move(digests).value();
    m.parent = formats::ManifestParent{pm.id, pm.image, pm.image_digest};
    // A chain written before chain ids gets one from its first incremental.
    m.chain_id = pm.chain_id.empty() ? NewChainId() : pm.chain_id;
  } else if (!chain.empty() && chain.latest().manifest.virtual_size != size && !req.allow_resize) {
    // Most likely another disk backed up under this chain's name.
    const formats::BackupManifest& pm = chain.latest().manifest;
    return Error::InvalidArgument("the chain's latest backup " + pm.id + " is of a " +
                                  formats::HumanBytesExact(pm.virtual_size) + " disk (" + pm.source + "), this one has " +
                                  formats::HumanBytesExact(size) +
                                  ": another disk? back it up under another --name; if this disk was resized, "
                                  "pass --allow-resize")
        .set_path(chain_dir);
  }

  std::string dirty_description;
  RangeList work{{0, size}};
  if (req.incremental) {
    BARGE_ASSIGN_OR_RETURN(RangeList dirty, DirtySet(env, req, src, dirty_description));
    work = AlignRanges(dirty, cluster, size);
  }

  BARGE_ASSIGN_OR_RETURN(uint64_t needed, EstimateBackupBytes(*src.image, work, cluster, req.copy.cancel));
  BARGE_ASSIGN_OR_RETURN(uint64_t free_bytes, FreeBytes(env, chain_dir));
  if (needed > free_bytes) {
    return Error::NoSpace("the target needs up to " + formats::HumanBytesExact(needed) + " for this backup, " +
                          formats::HumanBytesExact(free_bytes) + " are free")
        .set_path(chain_dir);
  }

  m.id = IdFor(chain.next_sequence(), started_at);
  m.disk = disk;
  m.type = req.incremental ? formats::BackupType::kIncremental : formats::BackupType::kFull;
  m.reason = !req.reason.empty() ? req.reason
             : req.incremental   ? "changed blocks from " + (dirty_description == kExtentsFromAPipe
                                                                   ? std::string("extents read from a pipe")
                                                                   : dirty_description)
             : chain.empty()     ? "first backup of the disk"
                                 : "full backup requested";
  m.source = spec.location;
  m.source_format = src.format_name();
  m.virtual_size = size;
  m.cluster_size = cluster;
  m.compression = formats::CompressionSpec{req.compression, req.compression_level}.ToString();
  m.image = m.id + ".qcow2";
  m.digest_table = m.id + ".digests";
  m.checkpoint = req.checkpoint;
  m.dirty_source = dirty_description;
  m.disk_identity = identity;
  if (m.chain_id.empty()) m.chain_id = NewChainId();  // a full starts a chain
  m.dirty_bytes = req.incremental ? TotalBytes(work) : 0;
  m.started_at = started_at;
  m.tool_version = req.tool_version;
  // A manifest that cannot be written (text that is not UTF-8) fails now,
  // not after the copy, naming what to change.
  struct UserText {
    const std::string& text;
    const char* what;
    const char* remedy;
    const std::string& file;
  };
  for (const UserText& t : {UserText{m.source, "the source's path", "; link the source under a UTF-8 name", spec.location},
                            UserText{m.disk, "the chain name", "; pass --name", spec.location},
                            UserText{req.dirty_extents_file, "the --dirty-extents path", "", req.dirty_extents_file}}) {
    if (!formats::IsUtf8(t.text)) {
      return Error::InvalidArgument(std::string(t.what) + " is not valid UTF-8, which a manifest (JSON) cannot record" +
                                    t.remedy)
          .set_path(t.file);
    }
  }
  BARGE_RETURN_IF_ERROR(formats::EncodeManifest(m));  // anything else (a --reason, a checkpoint name)

  // The image.
  auto created_image = StagedFile::Create(env, chain.PathOf(m.image));
  if (!created_image.ok()) return std::move(created_image).error().Wrap("backup: starting " + m.image);
  std::unique_ptr<StagedFile> image_file = std::move(created_image).value();
  BlockSink& image_sink = image_file->sink();
  DestinationSpec dest_spec;
  dest_spec.virtual_size = size;
  dest_spec.cluster_bytes = cluster;
  dest_spec.compression = req.compression;
  // An incremental names its parent and stores the zero clusters of its
  // work set (they must mask the parent's data).
  if (m.parent) dest_spec.backing_file = m.parent->image;
  dest_spec.zero_policy = req.incremental ? ZeroPolicy::kZeroCluster : ZeroPolicy::kOmit;
  auto created = MakeDestination(image_sink, dest_spec);
  if (!created.ok()) return Error(created.error()).Wrap("backup: starting " + m.image);
  std::unique_ptr<Destination> dest = std::move(created).value();
  CopyOptions copy = req.copy;
  copy.cluster_bytes = cluster;
  copy.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, cluster);
  copy.compression = req.compression;
  copy.compression_level = req.compression_level;
  copy.record_zero_digests = req.incremental;
  if (req.incremental) {
    copy.base_digest = [&parent_digests](uint64_t c) { return FindDigest(parent_digests, c); };
  }
  Destination* dests[] = {dest.get()};
  auto copied = RunCopy(*src.image, work, dests, copy);
  if (!copied.ok()) return Error(copied.error()).Wrap("backup");
  const formats::Qcow2WriterStats stats = *dest->qcow2_stats();

  formats::DigestTable table;
  table.cluster_bytes = cluster;
  table.virtual_size = size;
  table.entries.reserve(copied->cluster_digests.size());
  for (const ClusterDigest& d : copied->cluster_digests) {
    table.entries.push_back({d.cluster_index, d.digest});
  }
  m.image_digest = copied->image_digest;
  m.bytes_read = copied->bytes_read;
  m.bytes_written = stats.file_bytes;
  m.data_clusters = stats.data_clusters + stats.compressed_clusters;
  m.compressed_clusters = stats.compressed_clusters;
  m.zero_clusters = stats.zero_clusters;
  m.finished_at = formats::NowRfc3339();
  // Exact to the microsecond (the times above are whole seconds).
  m.duration_seconds =
      std::round(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * 1e6) / 1e6;

  // Image, digests, manifest last: a manifest only ever names complete files.
  std::unique_ptr<StagedFile> digests_file, manifest_file;
  std::vector<std::byte> table_bytes = formats::EncodeDigestTable(table);
  BARGE_RETURN_IF_ERROR(WriteSmallStaged(env, chain.dir, m.digest_table, table_bytes, digests_file));
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::EncodeManifest(m));
  BARGE_RETURN_IF_ERROR(WriteSmallStaged(env, chain.dir, m.id + ".json",
                                         std::as_bytes(std::span(text.data(), text.size())),
                                         manifest_file));
  Status committed = image_file->Commit();
  if (committed.ok()) committed = digests_file->Commit();
  if (committed.ok()) committed = manifest_file->Commit();
  if (!committed.ok()) {
    // A commit can fail after its rename (syncing the folder): the manifest
    // goes first so that no manifest ever names a removed file.
    Error e = Error(committed.error()).Wrap("backup");
    for (const std::string& name : {m.id + ".json", m.image, m.digest_table}) {
      e.Also(env.UnlinkIfExists(chain.PathOf(name)));
    }
    return e;
  }

  BackupResult result;
  result.chain_dir = chain_dir;
  result.image_path = chain.PathOf(m.image);
  result.manifest_path = chain.PathOf(m.id + ".json");
  result.digests_path = chain.PathOf(m.digest_table);
  result.bytes_read = m.bytes_read;
  result.image_bytes = m.bytes_written;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.manifest = std::move(m);
  first_cleanup.lock = nullptr;  // the chain has its first point
  return result;
}

}  // namespace barge::pipeline
