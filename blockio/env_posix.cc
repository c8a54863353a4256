// PosixEnv: the filesystem seam over POSIX calls, the default Env; the
// Env's helpers built on its primitives; the temporary-file registry.
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include "blockio/env.h"
#include "blockio/file.h"
#include "blockio/leftovers.h"
#include "blockio/memory.h"
#include "blockio/path.h"

namespace barge {

std::string_view EnvOpName(EnvOp op) {
  switch (op) {
    case EnvOp::kOpen: return "open";
    case EnvOp::kRead: return "read";
    case EnvOp::kWrite: return "write";
    case EnvOp::kSync: return "sync";
    case EnvOp::kSyncDir: return "sync-dir";
    case EnvOp::kRename: return "rename";
    case EnvOp::kLink: return "link";
    case EnvOp::kUnlink: return "unlink";
    case EnvOp::kMkdir: return "mkdir";
    case EnvOp::kList: return "list";
    case EnvOp::kLock: return "lock";
    case EnvOp::kStat: return "stat";
    case EnvOp::kSetOwner: return "set-owner";
  }
  return "unknown";
}

namespace {

// Closes its descriptor.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

FileStat FromStat(const struct stat& st) {
  FileStat s;
  if (S_ISREG(st.st_mode)) s.type = FileStat::Type::kRegular;
  else if (S_ISDIR(st.st_mode)) s.type = FileStat::Type::kDirectory;
  else if (S_ISBLK(st.st_mode)) s.type = FileStat::Type::kBlockDevice;
  else if (S_ISLNK(st.st_mode)) s.type = FileStat::Type::kSymlink;
  s.size_bytes = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s.mode = st.st_mode & 07777;
  s.uid = st.st_uid;
  s.gid = st.st_gid;
  s.device = st.st_dev;
  s.inode = st.st_ino;
  s.allocated_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  return s;
}

std::string ParentOf(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// An flock held on an open descriptor.
class FlockLock final : public EnvLock {
 public:
  FlockLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~FlockLock() override { ::close(fd_); }  // closing the descriptor drops the flock
  const std::string& path() const override { return path_; }

 private:
  int fd_;
  std::string path_;
};

// QEMU's image locks (block/file-posix.c): one byte per permission bit at
// 100 + bit ("I use this permission") and at 200 + bit ("I do not let
// others use it"), each taken as a shared OFD lock. Bits: 0 consistent
// read, 1 write, 2 write unchanged, 3 resize. A process that wants a
// permission checks that nobody holds its "not shared" byte, and checks
// the "use" bytes of every permission it does not share.
constexpr off_t kPermBase = 100;
constexpr off_t kSharedBase = 200;
constexpr int kPermBits = 4;
constexpr uint32_t kPermConsistentRead = 1u << 0;
constexpr uint32_t kPermWrite = 1u << 1;
constexpr uint32_t kPermResize = 1u << 3;
constexpr uint32_t kPermAll = (1u << kPermBits) - 1;

std::string_view PermName(int bit) {
  switch (bit) {
    case 0: return "consistent read";
    case 1: return "write";
    case 2: return "write unchanged";
    case 3: return "resize";
  }
  return "unknown";
}

// True when another open file description holds a lock on byte `offset`.
Result<bool> ByteLockedElsewhere(int fd, off_t offset, const std::string& path) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = offset;
  fl.l_len = 1;
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return Error::FromErrno(errno, "fcntl(F_OFD_GETLK)", path);
  return fl.l_type != F_UNLCK;
}

Status LockByte(int fd, off_t offset, const std::string& path) {
  struct flock fl {};
  fl.l_type = F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = offset;
  fl.l_len = 1;
  if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    int err = errno;
    if (err == EAGAIN || err == EACCES) return Error::Busy("image is locked").set_path(path);
    return Error::FromErrno(err, "fcntl(F_OFD_SETLK)", path);
  }
  return OkStatus();
}

// "pid 1234 (qemu-system-x86)" for every other process that has the file
// open, found through /proc/PID/fd; empty when none can be seen.
std::string DescribeOpeners(const struct stat& target) {
  std::string out;
  int found = 0;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  pid_t self = ::getpid();
  while (struct dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0 || pid == self) continue;
    std::string fd_dir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    bool has = false;
    while (struct dirent* f = ::readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      struct stat st;
      if (::stat((fd_dir + "/" + f->d_name).c_str(), &st) == 0 && st.st_dev == target.st_dev &&
          st.st_ino == target.st_ino) {
        has = true;
        break;
      }
    }
    ::closedir(fds);
    if (!has) continue;
    std::string comm;
    if (FILE* c = std::fopen((std::string("/proc/") + e->d_name + "/comm").c_str(), "r")) {
      char buf[64] = {};
      if (std::fgets(buf, sizeof buf, c)) comm = buf;
      std::fclose(c);
      while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    }
    if (found++ > 0) out += ", ";
    out += "pid " + std::to_string(pid) + (comm.empty() ? "" : " (" + comm + ")");
    if (found == 3) break;
  }
  ::closedir(proc);
  return out;
}

