// Regular files and block devices as sources and sinks. Reads go through
// io_uring when a ring can be set up, else pread; writes use pwrite (see
// uring.cc for why).
#pragma once

#include <memory>
#include <string>

#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

struct FileOptions {
  // Sources: try io_uring first; fall back to pread when it is unavailable.
  // BARGE_NO_URING=1 in the environment forces the fallback process-wide.
  bool use_uring = true;
  // O_DIRECT (alignment then comes from the device's logical block size).
  bool direct = false;
  // Sinks: write-behind for streaming output. Each write's writeback starts
  // at once (sync_file_range); a range more than 16 MiB behind the newest
  // is waited for and its pages dropped (POSIX_FADV_DONTNEED). A long copy
  // then neither fills the page cache with pages nobody will read soon nor
  // keeps taking fresh ones, the way nbdcopy writes files. Ignored with
  // `direct`.
  bool write_behind = true;
  // Sinks: false makes Flush return without fdatasync. The caller gives up
  // durability on a crash for speed, as qemu-img convert (cache=unsafe by
  // default) and nbdcopy do; the data is still written.
  bool sync = true;
};

enum class SinkMode : uint8_t {
  kCreateNew,  // O_CREAT|O_EXCL: fail if the path exists
  kTruncate,   // O_CREAT|O_TRUNC: replace a regular file's contents
  kExisting,   // open an existing file or block device as is
};

// Opens a regular file or block device for reading. Extents come from
// SEEK_DATA/SEEK_HOLE on files (holes are kHole); devices report all data.
Result<std::unique_ptr<BlockSource>> OpenFileSource(const std::string& path,
                                                    const FileOptions& options = {});

// Opens a regular file or block device for writing.
Result<std::unique_ptr<BlockSink>> OpenFileSink(const std::string& path, SinkMode mode,
                                                const FileOptions& options = {});

// True when `path` names a block device.
bool IsBlockDevice(const std::string& path);

}  // namespace barge
