// FaultEnv: an Env wrapper for crash-safety tests (issue 13). It fails
// chosen calls with errno errors, and it simulates power loss: it keeps
// what a real machine would not yet have on disk and drops it on demand,
// after leveldb's FaultInjectionTestEnv, extended to random-access writes.
#pragma once

#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "blockio/env.h"

namespace barge {

// Wraps `target` (normally PosixEnv() over a test's temporary folder).
//
// ---- Errors ----
// Every call is counted by kind (EnvOp, env.h: CreateSymlink counts as
// kLink; StatNoFollow, ReadLink, RealPath and Space as kStat; a source's
// Extents as kRead). Sinks and sources it opens are wrapped: WriteAt, WriteZeroes,
// Trim and Truncate count as kWrite, Flush as kSync, ReadAt, each request
// of ReadMany and Extents as kRead (WillNeed is a hint: never counted nor
// failed). A failed call has no effect and returns
// Error::FromErrno(errno, "injected <kind>", path), with the offset and
// length for data calls. Counters include failed calls.
//
// ---- Power loss: what is tracked ----
// File data, per file (by device and inode, so renames and links keep the
// history), regular files opened through OpenSink only:
//   - its synced size: its size when it was last made durable (or when
//     first written here, for a file that was clean);
//   - an undo log: the old contents of every byte below the synced size
//     that a write, zeroing, trim or truncate changed since then, saved
//     before the change (once per byte; bounded by the overwritten ranges,
//     kept in memory). OpenSink(kTruncate) of an existing file saves all of
//     it. Bytes beyond the synced size need no saving: truncation drops them.
//   - Flush on a sink opened with FileOptions::sync makes the file durable:
//     the undo log is cleared and the synced size becomes the size. A Flush
//     with !sync (no fdatasync) makes nothing durable.
// Names, per folder entry (by the folder's device and inode):
//   - creates (OpenSink, CreateDir, CreateSymlink, LockFile with
//     `create`), renames (the entry left and the entry taken, with any file
//     or empty folder it replaced), links and unlinks (Unlink, RemoveDir)
//     are durable only once their folder is synced (SyncDir) after them.
//     A rename across folders is two changes, each durable with its own
//     folder.
//   - To be able to bring back a file that an unlink or a replacing rename
//     removed, the FaultEnv keeps a hard link to it in the stash folder
//     (hence the stash must be on the same filesystem). Files with unsynced
//     data, files open for writing and files that a pending change may bring
//     back are pinned this way; a pin goes when nothing needs it any more,
//     so files removed for good are deleted for good at the folder's sync.
//     A removed file whose data is still unsynced stays pinned until the
//     next SimulatePowerLoss or MarkDurable.
//   - SetOwner and SetMode are not tracked (they stay), nor are times.
// Files that existed before, or that are written outside this Env, count as
// durable as they are.
//
// ---- Power loss: what a crash drops (SimulatePowerLoss) ----
//   1. File data: saved ranges are written back and each file is truncated
//      to its synced size (a saved range of zeros is punched as a hole).
//   2. Names: pending changes are undone, newest first: a created file or
//      folder is removed (a folder with all it holds), a removed or
//      replaced file is linked back from the stash, a removed empty folder
//      is created again (mode 0755), a renamed folder moves back.
//   3. The stash is emptied, every file counts as durable again, and the Env
//      is alive again (no crash point). Counters and error rules are kept.
// It needs every sink, source and lock from before to be closed, and no
// other call running.
//
// The model is deliberately strict about what is durable (only what POSIX
// promises), so that code passing under it does not lean on one
// filesystem's generosity:
//   - Real filesystems usually keep more: ext4 (data=ordered) commits a
//     rename that replaces a file after flushing the new file's data
//     (auto_da_alloc), and its fsync of a new file also commits the file's
//     entry in its folder; XFS and btrfs have similar heuristics. Here
//     neither helps: only Flush and SyncDir make anything durable.
//   - A journaling filesystem commits a rename as one transaction; here the
//     two folders of a cross-folder rename are durable separately, so a
//     file may come back under both names (the source folder unsynced) or
//     neither (the target folder unsynced). Exception: a folder cannot have
//     two names, so a renamed folder whose new entry is durable stays there.
//   - Known gaps (where real power loss can be worse than this model):
//     unsynced writes are dropped all together, never in part, so torn
//     writes (part of a write, or some unsynced writes but not others,
//     kept) are not simulated; nor are lost or reordered writes after a
//     successful Flush (lying disks), nor bad sectors. Allocation is not
//     restored exactly (a saved range goes back as data, or as a hole when
//     all zeros), and metadata (mode, owner, times) is not rolled back.
//   - Side effects of the bookkeeping: pinned files have one more hard
//     link, and removed files keep their space until their removal is
//     durable (Space() reports less free space than a real run would).
//
// ---- Crash points ----
// Durability boundaries are the calls counted as kSync (every sink Flush,
// with or without FileOptions::sync), kSyncDir, kRename, kLink (Link and
// CreateSymlink) and kUnlink (Unlink and RemoveDir; UnlinkIfExists and
// RemoveTree are made of them), failed ones included. CrashAfter(n): the n-th
// boundary call reaches the disk, then the machine dies before it returns:
// it returns Error kIoError "simulated power loss", and so does every later
// call of any kind (from any thread, sinks and sources included) without
// touching the disk, so the command's cleanup (unlinks of temporaries in
// destructors) has no effect. CrashAfter(0) dies at the first boundary,
// before it has any effect. Locks (LockFile, LockImage) pass through; the
// kernel drops them anyway when the command's objects are destroyed.
//
// Thread safety: every method may be called from any thread, and the
// sinks and sources it returns are as thread-safe as their targets (the
// BlockSink contract: writes to disjoint ranges concurrently; Flush and
// Truncate alone). SimulatePowerLoss, MarkDurable and the destructor need
// no other call running. The FaultEnv must outlive everything it returned.
class FaultEnv final : public EnvWrapper {
 public:
  // `stash_dir`: a folder of the FaultEnv's own, on the filesystem of the
  // files under test and outside the tree under test; created when missing.
  // Whatever is in it is removed.
  FaultEnv(Env& target, std::string stash_dir);
  ~FaultEnv() override;

