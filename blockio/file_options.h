// How a file or block device is opened as a source or sink (shared by the
// file backends, blockio/file.h, and the filesystem seam, blockio/env.h).
#pragma once

#include <cstdint>

namespace barge {

struct FileOptions {
  // Sources: try io_uring first; fall back to pread when it is unavailable.
  // SetUringAllowed(false) (blockio/file.h) forces the fallback process-wide.
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
  // Sinks: the mode bits of a file the open creates (the umask applies).
  // Private files are created private rather than narrowed afterwards: a
  // reader that opened the file in between would keep its descriptor.
  uint32_t create_mode = 0644;
  // Sources, through the Env: a pipe (a FIFO, `<(command)`, /dev/stdin) is
  // read to its end at open, at most this many bytes, and served from
  // memory. 0 refuses pipes (a disk never is one); Env::ReadFile sets it.
  uint64_t pipe_limit = 0;
  // Refuse a symbolic link as the final component (O_NOFOLLOW): for files
  // in folders barge owns (chain folders), where a planted link must not
  // lead a write or a read elsewhere.
  bool no_follow = false;
  // Refuse anything but a regular file (a FIFO, socket or device named
  // like a chain file). The open itself never blocks on a FIFO.
  bool regular_only = false;
};

enum class SinkMode : uint8_t {
  kCreateNew,  // O_CREAT|O_EXCL: fail if the path exists
  kTruncate,   // O_CREAT|O_TRUNC: replace a regular file's contents
  kExisting,   // open an existing file or block device as is
};

}  // namespace barge