// procfs and sysfs files report a size of 0 whatever they hold.
bool IsPseudoFile(const std::string& path) {
  constexpr long kProcMagic = 0x9fa0, kSysfsMagic = 0x62656572;
  struct statfs fs;
  return ::statfs(path.c_str(), &fs) == 0 && (fs.f_type == kProcMagic || fs.f_type == kSysfsMagic);
}

bool IsPipe(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

// The whole contents of a pseudo-file or a pipe, read to its end (at most
// `limit` bytes).
Result<std::unique_ptr<BlockSource>> SnapshotStream(const std::string& path, uint64_t limit) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Error::FromErrno(errno, "open", path);
  std::vector<std::byte> bytes;
  std::byte buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Error::FromErrno(errno, "read", path);
    if (n == 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
    if (bytes.size() > limit) {
      return Error::InvalidArgument("holds more than " + std::to_string(limit) + " bytes").set_path(path);
    }
  }
  return std::unique_ptr<BlockSource>(new MemorySource(std::move(bytes), path));
}

class ImageLock final : public EnvLock {
 public:
  ImageLock(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~ImageLock() override { ::close(fd_); }  // closing the description drops its OFD locks
  const std::string& path() const override { return path_; }

 private:
  int fd_;
  std::string path_;
};

class PosixEnvImpl final : public Env {
 public:
  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path,
                                                  const FileOptions& options) override {
    if (!options.regular_only && IsPipe(path)) {
      // Refused before the open, which would wait for a writer.
      if (options.pipe_limit == 0) {
        return Error::InvalidArgument("a pipe cannot be a disk: not a regular file or block device").set_path(path);
      }
      return SnapshotStream(path, options.pipe_limit);
    }
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> source, OpenFileSource(path, options));
    // Only an empty-looking file pays for the filesystem type check.
    if (source->size_bytes() == 0 && IsPseudoFile(path)) return SnapshotStream(path, 16u << 20);
    return source;
  }

  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options) override {
    return OpenFileSink(path, mode, options);
  }

  Result<FileStat> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Error::FromErrno(errno, "stat", path);
    return FromStat(st);
  }

  Result<FileStat> StatNoFollow(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return Error::FromErrno(errno, "lstat", path);
    return FromStat(st);
  }

  Result<std::vector<std::string>> ListDir(const std::string& dir) override {
    DIR* d = ::opendir(dir.empty() ? "." : dir.c_str());
    if (d == nullptr) return Error::FromErrno(errno, "open folder", dir);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n != "." && n != "..") names.emplace_back(n);
      errno = 0;
    }
    int err = errno;
    ::closedir(d);
    if (err != 0) return Error::FromErrno(err, "read folder", dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDir(const std::string& dir, uint32_t mode) override {
    if (::mkdir(dir.c_str(), static_cast<mode_t>(mode & 07777)) == 0) return OkStatus();
    int err = errno;
    struct stat st;
    if (err == EEXIST && ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return OkStatus();
    if (err == EEXIST) return Error::InvalidArgument("exists and is not a folder").set_path(dir);
    return Error::FromErrno(err, "create folder", dir);
  }

  Result<std::string> CreateTempDir(const std::string& parent, std::string_view prefix) override {
    std::string name = JoinPath(parent, std::string(prefix) + "XXXXXX");
    if (::mkdtemp(name.data()) == nullptr) return Error::FromErrno(errno, "create folder", name);
    return name;
  }

  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return Error::FromErrno(errno, "rename from " + from, to);
    }
    return OkStatus();
  }

  Status Link(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) != 0) return Error::FromErrno(errno, "link from " + from, to);
    return OkStatus();
  }

  Status CreateSymlink(const std::string& target, const std::string& path) override {
    if (::symlink(target.c_str(), path.c_str()) != 0) {
      return Error::FromErrno(errno, "symlink to " + target, path);
    }
    return OkStatus();
  }

  Result<std::string> ReadLink(const std::string& path) override {
    std::string buf(PATH_MAX, '\0');
    ssize_t n = ::readlink(path.c_str(), buf.data(), buf.size());
    if (n < 0) return Error::FromErrno(errno, "readlink", path);
    if (static_cast<size_t>(n) == buf.size()) return Error::InvalidArgument("link too long").set_path(path);
    buf.resize(static_cast<size_t>(n));
    return buf;
  }

  Status Unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Error::FromErrno(errno, "remove", path);
    return OkStatus();
  }

  Status RemoveDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return Error::FromErrno(errno, "remove folder", dir);
    return OkStatus();
  }

  Status SyncDir(const std::string& dir) override {
    UniqueFd fd(::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) return Error::FromErrno(errno, "open folder", dir);
    if (::fsync(fd.get()) != 0) return Error::FromErrno(errno, "fsync folder", dir);
    return OkStatus();
  }

  Result<SpaceInfo> Space(const std::string& path) override {
    struct statvfs st;
    if (::statvfs(path.c_str(), &st) != 0) return Error::FromErrno(errno, "statvfs", path);
    SpaceInfo info;
    info.free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    info.total_bytes = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
    info.read_only = (st.f_flag & ST_RDONLY) != 0;
    struct statfs fs;
    if (::statfs(path.c_str(), &fs) == 0) info.filesystem_type = static_cast<uint64_t>(fs.f_type);
    return info;
  }

  Status SetOwner(const std::string& path, uint32_t uid, uint32_t gid) override {
    if (::chown(path.c_str(), uid, gid) != 0) return Error::FromErrno(errno, "chown", path);
    return OkStatus();
  }

  Status SetMode(const std::string& path, uint32_t mode) override {
    if (::chmod(path.c_str(), mode) != 0) return Error::FromErrno(errno, "chmod", path);
    return OkStatus();
  }

  Result<std::string> RealPath(const std::string& path) override {
    char buf[PATH_MAX];
    if (::realpath(path.c_str(), buf) == nullptr) return Error::FromErrno(errno, "realpath", path);
    return std::string(buf);
  }

  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path,
                                            const LockOptions& options) override {
    for (;;) {
      // O_NOFOLLOW and O_NONBLOCK: a link planted under the name is not
      // followed (no file created elsewhere), a FIFO not waited on.
      int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (options.create ? O_CREAT : 0);
      UniqueFd fd(::open(path.c_str(), flags, static_cast<mode_t>(options.create_mode & 07777)));
      if (fd.get() < 0) return Error::FromErrno(errno, "open lock file", path);
      {
        struct stat st;
        if (::fstat(fd.get(), &st) != 0) return Error::FromErrno(errno, "fstat", path);
        if (!S_ISREG(st.st_mode)) {
          return Error::InvalidArgument("lock file is not a regular file (refused)").set_path(path);
        }
      }
      int rc;
      do {
        rc = ::flock(fd.get(), LOCK_EX | (options.wait ? 0 : LOCK_NB));
      } while (rc != 0 && errno == EINTR);
      if (rc != 0) {
        if (errno == EWOULDBLOCK) return Error::Busy(options.busy_message).set_path(path);
        return Error::FromErrno(errno, "flock", path);
      }
      // The file may have been removed (a sweep of a stale temporary, a
      // finished writer) between open and flock: the lock must be on the
      // file that is at `path` now.
      struct stat held, now;
      if (::fstat(fd.get(), &held) != 0) return Error::FromErrno(errno, "fstat", path);
      if (::stat(path.c_str(), &now) == 0 && now.st_dev == held.st_dev && now.st_ino == held.st_ino) {
        return std::unique_ptr<EnvLock>(new FlockLock(fd.release(), path));
      }
      if (!options.create) return Error::NotFound("removed while locking").set_path(path);
    }
  }

  Result<std::unique_ptr<EnvLock>> LockImage(const std::string& path, ImageAccess access) override {
    // Read-only is enough for OFD read locks, and never changes the file.
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return Error::FromErrno(errno, "open", path);
    uint32_t perm = access == ImageAccess::kRead ? kPermConsistentRead : kPermAll;
    uint32_t shared = access == ImageAccess::kRead ? kPermAll & ~(kPermWrite | kPermResize) : 0;
    auto conflict = [&]() -> Result<std::string> {
      for (int bit = 0; bit < kPermBits; ++bit) {
        if (perm & (1u << bit)) {
          BARGE_ASSIGN_OR_RETURN(bool held, ByteLockedElsewhere(fd.get(), kSharedBase + bit, path));
          if (held) return "another process does not share \"" + std::string(PermName(bit)) + "\"";
        }
        if (!(shared & (1u << bit))) {
          BARGE_ASSIGN_OR_RETURN(bool held, ByteLockedElsewhere(fd.get(), kPermBase + bit, path));
          if (held) return "another process holds \"" + std::string(PermName(bit)) + "\"";
        }
      }
      return std::string();
    };
    auto busy = [&](const std::string& why) -> Error {
      struct stat st;
      std::string who = ::fstat(fd.get(), &st) == 0 ? DescribeOpeners(st) : "";
      return Error::Busy("the image is in use (" + why + "; QEMU's image lock" +
                         (who.empty() ? "" : ", held by " + who) +
                         "): stop the VM or process using it first")
          .set_path(path);
    };
    BARGE_ASSIGN_OR_RETURN(std::string why, conflict());
    if (!why.empty()) return busy(why);
    for (int bit = 0; bit < kPermBits; ++bit) {
      if (perm & (1u << bit)) {
        Status s = LockByte(fd.get(), kPermBase + bit, path);
        if (!s.ok()) return s.error().code() == ErrorCode::kBusy ? busy("lock taken meanwhile") : s.error();
      }
      if (!(shared & (1u << bit))) {
        Status s = LockByte(fd.get(), kSharedBase + bit, path);
        if (!s.ok()) return s.error().code() == ErrorCode::kBusy ? busy("lock taken meanwhile") : s.error();
      }
    }
    // Another process may have checked before our locks landed and locked
    // after: look again now that ours are held, as QEMU does.
    BARGE_ASSIGN_OR_RETURN(why, conflict());
    if (!why.empty()) return busy(why);
    return std::unique_ptr<EnvLock>(new ImageLock(fd.release(), path));
  }
};

