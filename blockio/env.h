// The filesystem seam: every filesystem operation barge makes besides the
// block data of sources and sinks goes through an Env (leveldb's Env and
// rocksdb's FileSystem are the model). PosixEnv is the default; tests
// install wrappers (blockio/fault_env.h) that fail calls or simulate power
// loss. Only the Env's implementation touches the filesystem directly; the
// build checks it (cmake/CheckEnv.cmake).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "blockio/file_options.h"
#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

struct FileStat {
  enum class Type : uint8_t { kRegular, kDirectory, kBlockDevice, kSymlink, kOther };
  Type type = Type::kOther;
  uint64_t size_bytes = 0;     // regular files; block devices report 0
  int64_t mtime_ns = 0;        // nanoseconds since the epoch
  uint32_t mode = 0;           // permission bits
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t device = 0;         // st_dev: with inode, identifies the file
  uint64_t inode = 0;
  uint64_t allocated_bytes = 0;  // st_blocks * 512
  bool is_regular() const { return type == Type::kRegular; }
  bool is_directory() const { return type == Type::kDirectory; }
  bool is_block_device() const { return type == Type::kBlockDevice; }
  bool is_symlink() const { return type == Type::kSymlink; }  // StatNoFollow only
};

struct SpaceInfo {
  uint64_t free_bytes = 0;   // available to an unprivileged writer (f_bavail)
  uint64_t total_bytes = 0;
  uint64_t filesystem_type = 0;  // statfs(2)'s f_type magic (0xEF53 ext4...), 0 if unknown
  bool read_only = false;        // mounted read-only (statvfs's ST_RDONLY)
};

// A lock held for the object's lifetime; the destructor releases it. The
// kernel releases every lock of a process that dies (kill -9 included), so
// a lock is never stale.
class EnvLock {
 public:
  EnvLock() = default;
  virtual ~EnvLock() = default;
  EnvLock(const EnvLock&) = delete;
  EnvLock& operator=(const EnvLock&) = delete;
  virtual const std::string& path() const = 0;
};

struct LockOptions {
  // Create the lock file (and nothing else) when it is missing. Without it,
  // a missing file is kNotFound.
  bool create = true;
  // Block until the lock is free; otherwise fail at once with kBusy.
  bool wait = false;
  // The message of the kBusy error ("another backup of this chain runs").
  std::string busy_message = "locked by another process";
  // The mode bits of a lock file the call creates (the umask applies).
  uint32_t create_mode = 0644;
};

// What an image lock reserves, in QEMU's terms (docs/formats/qcow2.md,
// "Image locks").
enum class ImageAccess : uint8_t {
  // Read with nobody writing: conflicts with a QEMU process that writes the
  // image (a running VM), and keeps such processes out while held.
  kRead,
  // Edit in place with nobody else having the image open: conflicts with
  // any QEMU process that has it open, and keeps QEMU out while held.
  kExclusiveWrite,
};

// Operation kinds, for wrappers that count or fail calls by kind.
enum class EnvOp : uint8_t {
  kOpen,      // OpenSource, OpenSink (ReadFile/WriteFile* open through them)
  kRead,      // reads of a source opened through the Env
  kWrite,     // a sink's WriteAt, WriteZeroes, Trim, Truncate
  kSync,      // a sink's Flush (fdatasync)
  kSyncDir,   // SyncDir
  kRename,    // Rename
  kLink,      // Link, CreateSymlink
  kUnlink,    // Unlink, RemoveDir
  kMkdir,     // CreateDir
  kList,      // ListDir
  kLock,      // LockFile, LockImage
  kStat,      // Stat, StatNoFollow, ReadLink, RealPath, Space
  kSetOwner,  // SetOwner, SetMode
};
inline constexpr size_t kEnvOpCount = 13;
std::string_view EnvOpName(EnvOp op);

// Thread safety: every method may be called from any thread.
class Env {
 public:
  Env() = default;
  virtual ~Env() = default;
  Env(const Env&) = delete;
  Env& operator=(const Env&) = delete;

  // The Env every layer uses unless given another: the POSIX one, or what
  // a test installed with ScopedDefaultEnv. Defined in blockio (the
  // implementation library), not blockio_api.
  static Env& Default();

