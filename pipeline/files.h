// barge files: list and copy files of a point's filesystem without
// restoring the disk. The point is served verified (barge's nbdkit plugin),
// exposed as a file by nbdfuse, and read by e2fsprogs' debugfs: maintained
// readers, no filesystem parser of barge's own. docs/export.md, "Files".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/manifest.h"

namespace barge::pipeline {

struct FilesRequest {
  std::string chain;  // chain folder, or one of its manifests or images (LocatePoint)
  std::string at;     // "", "latest", id, position or time
  // 0: the filesystem fills the disk; N: it is in partition N of the
  // disk's MBR or GPT table (nbdkit's partition filter).
  uint32_t partition = 0;
};

struct FileEntry {
  std::string name;
  uint64_t inode = 0;
  uint32_t mode = 0;  // st_mode bits (type and permissions)
  uint64_t size_bytes = 0;
  bool is_directory() const { return (mode & 0170000) == 0040000; }
  bool is_regular() const { return (mode & 0170000) == 0100000; }
};

struct FilesPoint {
  formats::BackupManifest manifest;
  size_t position = 0;
};

struct FilesListing {
  FilesPoint point;
  std::vector<FileEntry> entries;  // as debugfs lists them ("." and ".." left out)
};

// The entries of folder `path` (absolute, in the point's filesystem).
// Returns: the listing; kNotFound (no such path), kInvalidArgument (not a
// folder, a path debugfs cannot take), kNotSupported (no ext2/3/4
// filesystem there), kIoError (a read failed: a damaged cluster fails
// with EIO, and nbdkit's log on stderr names it), and the point's own
// errors (kCorruption, kBusy, ... as for barge export).
Result<FilesListing> ListFiles(Env& env, const FilesRequest& request, const std::string& path);

struct FileCopy {
  FilesPoint point;
  uint64_t size_bytes = 0;
};

// Copies regular file `path` of the point's filesystem to `dest` (a new
// file: an existing one is kInvalidArgument), written under a temporary
// name beside it and renamed when complete. Errors as ListFiles, and
// kInvalidArgument for a path that is no regular file.
Result<FileCopy> GetFile(Env& env, const FilesRequest& request, const std::string& path, const std::string& dest);

}  // namespace barge::pipeline
