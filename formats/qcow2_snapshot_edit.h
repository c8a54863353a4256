// Offline qcow2 internal snapshots: create, delete, rename and roll back
// (qemu's qcow2_snapshot_goto) by editing an image no process has open.
// Each call is one transaction that commits with a single header write;
// the write order and the crash states are in docs/formats/qcow2.md §5.3.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "blockio/error.h"
#include "blockio/sink.h"
#include "blockio/source.h"
#include "formats/image.h"

namespace barge::formats {

// What an edit is about to do, handed to SnapshotEditOptions::before_write
// once everything is read and planned and before the first write.
struct SnapshotEditPlan {
  uint64_t file_bytes = 0;       // size of the file now
  uint64_t new_file_bytes = 0;   // at least this after the edit (it grows past its end)
  uint64_t write_bytes = 0;      // bytes the edit writes
  uint64_t freed_clusters = 0;   // clusters whose refcount drops to 0
  uint64_t copied_l2_tables = 0; // active L2 tables given a new copy (COPIED flags)
  uint64_t freed_bytes = 0;      // bytes of those clusters (discarded after the commit)
};

struct SnapshotEditOptions {
  // Called with the plan before the first write; an error aborts the edit
  // with nothing written (orchestrate checks free space here).
  std::function<Status(const SnapshotEditPlan&)> before_write;
  // Keeps L2 tables read during the edit in memory up to this many bytes;
  // past it they are read again when needed.
  uint64_t l2_cache_bytes = 256ull << 20;
  // After the commit, discard (punch holes in) the data clusters that
  // deleted snapshots or a rollback freed, as qemu does
  // (pass-discard-snapshot), so the file gives the space back. Freed
  // metadata (L1/L2 tables, refcount blocks) is kept: the next edit's new
  // metadata goes there. Skipped on sinks that cannot trim.
  bool discard_freed = true;
};

struct SnapshotCreateSpec {
  std::string name;  // at most 255 bytes, no NUL; may be empty (qemu allows it)
  // Refuse a name another snapshot has (qemu allows duplicates, which then
  // can only be named by id). Default: refuse.
  bool allow_duplicate_name = false;
  // Creation time; 0/0 = now.
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;
};

struct SnapshotRollbackResult {
  SnapshotInfo target;                 // as it is after the rollback
  std::vector<SnapshotInfo> discarded; // newer snapshots deleted (discard_newer)
};

// All calls below read and check everything first and write nothing until
// the plan is complete: `file` reads the image and `sink` writes the same
// file in place (`file` must show its contents before the call). The
// current header's structures are never written: new L1/L2 copies, refcount
// blocks, refcount table and snapshot table go to clusters free in the old
// refcounts (first fit, the file grows past its end when needed), then one
// write of header bytes 36..72 (and the autoclear word when unknown bits
// must be cleared) switches the image. Structures the edit leaves unused
// are free in the new refcounts, so nothing leaks. Active L2 tables whose
// COPIED flags must change get new copies (qemu flips them in place, which
// a crash between the refcount and the L2 write leaves as an OFLAG_COPIED
// error in qemu-img check); tables only a snapshot uses are fixed in place.
//
// Crash safety: every prefix of the writes, and the state after a power
// loss at any point, is the old image or the new one, each clean for
// qemu-img check; the snapshot list is the old or the new one.
//
// Refused, before anything is written, as qemu refuses them:
//   kNotSupported  not qcow2; an external data file (qemu: "Operation not
//                  supported"); refcounts that cannot hold the sharing
//                  (1-bit refcounts, qemu fails with EINVAL); a dirty
//                  (lazy refcounts) image; a rollback while the image has
//                  persistent bitmaps (qemu: "Device has active dirty
//                  bitmaps") or to a snapshot of another disk size; more
//                  than 65536 snapshots or a 64 MiB table; a refcount table
//                  past 8 MiB; new clusters on a sink that cannot grow;
//   kNotFound      no snapshot with that id or name;
//   kInvalidArgument a bad or (without allow_duplicate_name) taken name, a
//                  name several snapshots share (use the id);
//   kCorruption    the image is marked corrupt, or its header, tables or
//                  refcounts are malformed (a referenced cluster with
//                  refcount 0, a count below its references, offsets
//                  outside the file);
//   kIoError/kNoSpace from the file (the image is then the old or the new
//                  one, as above; an error while discarding freed clusters
//                  comes after the commit and says so);
//   the error before_write returned.
// May block. One caller at a time per image; the caller must make sure no
// other process has the image open (orchestrate takes QEMU's image lock).

// Creates a snapshot of the active image; its id is qemu's next id.
// Returns it as listed afterwards.
Result<SnapshotInfo> CreateSnapshot(BlockSource& file, BlockSink& sink, const SnapshotCreateSpec& spec,
                                    const SnapshotEditOptions& options = {});

// Deletes the snapshot `id_or_name` (id first, then a unique name) and
// frees the clusters only it used. Returns the deleted snapshot.
Result<SnapshotInfo> DeleteSnapshot(BlockSource& file, BlockSink& sink, const std::string& id_or_name,
                                    const SnapshotEditOptions& options = {});

// Renames `id_or_name` to `new_name` (the id stays). Returns the renamed
// snapshot. A rename to the same name writes nothing.
Result<SnapshotInfo> RenameSnapshot(BlockSource& file, BlockSink& sink, const std::string& id_or_name,
                                    const std::string& new_name, bool allow_duplicate_name = false,
                                    const SnapshotEditOptions& options = {});

// Makes the active image the snapshot's contents (qemu-img snapshot -a):
// the active L1 becomes a copy of the snapshot's, the refcounts of what it
// reaches go up and those of what the old active image reached go down. The
// snapshot and every other snapshot stay, unless `discard_newer`: then the
// snapshots after it in the table (qemu appends, so: created later) are
// deleted in the same transaction and returned.
Result<SnapshotRollbackResult> RollbackSnapshot(BlockSource& file, BlockSink& sink,
                                                const std::string& id_or_name, bool discard_newer,
                                                const SnapshotEditOptions& options = {});

// An upper bound of the bytes CreateSnapshot writes (new clusters, which may
// fill holes or grow the file), from the header, the active L1 table and the
// refcount table only: cheap enough for a free-space check before anything
// else runs. kNotSupported when not qcow2, kCorruption for bad tables.
Result<uint64_t> EstimateSnapshotCreateBytes(BlockSource& file);

// The snapshot list (table order). kCorruption for a malformed table,
// kNotSupported when `file` is not qcow2.
Result<std::vector<SnapshotInfo>> ListSnapshots(BlockSource& file);

}  // namespace barge::formats
