// File and block-device backends: a synchronous pread/pwrite implementation
// that the io_uring backend builds on (see uring.cc) and falls back to.
#include "blockio/file.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "blockio/file_internal.h"

namespace barge {

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace internal {

Result<Fd> OpenFd(const std::string& path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return Error::FromErrno(errno, "open", path);
  return Fd(fd);
}

Status RequireRegular(const Fd& fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::FromErrno(errno, "fstat", path);
  if (!S_ISREG(st.st_mode)) {
    return Error::InvalidArgument("not a regular file (a FIFO, socket, device or folder is refused here)")
        .set_path(path);
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return Error::FromErrno(errno, "fcntl", path);
  }
  return OkStatus();
}

Result<FileInfo> StatFd(const Fd& fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::FromErrno(errno, "fstat", path);
  FileInfo info;
  info.is_block_device = S_ISBLK(st.st_mode);
  if (info.is_block_device) {
    uint64_t size = 0;
    if (::ioctl(fd.get(), BLKGETSIZE64, &size) != 0) {
      return Error::FromErrno(errno, "ioctl(BLKGETSIZE64)", path);
    }
    info.size_bytes = size;
    int logical = 512;
    if (::ioctl(fd.get(), BLKSSZGET, &logical) == 0 && logical > 0) {
      info.logical_block_bytes = static_cast<uint32_t>(logical);
    }
  } else if (S_ISREG(st.st_mode)) {
    info.size_bytes = static_cast<uint64_t>(st.st_size);
  } else {
    return Error::InvalidArgument("not a regular file or block device").set_path(path);
  }
  return info;
}

Status PreadFull(int fd, const std::string& path, uint64_t offset, std::span<std::byte> out) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error::FromErrno(errno, "pread", path, offset + done, out.size() - done);
    }
    if (n == 0) {
      return Error::IoError("unexpected end of file").set_path(path).set_range(offset + done,
                                                                              out.size() - done);
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

Status PwriteFull(int fd, const std::string& path, uint64_t offset,
                  std::span<const std::byte> data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n =
        ::pwrite(fd, data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Error::FromErrno(errno, "pwrite", path, offset + done, data.size() - done);
    }
    if (n == 0) {
      return Error::IoError("pwrite made no progress").set_path(path).set_range(offset + done,
                                                                               data.size() - done);
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

// SetUringAllowed's process-wide switch.
std::atomic<bool> uring_allowed{true};

bool UringWanted(const FileOptions& options) {
  return options.use_uring && uring_allowed.load(std::memory_order_relaxed);
}

}  // namespace internal

void SetUringAllowed(bool allowed) { internal::uring_allowed.store(allowed, std::memory_order_relaxed); }

using internal::Fd;
using internal::FileInfo;

FileSource::FileSource(std::string path, Fd fd, FileInfo info)
    : path_(std::move(path)), fd_(std::move(fd)), info_(info) {}

SourceCapabilities FileSource::capabilities() const {
  SourceCapabilities caps;
  caps.has_extents = !info_.is_block_device;
  caps.preferred_request_bytes = 1 << 20;
  caps.alignment_bytes = info_.direct ? info_.logical_block_bytes : 1;
  return caps;
}

Status FileSource::ReadAt(uint64_t offset, std::span<std::byte> out) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, out.size()));
  return internal::PreadFull(fd_.get(), path_, offset, out);
}

Result<ExtentList> FileSource::Extents(uint64_t offset, uint64_t length) {
  BARGE_RETURN_IF_ERROR(CheckRange(offset, length));
  if (info_.is_block_device) return BlockSource::Extents(offset, length);
  ExtentList out;
  uint64_t end = offset + length;
  uint64_t pos = offset;
  while (pos < end) {
    off_t data = ::lseek(fd_.get(), static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) {  // no data after pos: the rest is a hole
        out.push_back({pos, end - pos, ExtentKind::kHole});
        break;
      }
      if (errno == EINVAL || errno == EOPNOTSUPP) {  // no SEEK_DATA: all data
        out.push_back({pos, end - pos, ExtentKind::kData});
        break;
      }
      return Error::FromErrno(errno, "lseek(SEEK_DATA)", path_, pos, end - pos);
    }
    uint64_t data_start = std::min<uint64_t>(static_cast<uint64_t>(data), end);
    if (data_start > pos) out.push_back({pos, data_start - pos, ExtentKind::kHole});
    if (data_start >= end) break;
    off_t hole = ::lseek(fd_.get(), static_cast<off_t>(data_start), SEEK_HOLE);
    if (hole < 0) return Error::FromErrno(errno, "lseek(SEEK_HOLE)", path_, data_start, 0);
    uint64_t data_end = std::min<uint64_t>(static_cast<uint64_t>(hole), end);
    out.push_back({data_start, data_end - data_start, ExtentKind::kData});
    pos = data_end;
  }
  return MergeAdjacent(std::move(out));
}

