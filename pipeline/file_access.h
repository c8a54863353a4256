// Who may read what barge writes into backup folders (chain folders) and
// the files it restores: the owner alone by default, or also one group.
// Modes are exact, whatever the umask: files are created with their final
// mode and fixed up where the umask narrowed a requested group bit
// (docs/security.md, "Backups are private").
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"

namespace barge::pipeline {

struct FileAccess {
  uint32_t dir_mode = 0700;
  uint32_t file_mode = 0600;
  // The group owning the folders and files; none: the creating process's.
  std::optional<uint32_t> gid;

  // Owner only: folders 0700, files 0600.
  static FileAccess Private() { return {}; }
  // Owner and group `gid` (read only): folders 02750 (setgid, so that what
  // is made in them is the group's too), files 0640.
  static FileAccess Group(uint32_t gid) { return {02750, 0640, gid}; }
  // What a folder's own mode grants: its files get owner read/write plus
  // read for the group and others its folder lets read, and the folder's
  // group when the folder is setgid and its group may read. A chain keeps
  // the access it was made with: a later point of a chain made with a
  // group is the group's too.
  static FileAccess OfFolder(const FileStat& dir);
};

// A group's id from its name (or a number). kNotFound when no such group.
Result<uint32_t> LookupGroup(const std::string& name);
// FileAccess::Group(LookupGroup(name)), or Private() for "".
Result<FileAccess> AccessForGroup(const std::string& group_name);

// The access of the files in `dir` (FileAccess::OfFolder of its stat).
Result<FileAccess> FolderAccess(Env& env, const std::string& dir);

// mkdir -p: every missing folder of `dir`, parents first, made with
// access.dir_mode (exact) and group. Folders that exist are left alone.
// Returns the folders made, parent first.
Result<std::vector<std::string>> CreateFolders(Env& env, const std::string& dir, const FileAccess& access);

// Brings one file (or, with `is_dir`, a folder) to `access` exactly: its
// group (when access.gid), then its mode. Looks before changing, so a file
// already right costs one lstat. A symbolic link is never followed (left
// alone).
Status ApplyAccess(Env& env, const std::string& path, const FileAccess& access, bool is_dir = false);

// Gives the chain folder `dir` (and its regular files) `access` when its
// own differs: `--group` on a chain made without one shares it from now on.
Status ShareFolder(Env& env, const std::string& dir, const FileAccess& access);

// Env::WriteFileAtomic with the file mode and group of `access`.
Status WriteFileWithAccess(Env& env, const std::string& path, std::string_view text, const FileAccess& access);
Status WriteFileWithAccess(Env& env, const std::string& path, std::span<const std::byte> bytes,
                           const FileAccess& access);

// WriteFileWithAccess with the access of the file's folder
// (FolderAccess): for the small files of a chain folder.
Status WriteFileLikeFolder(Env& env, const std::string& path, std::span<const std::byte> bytes);
Status WriteFileLikeFolder(Env& env, const std::string& path, std::string_view text);

}  // namespace barge::pipeline
