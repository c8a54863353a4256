// barge files: list and copy files of a point's filesystem without
// restoring the disk. The point is served verified (barge's nbdkit plugin),
// exposed as a file by nbdfuse, and read by e2fsprogs' debugfs: maintained
// readers, no filesystem parser of barge's own. docs/export.md, "Files".
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "formats/manifest.h"
#include "formats/units.h"

namespace barge::pipeline {

struct FilesRequest {
  std::string chain;  // chain folder, or one of its manifests or images (LocatePoint)
  std::string at;     // "", "latest", id, position or time
  // 0: the filesystem fills the disk; N: it is in partition N of the
  // disk's MBR or GPT table (nbdkit's partition filter).
  uint32_t partition = 0;
};

struct FileEntry {
  std::string name;  // its bytes as stored: any but '/' and NUL
  uint64_t inode = 0;
  uint32_t mode = 0;  // st_mode bits (type and permissions)
  uint64_t size_bytes = 0;
  std::optional<formats::Timestamp> mtime;  // none where debugfs showed none
  std::string link_target;                  // symbolic links: where they point
  bool is_directory() const { return (mode & 0170000) == 0040000; }
  bool is_regular() const { return (mode & 0170000) == 0100000; }
  bool is_symlink() const { return (mode & 0170000) == 0120000; }
};

struct FilesPoint {
  formats::BackupManifest manifest;
  size_t position = 0;
};

struct FilesListing {
  FilesPoint point;
  std::vector<FileEntry> entries;  // as debugfs lists them ("." and ".." left out)
};

// The entries of folder `path` (absolute, in the point's filesystem; any
// name: the path is walked one entry at a time by inode number, symbolic
// links followed inside the point's filesystem). Every entry is listed
// whatever its name's bytes, with its time and, for a link, its target.
// Returns: the listing; kNotFound (no such path), kInvalidArgument (not a
// folder, a loop of links), kIoError (debugfs's output unreadable: never
// a shorter list), kNotSupported (no ext2/3/4
// filesystem there), kIoError (a read failed: a damaged cluster fails
// with EIO, and nbdkit's log on stderr names it), and the point's own
// errors (kCorruption, kBusy, ... as for barge export).
Result<FilesListing> ListFiles(Env& env, const FilesRequest& request, const std::string& path);

struct FileCopy {
  FilesPoint point;
  std::string destination;  // the file written ("" for a stream)
  uint64_t size_bytes = 0;
};

// Copies regular file `path` of the point's filesystem (any name; a final
// symbolic link is followed) to `dest`: a new file, or an existing folder
// to put it in under its own name (an existing file is kInvalidArgument).
// Written under a temporary name beside it and renamed when complete;
// runs of zero blocks become holes, so a sparse file stays sparse. Errors
// as ListFiles, and kInvalidArgument for a path that is no regular file.
Result<FileCopy> GetFile(Env& env, const FilesRequest& request, const std::string& path, const std::string& dest);

// GetFile onto `out` (barge's stdout): the file is read whole into the
// private temporary folder first, its size checked, then written to `out`,
// so nothing reaches `out` from a copy that fails. kIoError when `out`
// fails.
Result<FileCopy> GetFileToStream(Env& env, const FilesRequest& request, const std::string& path, std::ostream& out);

}  // namespace barge::pipeline