  // ---- block data ----
  // A file or block device as a source (blockio/file.h's backends). A
  // kernel pseudo-file (procfs, sysfs: it reports no size) gives a
  // snapshot of its contents read at open, so ReadFile works on it.
  virtual Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path,
                                                          const FileOptions& options = {}) = 0;
  // A file or block device as a sink. New files get options.create_mode
  // (0644 unless asked otherwise).
  virtual Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                                      const FileOptions& options = {}) = 0;

  // ---- names ----
  // Follows symbolic links. kNotFound when nothing is there.
  virtual Result<FileStat> Stat(const std::string& path) = 0;
  // Does not follow a final symbolic link (a link reports kSymlink).
  virtual Result<FileStat> StatNoFollow(const std::string& path) = 0;
  // The names in `dir` (no "." or ".."), sorted. kNotFound for a missing
  // folder.
  virtual Result<std::vector<std::string>> ListDir(const std::string& dir) = 0;
  // One folder with `mode` (the umask applies); its parent must exist. An
  // existing folder is not an error (its mode is left as it is).
  virtual Status CreateDir(const std::string& dir, uint32_t mode = 0755) = 0;
  // A new folder "PARENT/PREFIX" + six random characters, made with
  // mkdtemp(3): mode 0700, owned by this process's user, never one that
  // existed before (a name planted in a shared folder such as /tmp is
  // never used). Returns its path.
  virtual Result<std::string> CreateTempDir(const std::string& parent, std::string_view prefix) = 0;
  // Atomically replaces `to` (rename(2)).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // A second name for `from`; fails with EEXIST (kInvalidArgument) when
  // `to` exists: a publish that never replaces.
  virtual Status Link(const std::string& from, const std::string& to) = 0;
  // A symbolic link at `path` holding `target` as is (not resolved);
  // fails with EEXIST (kInvalidArgument) when `path` exists.
  virtual Status CreateSymlink(const std::string& target, const std::string& path) = 0;
  // The text a symbolic link holds. kNotFound when missing;
  // kInvalidArgument (EINVAL) when `path` is not a link.
  virtual Result<std::string> ReadLink(const std::string& path) = 0;
  // kNotFound when missing.
  virtual Status Unlink(const std::string& path) = 0;
  // An empty folder. kNotFound when missing.
  virtual Status RemoveDir(const std::string& dir) = 0;
  // Makes the folder's entries (creates, renames, unlinks in it) durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // Free and total bytes, and the type, of the filesystem holding `path`.
  virtual Result<SpaceInfo> Space(const std::string& path) = 0;
  // chown/chmod (cbt enable grants QEMU's user access to a data file).
  virtual Status SetOwner(const std::string& path, uint32_t uid, uint32_t gid) = 0;
  virtual Status SetMode(const std::string& path, uint32_t mode) = 0;
  // Resolves symbolic links and "..": the absolute canonical path of an
  // existing file. kNotFound when missing.
  virtual Result<std::string> RealPath(const std::string& path) = 0;

  // ---- locks ----
  // An exclusive flock on `path` (a lock file, or a temporary file being
  // written). Only a regular file is locked: a symbolic link, FIFO or
  // other entry planted under the name is refused (kInvalidArgument, or
  // ELOOP for a link), never followed or waited on. With `create`, the
  // file is made when missing and the lock is
  // taken on the file that is at `path` afterwards (a lock on a file that
  // another process removed meanwhile is retried).
  // Returns: the lock; kBusy (retryable) with options.busy_message when
  // another open file holds it and !wait; kNotFound without `create` when
  // missing; an errno Error otherwise.
  virtual Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path,
                                                    const LockOptions& options = {}) = 0;
  // QEMU's image locks (OFD byte-range locks on the image file, as
  // qemu-img and QEMU take them): checks that no other process holds the
  // image in a way `access` conflicts with, then holds locks that keep
  // QEMU from opening it conflictingly until released.
  // Returns: the lock; kBusy (retryable) naming the holder process when
  // possible ("pid 1234 (qemu-system-x86)"); kNotFound when missing.
  virtual Result<std::unique_ptr<EnvLock>> LockImage(const std::string& path,
                                                     ImageAccess access) = 0;

  // ---- helpers on the primitives above (not virtual: wrappers see the
  // primitive calls they are made of) ----
  // Stat ok; false for kNotFound and any other error.
  bool Exists(const std::string& path);
  // Every missing folder of `dir`, parents first (mkdir -p), each made
  // with `mode`.
  Status CreateDirs(const std::string& dir, uint32_t mode = 0755);
  // The whole file, or what a pipe (`<(command)`) holds to its end;
  // kInvalidArgument when larger than `max_bytes`.
  Result<std::string> ReadFile(const std::string& path, uint64_t max_bytes = 16 << 20);
  // ReadFile for a file in a folder barge writes (a chain folder): a
  // regular file only, never followed through a final symbolic link,
  // never waited on as a FIFO (kInvalidArgument, or ELOOP for a link).
  Result<std::string> ReadOwnFile(const std::string& path, uint64_t max_bytes = 16 << 20);
  // Replaces `path` atomically with `bytes`: written to the hidden
  // temporary name ".NAME.barge-tmp" beside it, flushed (unless !sync),
  // renamed over `path`, and the folder synced (unless !sync). A crash
  // leaves either the old or the new contents under `path`, never a mix.
  // The temporary is never followed through a symbolic link planted under
  // its name; a new file gets `mode` (the umask applies).
  Status WriteFileAtomic(const std::string& path, std::span<const std::byte> bytes,
                         bool sync = true, uint32_t mode = 0644);
  Status WriteFileAtomic(const std::string& path, std::string_view text, bool sync = true,
                         uint32_t mode = 0644);
  // Removes a file or a folder with everything in it. A missing path is
  // not an error.
  Status RemoveTree(const std::string& path);
  // Unlink, where a file that is already gone is not an error.
  Status UnlinkIfExists(const std::string& path);
};