std::atomic<Env*> g_default{nullptr};

}  // namespace

Env& PosixEnv() {
  static PosixEnvImpl env;
  return env;
}

Env& Env::Default() {
  Env* e = g_default.load(std::memory_order_acquire);
  return e != nullptr ? *e : PosixEnv();
}

ScopedDefaultEnv::ScopedDefaultEnv(Env& env) : previous_(g_default.exchange(&env)) {}
ScopedDefaultEnv::~ScopedDefaultEnv() { g_default.store(previous_); }

// ---- helpers ----

bool Env::Exists(const std::string& path) { return Stat(path).ok(); }

Status Env::CreateDirs(const std::string& dir, uint32_t mode) {
  if (dir.empty() || dir == "/" || dir == ".") return OkStatus();
  auto st = Stat(dir);
  if (st.ok()) {
    if (st->is_directory()) return OkStatus();
    return Error::InvalidArgument("exists and is not a folder").set_path(dir);
  }
  if (st.error().code() != ErrorCode::kNotFound) return st.error();
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  BARGE_RETURN_IF_ERROR(CreateDirs(ParentOf(trimmed), mode));
  return CreateDir(trimmed, mode);
}

namespace {

Result<std::string> ReadWhole(Env& env, const std::string& path, uint64_t max_bytes,
                              const FileOptions& o) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> src, env.OpenSource(path, o));
  uint64_t size = src->size_bytes();
  if (size > max_bytes) {
    return Error::InvalidArgument("file is larger than " + std::to_string(max_bytes) + " bytes")
        .set_path(path);
  }
  std::string out(size, '\0');
  BARGE_RETURN_IF_ERROR(src->ReadAt(0, std::as_writable_bytes(std::span(out.data(), out.size()))));
  return out;
}

}  // namespace