FileSink::FileSink(std::string path, Fd fd, FileInfo info, bool zero_initialized)
    : path_(std::move(path)), fd_(std::move(fd)), info_(info),
      zero_initialized_(zero_initialized), size_bytes_(info.size_bytes),
      write_behind_(info.write_behind && !info.direct) {}

namespace {
// How far completed writes may run ahead of the range write-behind waits
// for and drops: enough to keep the device busy, small enough that a copy
// never fills the page cache.
constexpr uint64_t kWriteBehindBytes = 16ull << 20;
}  // namespace

void FileSink::WroteRange(uint64_t offset, uint64_t length) {
  if (!write_behind_ || length == 0) return;
  // Errors are not reported here: Flush's fsync reports a failed writeback.
  ::sync_file_range(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length),
                    SYNC_FILE_RANGE_WRITE);
  std::pair<uint64_t, uint64_t> oldest{0, 0};
  {
    std::lock_guard lock(behind_mu_);
    behind_.emplace_back(offset, length);
    behind_bytes_ += length;
    if (behind_bytes_ <= kWriteBehindBytes) return;
    oldest = behind_.front();
    behind_.pop_front();
    behind_bytes_ -= oldest.second;
  }
  ::sync_file_range(fd_.get(), static_cast<off_t>(oldest.first), static_cast<off_t>(oldest.second),
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
  ::posix_fadvise(fd_.get(), static_cast<off_t>(oldest.first), static_cast<off_t>(oldest.second),
                  POSIX_FADV_DONTNEED);
}

void FileSource::WillNeed(uint64_t offset, uint64_t length) {
  if (length == 0 || offset >= info_.size_bytes) return;
  length = std::min(length, info_.size_bytes - offset);
  ::posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_WILLNEED);
}

void FileSource::DontNeed(uint64_t offset, uint64_t length) {
  // Dirty pages cannot be dropped: write them back first (another writer's,
  // e.g. a disk image just generated). A hint: failures are ignored.
  if (::fdatasync(fd_.get()) != 0) return;
  ::posix_fadvise(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_DONTNEED);
}

uint64_t FileSink::size_bytes() const { return size_bytes_.load(); }

SinkCapabilities FileSink::capabilities() const {
  SinkCapabilities caps;
  caps.can_zero = true;
  caps.can_trim = true;
  caps.zero_initialized = zero_initialized_;
  caps.can_grow = !info_.is_block_device;
  caps.preferred_request_bytes = 1 << 20;
  caps.alignment_bytes = info_.direct ? info_.logical_block_bytes : 1;
  return caps;
}

void FileSink::Grow(uint64_t end) {
  uint64_t cur = size_bytes_.load();
  while (end > cur && !size_bytes_.compare_exchange_weak(cur, end)) {
  }
}

Status FileSink::WriteAt(uint64_t offset, std::span<const std::byte> data) {
  if (info_.is_block_device && offset + data.size() > info_.size_bytes) {
    return Error::NoSpace("write beyond end of device").set_path(path_).set_range(offset,
                                                                                  data.size());
  }
  BARGE_RETURN_IF_ERROR(internal::PwriteFull(fd_.get(), path_, offset, data));
  Grow(offset + data.size());
  WroteRange(offset, data.size());
  return OkStatus();
}

Status FileSink::WriteZeroes(uint64_t offset, uint64_t length) {
  if (length == 0) return OkStatus();
  if (info_.is_block_device) {
    uint64_t range[2] = {offset, length};
    if (::ioctl(fd_.get(), BLKZEROOUT, range) == 0) return OkStatus();
    return BlockSink::WriteZeroes(offset, length);
  }
  // Punching a hole keeps the file sparse; past EOF, extend the size.
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(length)) == 0) {
    uint64_t end = offset + length;
    if (end > size_bytes_.load()) {
      if (::ftruncate(fd_.get(), static_cast<off_t>(end)) != 0) {
        return Error::FromErrno(errno, "ftruncate", path_, end, 0);
      }
      Grow(end);
    }
    return OkStatus();
  }
  if (errno != EOPNOTSUPP && errno != ENOSYS && errno != EINVAL) {
    return Error::FromErrno(errno, "fallocate(PUNCH_HOLE)", path_, offset, length);
  }
  BARGE_RETURN_IF_ERROR(BlockSink::WriteZeroes(offset, length));
  return OkStatus();
}

