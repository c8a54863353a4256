// Regular files and block devices as sources and sinks. Reads go through
// io_uring when a ring can be set up, else pread; writes use pwrite (see
// uring.cc for why).
#pragma once

#include <memory>
#include <string>

#include "blockio/file_options.h"
#include "blockio/sink.h"
#include "blockio/source.h"

namespace barge {

// Opens a regular file or block device for reading. Extents come from
// SEEK_DATA/SEEK_HOLE on files (holes are kHole); devices report all data.
Result<std::unique_ptr<BlockSource>> OpenFileSource(const std::string& path,
                                                    const FileOptions& options = {});

// Opens a regular file or block device for writing.
Result<std::unique_ptr<BlockSink>> OpenFileSink(const std::string& path, SinkMode mode,
                                                const FileOptions& options = {});

// Process-wide: false makes every file opened from now on use pread and
// pwrite, whatever FileOptions::use_uring says (the program decides: the CLI
// sets it from BARGE_NO_URING=1, for hosts where io_uring misbehaves, e.g.
// seccomp profiles that let io_uring_setup succeed but fail operations).
// Library code never reads the environment. Safe from any thread.
void SetUringAllowed(bool allowed);

// True when `path` names a block device.
bool IsBlockDevice(const std::string& path);

}  // namespace barge