// Forwards every call to a target Env (leveldb's EnvWrapper): a wrapper
// overrides what it changes. The target must outlive the wrapper.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env& target) : target_(target) {}
  Env& target() { return target_; }

  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path,
                                                  const FileOptions& options) override {
    return target_.OpenSource(path, options);
  }
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override {
    return target_.OpenSink(path, mode, options);
  }
  Result<FileStat> Stat(const std::string& path) override { return target_.Stat(path); }
  Result<FileStat> StatNoFollow(const std::string& path) override {
    return target_.StatNoFollow(path);
  }
  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    return target_.ListDir(dir);
  }
  Status CreateDir(const std::string& dir, uint32_t mode = 0755) override {
    return target_.CreateDir(dir, mode);
  }
  Result<std::string> CreateTempDir(const std::string& parent, std::string_view prefix) override {
    return target_.CreateTempDir(parent, prefix);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return target_.Rename(from, to);
  }
  Status Link(const std::string& from, const std::string& to) override {
    return target_.Link(from, to);
  }
  Status CreateSymlink(const std::string& target, const std::string& path) override {
    return target_.CreateSymlink(target, path);
  }
  Result<std::string> ReadLink(const std::string& path) override { return target_.ReadLink(path); }
  Status Unlink(const std::string& path) override { return target_.Unlink(path); }
  Status RemoveDir(const std::string& dir) override { return target_.RemoveDir(dir); }
  Status SyncDir(const std::string& dir) override { return target_.SyncDir(dir); }
  Result<SpaceInfo> Space(const std::string& path) override { return target_.Space(path); }
  Status SetOwner(const std::string& path, uint32_t uid, uint32_t gid) override {
    return target_.SetOwner(path, uid, gid);
  }
  Status SetMode(const std::string& path, uint32_t mode) override {
    return target_.SetMode(path, mode);
  }
  Result<std::string> RealPath(const std::string& path) override { return target_.RealPath(path); }
  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path,
                                            const LockOptions& options) override {
    return target_.LockFile(path, options);
  }
  Result<std::unique_ptr<EnvLock>> LockImage(const std::string& path,
                                             ImageAccess access) override {
    return target_.LockImage(path, access);
  }

 private:
  Env& target_;
};

// The POSIX Env (a process-wide singleton; Default() unless replaced).
Env& PosixEnv();

// Installs `env` as Env::Default() until destroyed, then restores the
// previous one. For tests; not to be used while other threads run jobs.
class ScopedDefaultEnv {
 public:
  explicit ScopedDefaultEnv(Env& env);
  ~ScopedDefaultEnv();
  ScopedDefaultEnv(const ScopedDefaultEnv&) = delete;
  ScopedDefaultEnv& operator=(const ScopedDefaultEnv&) = delete;

 private:
  Env* previous_;
};

// ".NAME.barge-tmp" beside `final_path`: the hidden name every staged
// output is written under until it is complete (pipeline/staged_file.h,
// Env::WriteFileAtomic). Its writer holds a LockFile on it, so a sweep
// can tell a killed run's leftover (unlocked) from a live writer's file.
std::string TempPathFor(const std::string& final_path);
// True for names of that form.
bool IsTempName(std::string_view file_name);

// The absolute path of `path` with symbolic links and ".." resolved as far
// as it exists (the missing rest is added lexically), like
// std::filesystem::weakly_canonical; the lexical AbsolutePath when nothing
// can be resolved. For path policies (is a backing file inside a folder?)
// and for telling two names of one file apart.
std::string CanonicalPath(Env& env, const std::string& path);

// Removes the leftover temporaries of killed runs in `dir`: every
// ".*.barge-tmp" whose lock is free. A file a live process still writes
// is kept. Returns the names removed. A missing folder is not an error.
Result<std::vector<std::string>> SweepStaleTemporaries(Env& env, const std::string& dir);

}  // namespace barge

namespace barge {

// Files a process is writing under temporary names, so that a process that
// must exit before its jobs unwind (a second SIGINT, cli/interrupt.h) can
// still remove them. StagedFile and WriteFileAtomic register theirs.
// Thread-safe.
class TempRegistration {
 public:
  TempRegistration() = default;
  explicit TempRegistration(std::string path);
  ~TempRegistration();
  TempRegistration(TempRegistration&& o) noexcept;
  TempRegistration& operator=(TempRegistration&& o) noexcept;
  TempRegistration(const TempRegistration&) = delete;
  TempRegistration& operator=(const TempRegistration&) = delete;

 private:
  uint64_t id_ = 0;
};
// Unlinks every registered temporary now (directly, not through an Env:
// called on the way out of a process). Returns how many were removed.
size_t RemoveRegisteredTemporaries();

}  // namespace barge