Status FileSink::Trim(uint64_t offset, uint64_t length) {
  if (info_.is_block_device) {
    uint64_t range[2] = {offset, length};
    if (::ioctl(fd_.get(), BLKDISCARD, range) != 0) {
      return Error::FromErrno(errno, "ioctl(BLKDISCARD)", path_, offset, length);
    }
    return OkStatus();
  }
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(offset), static_cast<off_t>(length)) != 0) {
    return Error::FromErrno(errno, "fallocate(PUNCH_HOLE)", path_, offset, length);
  }
  return OkStatus();
}

Status FileSink::Flush() {
  if (info_.sync && ::fdatasync(fd_.get()) != 0) return Error::FromErrno(errno, "fdatasync", path_);
  return OkStatus();
}

Status FileSink::Truncate(uint64_t size) {
  if (info_.is_block_device) return BlockSink::Truncate(size);
  if (::ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) {
    return Error::FromErrno(errno, "ftruncate", path_, size, 0);
  }
  size_bytes_.store(size);
  return OkStatus();
}

bool IsBlockDevice(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISBLK(st.st_mode);
}

Result<std::unique_ptr<BlockSource>> OpenFileSource(const std::string& path,
                                                    const FileOptions& options) {
  int flags = O_RDONLY | (options.direct ? O_DIRECT : 0) | (options.no_follow ? O_NOFOLLOW : 0);
  // Non-blocking, so that a FIFO planted under the name cannot hold the
  // open until a writer comes; cleared once the file is known regular.
  if (options.regular_only) flags |= O_NONBLOCK;
  BARGE_ASSIGN_OR_RETURN(Fd fd, internal::OpenFd(path, flags, 0));
  if (options.regular_only) BARGE_RETURN_IF_ERROR(internal::RequireRegular(fd, path));
  BARGE_ASSIGN_OR_RETURN(FileInfo info, internal::StatFd(fd, path));
  info.direct = options.direct;
  if (internal::UringWanted(options)) {
    auto uring = internal::MakeUringSource(path, fd, info);
    // No ring (old kernel, seccomp, memlock): fall back to pread.
    if (uring.ok()) return std::move(uring).value();
  }
  return std::unique_ptr<BlockSource>(new FileSource(path, std::move(fd), info));
}

Result<std::unique_ptr<BlockSink>> OpenFileSink(const std::string& path, SinkMode mode,
                                                const FileOptions& options) {
  int flags = O_RDWR | (options.direct ? O_DIRECT : 0) | (options.no_follow ? O_NOFOLLOW : 0) |
              (options.regular_only ? O_NONBLOCK : 0);
  switch (mode) {
    case SinkMode::kCreateNew: flags |= O_CREAT | O_EXCL; break;
    case SinkMode::kTruncate: flags |= O_CREAT; break;
    case SinkMode::kExisting: break;
  }
  const mode_t create_mode = static_cast<mode_t>(options.create_mode & 07777);
  auto opened = internal::OpenFd(path, flags, create_mode);
  if (!opened.ok() && mode == SinkMode::kExisting && opened.error().errno_value() == EACCES) {
    // Writable but not readable (a kernel control file such as
    // /proc/self/clear_refs): a sink never reads, so write-only will do.
    opened = internal::OpenFd(path, (flags & ~O_RDWR) | O_WRONLY, create_mode);
  }
  if (!opened.ok()) return std::move(opened).error();
  Fd fd = std::move(opened).value();
  if (options.regular_only) BARGE_RETURN_IF_ERROR(internal::RequireRegular(fd, path));
  BARGE_ASSIGN_OR_RETURN(FileInfo info, internal::StatFd(fd, path));
  info.direct = options.direct;
  info.write_behind = options.write_behind;
  info.sync = options.sync;
  bool zero_initialized = false;
  if (mode != SinkMode::kExisting && !info.is_block_device) {
    if (::ftruncate(fd.get(), 0) != 0) return Error::FromErrno(errno, "ftruncate", path);
    info.size_bytes = 0;
    zero_initialized = true;
  }
  return std::unique_ptr<BlockSink>(new FileSink(path, std::move(fd), info, zero_initialized));
}

}  // namespace barge