  // ---- errors ----
  // Fails the n-th call of `op` (1-based, counted from construction or the
  // last ResetCounters) with `err` (EIO, ENOSPC, EDQUOT, EROFS...), and with
  // `and_after` every later one too. Rules add up.
  void FailCall(EnvOp op, uint64_t n, int err = EIO, bool and_after = false);
  // Fails every call of `op`.
  void FailAll(EnvOp op, int err = EIO) { FailCall(op, 1, err, true); }
  // Removes the rules, and forgets the injections below.
  void ClearFaults();
  // The calls a rule failed, in order: kind, its count, the errno and the
  // path the call named (a test can tell which file an error hit, e.g. a
  // failed removal that had to leave its file behind).
  struct Injection {
    EnvOp op;
    uint64_t n;
    int err;
    std::string path;
  };
  std::vector<Injection> injections() const;
  // Calls of `op` made while the Env was alive (the dying one included).
  uint64_t calls(EnvOp op) const;
  // Durability boundaries met so far (see above), counted the same way.
  uint64_t boundaries() const;
  // Zeroes the call and boundary counters.
  void ResetCounters();

  // ---- power loss ----
  // Dies after the n-th boundary, counted from now on (see above).
  void CrashAfter(uint64_t n);
  // No crash point (an Env that died stays dead until SimulatePowerLoss).
  void CancelCrash();
  // True once the Env has died.
  bool crashed() const;
  // Drops everything not durable, as described above. Returns the first
  // error of the target while restoring (the tree is then undefined).
  Status SimulatePowerLoss();
  // Treats everything on disk now as durable: forgets tracked data and
  // name changes and empties the stash (after a test's setup). Needs no
  // sink open.
  void MarkDurable();
  // Name changes not yet durable, and files with unsynced data (for tests
  // of the model itself).
  size_t pending_name_changes() const;
  size_t unsynced_files() const;

  // ---- Env ----
  // (The defaults repeat Env's, so that calls on a FaultEnv& may omit them.)
  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path,
                                                  const FileOptions& options = {}) override;
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options = {}) override;
  Result<FileStat> Stat(const std::string& path) override;
  Result<FileStat> StatNoFollow(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& dir) override;
  Status CreateDir(const std::string& dir, uint32_t mode = 0755) override;
  Result<std::string> CreateTempDir(const std::string& parent, std::string_view prefix) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Link(const std::string& from, const std::string& to) override;
  Status CreateSymlink(const std::string& link_target, const std::string& path) override;
  Result<std::string> ReadLink(const std::string& path) override;
  Status Unlink(const std::string& path) override;
  Status RemoveDir(const std::string& dir) override;
  Status SyncDir(const std::string& dir) override;
  Result<SpaceInfo> Space(const std::string& path) override;
  Status SetOwner(const std::string& path, uint32_t uid, uint32_t gid) override;
  Status SetMode(const std::string& path, uint32_t mode) override;
  Result<std::string> RealPath(const std::string& path) override;
  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path,
                                            const LockOptions& options = {}) override;
  Result<std::unique_ptr<EnvLock>> LockImage(const std::string& path,
                                             ImageAccess access) override;

 private:
  class Impl;  // fault_env.cc
  std::unique_ptr<Impl> impl_;
};

// One run of ForEachCrashPoint's `op`, told to its `check`.
struct CrashPoint {
  // The Env died after this many boundaries took effect; or, when
  // !crashed, the power went after `op` returned.
  uint64_t after_boundaries = 0;
  bool crashed = false;
  // Boundaries of the clean run (the first).
  uint64_t boundaries = 0;
  // What `op` returned.
  Status op_status;
};

// The crash campaign for one operation. First a clean run: setup(), then
// op(env) with `env` installed as Env::Default() (ScopedDefaultEnv), then
// SimulatePowerLoss() and check(): this counts the boundaries N and checks
// a power loss after the operation finished. Then, for every i in 0..N,
// setup(), op with CrashAfter(i), SimulatePowerLoss() and check(). Each run
// starts from setup()'s tree, which counts as durable (MarkDurable), with
// the counters reset. `check` runs with the previous default Env back
// (normally PosixEnv): it plays the recovery step and judges the tree.
// Returns: the number of runs (N + 2); the error of setup() or of
// SimulatePowerLoss() when one fails (then no further run is made).
Result<uint64_t> ForEachCrashPoint(FaultEnv& env, const std::function<Status()>& setup,
                                   const std::function<Status(Env&)>& op,
                                   const std::function<void(const CrashPoint&)>& check);

}  // namespace barge
