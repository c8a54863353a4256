// Shared pieces of the file backends (sync and io_uring). Not a public header.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "blockio/fd.h"
#include "blockio/file.h"

namespace barge {
namespace internal {

using Fd = ::barge::Fd;  // blockio/fd.h

struct FileInfo {
  uint64_t size_bytes = 0;
  bool is_block_device = false;
  bool direct = false;
  uint32_t logical_block_bytes = 512;
  bool write_behind = false;
  bool sync = true;
};

Result<Fd> OpenFd(const std::string& path, int flags, mode_t mode);
Result<FileInfo> StatFd(const Fd& fd, const std::string& path);
// kInvalidArgument unless `fd` is a regular file; clears O_NONBLOCK.
Status RequireRegular(const Fd& fd, const std::string& path);
Status PreadFull(int fd, const std::string& path, uint64_t offset, std::span<std::byte> out);
Status PwriteFull(int fd, const std::string& path, uint64_t offset,
                  std::span<const std::byte> data);

// The io_uring source (uring.cc; writes have none, see there). It fails when
// no ring can be created; the caller then uses the synchronous class below.
// `fd` is moved from only on success.
Result<std::unique_ptr<BlockSource>> MakeUringSource(const std::string& path, Fd& fd,
                                                     const FileInfo& info);
// Ring sizing. Defaults suit production; tests shrink them to force several
// rounds per batch and resubmission of partial transfers.
struct UringTuning {
  // Entries per ring: requests one thread keeps in flight at once.
  unsigned queue_depth = 64;
  // Largest transfer one SQE asks for. The kernel caps a read or write just
  // under 2 GiB (MAX_RW_COUNT) and reports it in an int; longer requests are
  // served as a chain of partial transfers, like any short read.
  uint64_t max_sqe_bytes = uint64_t{1} << 30;
};
Result<std::unique_ptr<BlockSource>> MakeUringSource(const std::string& path, Fd& fd,
                                                     const FileInfo& info,
                                                     const UringTuning& tuning);
// True when the source came from MakeUringSource (for tests that must know
// which path they exercise).
bool IsUringBacked(const BlockSource& source);

// False when the caller or the environment turned io_uring off: see file.cc.
bool UringWanted(const FileOptions& options);

}  // namespace internal

// pread-based source. Thread-safe.
class FileSource : public BlockSource {
 public:
  FileSource(std::string path, internal::Fd fd, internal::FileInfo info);
  const std::string& name() const override { return path_; }
  uint64_t size_bytes() const override { return info_.size_bytes; }
  SourceCapabilities capabilities() const override;
  Status ReadAt(uint64_t offset, std::span<std::byte> out) override;
  void WillNeed(uint64_t offset, uint64_t length) override;
  void DontNeed(uint64_t offset, uint64_t length) override;
  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override;

 protected:
  int fd() const { return fd_.get(); }
  std::string path_;
  internal::Fd fd_;
  internal::FileInfo info_;
};

// pwrite-based sink. Thread-safe for disjoint ranges.
class FileSink : public BlockSink {
 public:
  FileSink(std::string path, internal::Fd fd, internal::FileInfo info, bool zero_initialized);
  const std::string& name() const override { return path_; }
  uint64_t size_bytes() const override;
  SinkCapabilities capabilities() const override;
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override;
  Status WriteZeroes(uint64_t offset, uint64_t length) override;
  Status Trim(uint64_t offset, uint64_t length) override;
  Status Flush() override;
  Status Truncate(uint64_t size_bytes) override;

 protected:
  void Grow(uint64_t end);
  // Called after each successful write of [offset, offset+length): starts
  // its writeback at once and, once more than kWriteBehindBytes are in
  // flight behind it, waits for the oldest range and drops its pages
  // (see FileOptions::write_behind).
  void WroteRange(uint64_t offset, uint64_t length);
  int fd() const { return fd_.get(); }
  std::string path_;
  internal::Fd fd_;
  internal::FileInfo info_;
  bool zero_initialized_;
  std::atomic<uint64_t> size_bytes_;
  bool write_behind_ = false;
  std::mutex behind_mu_;
  std::deque<std::pair<uint64_t, uint64_t>> behind_;  // guarded by behind_mu_
  uint64_t behind_bytes_ = 0;                         // guarded by behind_mu_
};

}  // namespace barge
