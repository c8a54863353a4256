// FileAccess: exact modes and groups for backup folders and restored files.
#include "pipeline/file_access.h"

#include <grp.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>

#include "blockio/path.h"

namespace barge::pipeline {

FileAccess FileAccess::OfFolder(const FileStat& dir) {
  FileAccess a;
  a.dir_mode = dir.mode & 07777;
  a.file_mode = 0600 | (dir.mode & 0040) | (dir.mode & 0004);
  // A setgid folder's files are its group's (the kernel gives them the
  // group; ApplyAccess restores it on a file made before). Elsewhere a file
  // keeps its maker's group, as everywhere in Unix: a user writing into
  // /tmp cannot give a file to root's group.
  if ((dir.mode & 02040) == 02040) a.gid = dir.gid;
  return a;
}

Result<uint32_t> LookupGroup(const std::string& name) {
  if (name.empty()) return Error::InvalidArgument("empty group name");
  uint32_t gid = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), gid);
  if (ec == std::errc() && end == name.data() + name.size()) return gid;
  std::vector<char> buf(16384);
  struct group g;
  struct group* found = nullptr;
  int err = 0;
  while ((err = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found)) == ERANGE && buf.size() < (1u << 24)) {
    buf.resize(buf.size() * 2);
  }
  if (err != 0) return Error::FromErrno(err, "look up group", name);
  if (found == nullptr) return Error::NotFound("no such group: " + name);
  return static_cast<uint32_t>(found->gr_gid);
}

Result<FileAccess> AccessForGroup(const std::string& group_name) {
  if (group_name.empty()) return FileAccess::Private();
  BARGE_ASSIGN_OR_RETURN(uint32_t gid, LookupGroup(group_name));
  return FileAccess::Group(gid);
}

Result<FileAccess> FolderAccess(Env& env, const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(dir));
  return FileAccess::OfFolder(st);
}

Result<std::vector<std::string>> CreateFolders(Env& env, const std::string& dir, const FileAccess& access) {
  std::vector<std::string> missing;  // deepest first
  for (std::string d = dir; !d.empty() && d != "/" && d != "."; d = DirName(d)) {
    auto st = env.Stat(d);
    if (st.ok()) break;
    if (st.error().code() != ErrorCode::kNotFound) return st.error();
    missing.push_back(d);
    if (DirName(d) == d) break;
  }
  std::vector<std::string> made;
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    BARGE_RETURN_IF_ERROR(env.CreateDir(*it, access.dir_mode & 0777));
    made.push_back(*it);
    // The umask narrows mkdir's mode, and mkdir never sets setgid.
    BARGE_RETURN_IF_ERROR(ApplyAccess(env, *it, access, /*is_dir=*/true));
  }
  return made;
}

Status ApplyAccess(Env& env, const std::string& path, const FileAccess& access, bool is_dir) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.StatNoFollow(path));
  if (is_dir ? !st.is_directory() : !st.is_regular()) return OkStatus();  // never through a link
  // The group first: chown(2) may clear a setgid bit that chmod then sets.
  if (access.gid && st.gid != *access.gid) {
    BARGE_RETURN_IF_ERROR(env.SetOwner(path, static_cast<uint32_t>(-1), *access.gid));
  }
  const uint32_t mode = is_dir ? access.dir_mode : access.file_mode;
  if ((st.mode & 07777) != mode || (access.gid && st.gid != *access.gid)) {
    BARGE_RETURN_IF_ERROR(env.SetMode(path, mode));
  }
  return OkStatus();
}

Status ShareFolder(Env& env, const std::string& dir, const FileAccess& access) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(dir));
  if ((st.mode & 07777) == access.dir_mode && (!access.gid || st.gid == *access.gid)) return OkStatus();
  BARGE_RETURN_IF_ERROR(ApplyAccess(env, dir, access, /*is_dir=*/true));
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) BARGE_RETURN_IF_ERROR(ApplyAccess(env, JoinPath(dir, name), access));
  return OkStatus();
}

Status WriteFileWithAccess(Env& env, const std::string& path, std::span<const std::byte> bytes,
                           const FileAccess& access) {
  BARGE_RETURN_IF_ERROR(env.WriteFileAtomic(path, bytes, /*sync=*/true, access.file_mode));
  return ApplyAccess(env, path, access);
}

Status WriteFileWithAccess(Env& env, const std::string& path, std::string_view text, const FileAccess& access) {
  return WriteFileWithAccess(env, path, std::as_bytes(std::span(text.data(), text.size())), access);
}

Status WriteFileLikeFolder(Env& env, const std::string& path, std::span<const std::byte> bytes) {
  BARGE_ASSIGN_OR_RETURN(FileAccess access, FolderAccess(env, DirName(path)));
  return WriteFileWithAccess(env, path, bytes, access);
}

Status WriteFileLikeFolder(Env& env, const std::string& path, std::string_view text) {
  return WriteFileLikeFolder(env, path, std::as_bytes(std::span(text.data(), text.size())));
}

}  // namespace barge::pipeline