Result<std::string> Env::ReadFile(const std::string& path, uint64_t max_bytes) {
  FileOptions o;
  o.use_uring = false;
  o.pipe_limit = max_bytes;
  return ReadWhole(*this, path, max_bytes, o);
}

Result<std::string> Env::ReadOwnFile(const std::string& path, uint64_t max_bytes) {
  FileOptions o;
  o.use_uring = false;
  o.no_follow = true;
  o.regular_only = true;
  return ReadWhole(*this, path, max_bytes, o);
}

Status Env::WriteFileAtomic(const std::string& path, std::span<const std::byte> bytes, bool sync,
                            uint32_t mode) {
  std::string temp = TempPathFor(path);
  // Errors name `path`, the file the caller knows; the temporary is ours.
  auto named = [&](Error e) {
    if (e.path().empty() || e.path() == temp) e.set_path(path);
    return e;
  };
  // Only a regular file is ever a writer's temporary: anything else at its
  // name (a symbolic link or FIFO planted there) is removed, never
  // followed (unlink(2) removes a link, not its target), as StagedFile does.
  if (auto planted = RemovePlanted(*this, temp); !planted.ok()) return named(planted.error());
  LockOptions lo;
  lo.busy_message = "another process is writing this file";
  lo.create_mode = mode;
  auto lock = LockFile(temp, lo);
  if (!lock.ok()) {
    // The first file made beside `path`: ENOENT here means its folder is missing.
    if (lock.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("cannot write the file: its folder " + ParentOf(path) + " does not exist").set_path(path);
    }
    if (lock.error().errno_value() == ENOTDIR) {
      return Error::InvalidArgument("cannot write the file: " + ParentOf(path) + " is not a folder").set_path(path);
    }
    return named(std::move(lock).error());
  }
  TempRegistration registered(temp);
  auto fail = [&](Error e) -> Status { return named(std::move(e)).Also(Unlink(temp)); };
  FileOptions o;
  o.write_behind = false;
  o.sync = sync;
  o.create_mode = mode;
  o.no_follow = true;
  o.regular_only = true;
  auto sink = OpenSink(temp, SinkMode::kTruncate, o);
  if (!sink.ok()) return fail(std::move(sink).error());
  Status s = (*sink)->WriteAt(0, bytes);
  if (s.ok()) s = (*sink)->Flush();
  sink->reset();
  if (!s.ok()) return fail(std::move(s).error());
  if (Status r = Rename(temp, path); !r.ok()) {
    Error e = std::move(r).error();
    if (e.errno_value() == EISDIR) {
      e = Error::InvalidArgument("cannot replace it with a file: it is a folder").set_path(path);
    } else if (e.errno_value() != 0) {
      e = Error::FromErrno(e.errno_value(), "replace (rename)", path);
    }
    return fail(std::move(e));
  }
  if (!sync) return OkStatus();
  return SyncDir(ParentOf(path));
}

Status Env::WriteFileAtomic(const std::string& path, std::string_view text, bool sync,
                            uint32_t mode) {
  return WriteFileAtomic(path, std::as_bytes(std::span(text.data(), text.size())), sync, mode);
}

Status Env::RemoveTree(const std::string& path) {
  auto st = StatNoFollow(path);
  if (!st.ok()) return st.error().code() == ErrorCode::kNotFound ? OkStatus() : st.error();
  if (!st->is_directory()) {
    Status s = Unlink(path);
    return s.ok() || s.error().code() == ErrorCode::kNotFound ? OkStatus() : s;
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(path));
  for (const auto& n : names) BARGE_RETURN_IF_ERROR(RemoveTree(path + "/" + n));
  Status s = RemoveDir(path);
  return s.ok() || s.error().code() == ErrorCode::kNotFound ? OkStatus() : s;
}

Status Env::UnlinkIfExists(const std::string& path) {
  Status s = Unlink(path);
  return s.ok() || s.error().code() == ErrorCode::kNotFound ? OkStatus() : s;
}

std::string CanonicalPath(Env& env, const std::string& path) {
  std::string abs = AbsolutePath(path);
  // The longest existing prefix is resolved; what follows it is added as
  // written (it cannot hold links: it does not exist).
  std::string head = abs, tail;
  for (;;) {
    auto real = env.RealPath(head);
    if (real.ok()) return tail.empty() ? *real : LexicallyNormal(JoinPath(*real, tail));
    if (head == "/" || real.error().code() != ErrorCode::kNotFound) return abs;
    tail = tail.empty() ? BaseName(head) : JoinPath(BaseName(head), tail);
    head = DirName(head);
  }
}

std::string TempPathFor(const std::string& final_path) {
  auto slash = final_path.find_last_of('/');
  if (slash == std::string::npos) return "." + final_path + ".barge-tmp";
  return final_path.substr(0, slash + 1) + "." + final_path.substr(slash + 1) + ".barge-tmp";
}

bool IsTempName(std::string_view name) {
  return name.size() > 11 && name[0] == '.' && name.ends_with(".barge-tmp");
}

Result<std::vector<std::string>> SweepStaleTemporaries(Env& env, const std::string& dir) {
  std::vector<std::string> removed;
  auto names = env.ListDir(dir);
  if (!names.ok()) {
    if (names.error().code() == ErrorCode::kNotFound) return removed;
    return names.error();
  }
  for (const auto& name : *names) {
    if (!IsTempName(name)) continue;
    std::string path = dir + "/" + name;
    // A symbolic link, FIFO or other non-file planted under a temporary's
    // name is no writer's: removed (never followed), not locked.
    BARGE_ASSIGN_OR_RETURN(bool planted, RemovePlanted(env, path));
    if (planted) {
      removed.push_back(name);
      continue;
    }
    LockOptions lo;
    lo.create = false;
    auto lock = env.LockFile(path, lo);
    if (!lock.ok()) {
      ErrorCode c = lock.error().code();
      if (c == ErrorCode::kBusy || c == ErrorCode::kNotFound) continue;  // live writer, or gone
      return lock.error();
    }
    Status s = env.Unlink(path);
    if (!s.ok() && s.error().code() != ErrorCode::kNotFound) return s.error();
    if (s.ok()) removed.push_back(name);
  }
  return removed;
}

// ---- temporaries registry ----

namespace {
std::mutex g_temps_mu;
std::map<uint64_t, std::string>& Temps() {
  static auto* temps = new std::map<uint64_t, std::string>();  // never destroyed: used at exit
  return *temps;
}
uint64_t g_next_temp_id = 1;  // guarded by g_temps_mu
}  // namespace

TempRegistration::TempRegistration(std::string path) {
  std::lock_guard lock(g_temps_mu);
  id_ = g_next_temp_id++;
  Temps().emplace(id_, std::move(path));
}

TempRegistration::~TempRegistration() {
  if (id_ == 0) return;
  std::lock_guard lock(g_temps_mu);
  Temps().erase(id_);
}

TempRegistration::TempRegistration(TempRegistration&& o) noexcept : id_(std::exchange(o.id_, 0)) {}

TempRegistration& TempRegistration::operator=(TempRegistration&& o) noexcept {
  std::swap(id_, o.id_);
  return *this;
}

size_t RemoveRegisteredTemporaries() {
  std::lock_guard lock(g_temps_mu);
  size_t n = 0;
  // In registration order: a private folder (StageStream's) after the
  // file in it, so that it is empty by then.
  for (const auto& [id, path] : Temps()) {
    if (::unlink(path.c_str()) == 0) {
      ++n;
    } else if (errno == EISDIR || errno == EPERM) {
      n += ::rmdir(path.c_str()) == 0;
    }
  }
  Temps().clear();
  return n;
}

}  // namespace barge
