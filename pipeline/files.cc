// barge files: nbdfuse over barge's verified nbdkit plugin, read by debugfs
// (given inode numbers only; its output read by pipeline/debugfs_output.h).
#include "pipeline/files.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <sstream>
#include <thread>

#include "blockio/leftovers.h"
#include "blockio/path.h"
#include "pipeline/chain.h"
#include "pipeline/chain_files.h"
#include "pipeline/child_process.h"
#include "pipeline/debugfs_output.h"
#include "pipeline/export.h"
#include "pipeline/point_reader.h"

namespace barge::pipeline {

namespace {

constexpr uint64_t kRootInode = 2;  // ext2/3/4's root folder
constexpr int kMaxLinks = 40;       // as Linux's path walk (ELOOP)
constexpr size_t kStatsPerRun = 4096;

Status CheckFsPath(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return Error::InvalidArgument("a path in the point's filesystem starts with / (got '" + path + "')");
  }
  return OkStatus();
}

// The names of `path`'s components, empty ones left out.
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> names;
  size_t start = 0;
  for (size_t slash; start <= path.size(); start = slash + 1) {
    slash = path.find('/', start);
    if (slash == std::string::npos) slash = path.size();
    if (slash > start) names.push_back(path.substr(start, slash - start));
  }
  return names;
}

// The point served verified, exposed as DIR/mnt/disk by nbdfuse, for
// debugfs. Unmounted (nbdfuse stopped by PID) and DIR removed at the end.
class MountedPoint {
 public:
  static Result<std::unique_ptr<MountedPoint>> Mount(Env& env, const FilesRequest& req) {
    BARGE_ASSIGN_OR_RETURN(PointLocation where, LocatePoint(env, req.chain, req.at));
    std::unique_ptr<MountedPoint> m(new MountedPoint(env));
    BARGE_ASSIGN_OR_RETURN(m->reader_, PointReader::Open(env, where.chain_dir, where.at));
    m->point_.manifest = m->reader_->manifest();
    m->point_.position = m->reader_->position();
    m->partition_ = req.partition;
    BARGE_ASSIGN_OR_RETURN(std::string plugin, FindExportPlugin(env));
    // A fresh private folder (mkdtemp: 0700, ours): a name someone planted
    // in the shared temporary folder, or links in it named like our logs,
    // are never used.
    BARGE_ASSIGN_OR_RETURN(m->dir_, env.CreateTempDir(TemporaryRoot(), ".barge-files-" + std::to_string(::getpid()) + "-"));
    m->created_ = true;
    BARGE_RETURN_IF_ERROR(env.CreateDir(JoinPath(m->dir_, "mnt"), 0700));
    std::vector<std::string> args = {"nbdfuse", "-r", m->disk(), "--command", "nbdkit", "-s",
                                     "--exit-with-parent", "-r"};
    if (req.partition != 0) args.push_back("--filter=partition");
    args.insert(args.end(), {plugin, "chain=" + AbsolutePath(where.chain_dir), "at=" + m->point_.manifest.id});
    // Every KEY=VALUE, the filter's too, follows the plugin.
    if (req.partition != 0) args.push_back("partition=" + std::to_string(req.partition));
    if (AllowOtherOwner()) args.push_back("allow-other-owner=1");  // as this process was told
    // Its log (and nbdkit's, which it runs) goes to a file: read back into
    // an error that needs it, not printed on every stop.
    SpawnOptions o;
    o.stdout_path = JoinPath(m->dir_, "nbdfuse.out");
    o.stderr_path = m->log();
    BARGE_RETURN_IF_ERROR(m->nbdfuse_.Spawn(args, o, "libnbd-bin (nbdfuse)"));
    // The file shows once FUSE has mounted it.
    for (int i = 0; i < 1500; ++i) {
      int status = 0;
      if (m->nbdfuse_.Exited(&status)) {
        return Error::IoError("nbdfuse " + DescribeWaitStatus(status) + " before showing the disk (FUSE needs /dev/fuse)" +
                              m->LogLine("error: ") + m->LogLine("nbdfuse"))
            .set_path("nbdfuse");
      }
      if (auto st = env.Stat(m->disk()); st.ok() && st->is_regular()) return m;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return Error::IoError("nbdfuse did not show the disk within 30 s").set_path("nbdfuse");
  }

  ~MountedPoint() {
    // SIGTERM ends nbdfuse's loop, which unmounts; then the folder goes.
    nbdfuse_.Stop();
    if (created_) IgnoreError(env_.RemoveTree(dir_), "a leftover folder in the temporary folder is harmless");
  }

  const FilesPoint& point() const { return point_; }
  std::string log() const { return JoinPath(dir_, "nbdfuse.log"); }
  // ": LINE" for the last line of nbdfuse's (and nbdkit's) log holding
  // `needle` ("" for any), or "".
  std::string LogLine(const std::string& needle) {
    auto text = env_.ReadFile(log());
    if (!text.ok()) return "";
    std::istringstream lines(*text);
    std::string found;
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.find(needle) != std::string::npos) found = line;
    }
    return found.empty() ? "" : ": " + found;
  }
  std::string disk() const { return JoinPath(dir_, "mnt/disk"); }

  const std::string& dir() const { return dir_; }

  // Runs `debugfs -R REQUEST DISK`; its stdout. Its stderr (beyond the
  // version banner) is the error, classified for `path`. Requests name
  // inodes (<N>), never paths: nothing in a name needs quoting.
  Result<std::string> Debugfs(const std::string& request, const std::string& path) {
    return Run({"-R", request}, path, "");
  }
  // `debugfs -f FILE DISK` for the requests in `requests` (one a line).
  Result<std::string> DebugfsBatch(const std::string& requests, const std::string& path) {
    const std::string file = JoinPath(dir_, "debugfs.in");
    BARGE_RETURN_IF_ERROR(env_.WriteFileAtomic(file, requests, false, 0600));
    return Run({"-f", file}, path, "");
  }
  // `debugfs -R REQUEST DISK` with its stdout written to `stdout_path`
  // (a file's bytes: `cat <N>`).
  Status DebugfsTo(const std::string& request, const std::string& path, const std::string& stdout_path) {
    auto r = Run({"-R", request}, path, stdout_path);
    if (!r.ok()) return r.error();
    return OkStatus();
  }

 private:
  Result<std::string> Run(const std::vector<std::string>& options, const std::string& path,
                          const std::string& stdout_path) {
    ChildProcess debugfs;
    SpawnOptions o;
    o.stdout_path = stdout_path.empty() ? JoinPath(dir_, "debugfs.out") : stdout_path;
    o.stderr_path = JoinPath(dir_, "debugfs.err");
    std::vector<std::string> args = {"debugfs"};
    args.insert(args.end(), options.begin(), options.end());
    args.push_back(disk());
    BARGE_RETURN_IF_ERROR(debugfs.Spawn(args, o, "e2fsprogs (debugfs)"));
    const int status = debugfs.Wait();
    std::string out;
    if (stdout_path.empty()) {
      BARGE_ASSIGN_OR_RETURN(out, env_.ReadFile(o.stdout_path, 256 << 20));
    }
    BARGE_ASSIGN_OR_RETURN(std::string err, env_.ReadFile(o.stderr_path));
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);) {
      while (!line.empty() && line.back() == ' ') line.pop_back();
      if (line.empty() || line.starts_with("debugfs 1.")) continue;
      if (line.starts_with("debugfs: ")) line = line.substr(9);
      if (line.find("File not found") != std::string::npos) {
        return Error::NotFound("no such file or folder in backup " + point_.manifest.id).set_path(path);
      }
      if (line.find("not a directory") != std::string::npos) {
        return Error::InvalidArgument("not a folder in backup " + point_.manifest.id).set_path(path);
      }
      if (line.find("Bad magic number") != std::string::npos || line.find("superblock") != std::string::npos ||
          line.find("Filesystem not open") != std::string::npos) {
        return Error::NotSupported(
                   "no ext2/3/4 filesystem " +
                   (partition_ != 0 ? "in partition " + std::to_string(partition_)
                                    : std::string("on the whole disk (a partitioned disk needs --partition N)")) +
                   " of backup " + point_.manifest.id + " (debugfs: " + line + ")")
            .set_path(path);
      }
      // A damaged cluster: nbdkit's log names the layer file and offset.
      std::string damaged = LogLine("Corruption");
      return Error::IoError("reading backup " + point_.manifest.id + " failed (debugfs: " + line + ")" +
                            (damaged.empty() ? "" : "; nbdkit" + damaged))
          .set_path(path);
    }
    if (ExitStatusOf(status) != 0) {
      return Error::IoError("debugfs " + DescribeWaitStatus(status)).set_path(path);
    }
    return out;
  }

  explicit MountedPoint(Env& env) : env_(env) {}
  Env& env_;
  std::unique_ptr<PointReader> reader_;  // checks done, export lock held
  FilesPoint point_;
  uint32_t partition_ = 0;
  std::string dir_;
  bool created_ = false;
  ChildProcess nbdfuse_;
};

// The entries of folder `inode` (listed by inode number), without their
// times and targets.
Result<std::vector<FileEntry>> ListInode(MountedPoint& m, uint64_t inode, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::string out, m.Debugfs("ls -p -r <" + std::to_string(inode) + ">", path));
  auto listed = ParseLsP(out);
  if (!listed.ok()) return Error(listed.error()).set_path(path);
  std::vector<FileEntry> entries;
  for (ListedEntry& l : *listed) {
    FileEntry e;
    e.name = std::move(l.name);
    e.inode = l.inode;
    e.mode = l.mode;
    e.size_bytes = l.size_bytes;
    entries.push_back(std::move(e));
  }
  return entries;
}

// A link's target whose bytes are in a data block: `cat <N>` prints them.
Result<std::string> SlowLinkTarget(Env& env, MountedPoint& m, const FileEntry& link, const std::string& path) {
  const std::string file = JoinPath(m.dir(), "link.out");
  BARGE_RETURN_IF_ERROR(m.DebugfsTo("cat <" + std::to_string(link.inode) + ">", path, file));
  return env.ReadFile(file, 1 << 20);
}

// Fills in the entries' times and link targets: `stat <N>` for each, a few
// thousand per debugfs run.
Status AddFacts(Env& env, MountedPoint& m, std::vector<FileEntry>& entries, const std::string& path) {
  for (size_t first = 0; first < entries.size(); first += kStatsPerRun) {
    const size_t last = std::min(entries.size(), first + kStatsPerRun);
    std::string requests;
    std::vector<uint64_t> inodes;
    for (size_t i = first; i < last; ++i) {
      requests += "stat <" + std::to_string(entries[i].inode) + ">\n";
      inodes.push_back(entries[i].inode);
    }
    BARGE_ASSIGN_OR_RETURN(std::string out, m.DebugfsBatch(requests, path));
    auto facts = ParseStats(out, inodes);
    if (!facts.ok()) return Error(facts.error()).set_path(path);
    for (size_t i = first; i < last; ++i) {
      FileEntry& e = entries[i];
      InodeFacts& f = (*facts)[i - first];
      e.mtime = f.mtime;
      if (!e.is_symlink()) continue;
      if (f.fast_link_target) {
        e.link_target = std::move(*f.fast_link_target);
      } else {
        BARGE_ASSIGN_OR_RETURN(e.link_target, SlowLinkTarget(env, m, e, path));
      }
    }
  }
  return OkStatus();
}

// The entry `path` names, walked from the root one name at a time (each
// folder listed by inode: no name is ever quoted for debugfs). Symbolic
// links on the way are followed inside the point's filesystem (an
// absolute target from its root), the final one too when `follow_final`.
Result<FileEntry> Lookup(Env& env, MountedPoint& m, const std::string& path, bool follow_final) {
  FileEntry root;
  root.name = "/";
  root.inode = kRootInode;
  root.mode = 0040755;
  std::vector<FileEntry> walked = {root};
  std::vector<std::string> todo = Components(path);
  std::reverse(todo.begin(), todo.end());  // the next name at the back
  int links = 0;
  while (!todo.empty()) {
    const std::string name = std::move(todo.back());
    todo.pop_back();
    if (name == ".") continue;
    if (name == "..") {
      if (walked.size() > 1) walked.pop_back();
      continue;
    }
    if (!walked.back().is_directory()) {
      return Error::InvalidArgument("not a folder in backup " + m.point().manifest.id + ": " + walked.back().name)
          .set_path(path);
    }
    BARGE_ASSIGN_OR_RETURN(std::vector<FileEntry> entries, ListInode(m, walked.back().inode, path));
    auto it = std::find_if(entries.begin(), entries.end(), [&](const FileEntry& e) { return e.name == name; });
    if (it == entries.end()) {
      return Error::NotFound("no such file or folder in backup " + m.point().manifest.id).set_path(path);
    }
    if (it->is_symlink() && (!todo.empty() || follow_final)) {
      if (++links > kMaxLinks) {
        return Error::InvalidArgument("more than " + std::to_string(kMaxLinks) + " symbolic links on the way")
            .set_path(path);
      }
      std::vector<FileEntry> link = {*it};
      BARGE_RETURN_IF_ERROR(AddFacts(env, m, link, path));
      if (link[0].link_target.empty()) {
        return Error::NotFound("an empty symbolic link in backup " + m.point().manifest.id).set_path(path);
      }
      if (link[0].link_target[0] == '/') walked.resize(1);
      std::vector<std::string> more = Components(link[0].link_target);
      todo.insert(todo.end(), more.rbegin(), more.rend());
      continue;
    }
    walked.push_back(std::move(*it));
  }
  return walked.back();
}

// Makes runs of zero blocks of the file at `file` holes (punched in place),
// so that a sparse file's copy is sparse again.
Status PunchZeroBlocks(Env& env, const std::string& file, uint64_t size_bytes) {
  constexpr uint64_t kBlock = 4096, kChunk = 1 << 20;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> in, env.OpenSource(file));
  FileOptions options;
  options.sync = false;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> out, env.OpenSink(file, SinkMode::kExisting, options));
  std::vector<std::byte> buffer(kChunk);
  uint64_t zero_start = 0, zero_bytes = 0;
  auto flush_zeros = [&]() -> Status {
    if (zero_bytes != 0) BARGE_RETURN_IF_ERROR(out->WriteZeroes(zero_start, zero_bytes));
    zero_bytes = 0;
    return OkStatus();
  };
  static const std::vector<std::byte> kZeros(kBlock);
  for (uint64_t offset = 0; offset < size_bytes; offset += kChunk) {
    const uint64_t n = std::min(kChunk, size_bytes - offset);
    BARGE_RETURN_IF_ERROR(in->ReadAt(offset, std::span(buffer).first(n)));
    for (uint64_t b = 0; b < n; b += kBlock) {
      const uint64_t len = std::min(kBlock, n - b);
      if (std::memcmp(buffer.data() + b, kZeros.data(), len) == 0) {
        if (zero_bytes == 0) zero_start = offset + b;
        zero_bytes += len;
      } else {
        BARGE_RETURN_IF_ERROR(flush_zeros());
      }
    }
  }
  return flush_zeros();
}

// The regular file `path` names (a final link followed), checked.
Result<FileEntry> LookupFile(Env& env, MountedPoint& m, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(FileEntry e, Lookup(env, m, path, true));
  if (e.is_directory()) {
    return Error::InvalidArgument("a folder, not a file, in backup " + m.point().manifest.id).set_path(path);
  }
  if (!e.is_regular()) {
    return Error::InvalidArgument("not a regular file in backup " + m.point().manifest.id).set_path(path);
  }
  return e;
}

// `cat <N>` of `file` into `temp`, its size checked against the listing.
Status Dump(Env& env, MountedPoint& m, const FileEntry& file, const std::string& path, const std::string& temp) {
  BARGE_RETURN_IF_ERROR(m.DebugfsTo("cat <" + std::to_string(file.inode) + ">", path, temp));
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(temp));
  if (st.size_bytes != file.size_bytes) {
    return Error::IoError("debugfs wrote " + std::to_string(st.size_bytes) + " bytes of " +
                          std::to_string(file.size_bytes))
        .set_path(path);
  }
  return OkStatus();
}

}  // namespace

Result<FilesListing> ListFiles(Env& env, const FilesRequest& req, const std::string& path) {
  BARGE_RETURN_IF_ERROR(CheckFsPath(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<MountedPoint> m, MountedPoint::Mount(env, req));
  FilesListing r;
  r.point = m->point();
  BARGE_ASSIGN_OR_RETURN(FileEntry folder, Lookup(env, *m, path, true));
  if (!folder.is_directory()) {
    return Error::InvalidArgument("not a folder in backup " + m->point().manifest.id).set_path(path);
  }
  BARGE_ASSIGN_OR_RETURN(r.entries, ListInode(*m, folder.inode, path));
  BARGE_RETURN_IF_ERROR(AddFacts(env, *m, r.entries, path));
  return r;
}

Result<FileCopy> GetFile(Env& env, const FilesRequest& req, const std::string& path, const std::string& dest) {
  BARGE_RETURN_IF_ERROR(CheckFsPath(path));
  // A folder takes the file under its own name (the path's last name).
  std::string target = dest;
  if (auto st = env.Stat(dest); st.ok() && st->is_directory()) {
    const std::vector<std::string> names = Components(path);
    if (names.empty() || names.back() == "." || names.back() == "..") {
      return Error::InvalidArgument("name the file to write: " + path + " has no name of its own").set_path(dest);
    }
    target = JoinPath(dest, names.back());
  }
  if (env.Exists(target)) return Error::InvalidArgument("the destination exists (remove it first)").set_path(target);
  // Its folder is checked first, so that an error names the user's path,
  // not the private folder made in it.
  if (auto folder = env.Stat(DirName(AbsolutePath(target))); !folder.ok() || !folder->is_directory()) {
    if (!folder.ok() && folder.error().code() != ErrorCode::kNotFound) return Error(folder.error()).set_path(dest);
    return Error::NotFound("the destination's folder does not exist").set_path(dest);
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<MountedPoint> m, MountedPoint::Mount(env, req));
  BARGE_ASSIGN_OR_RETURN(FileEntry file, LookupFile(env, *m, path));
  target = AbsolutePath(target);
  // debugfs's output goes to a fresh private folder beside the
  // destination (the same filesystem, for the rename), never to a name
  // someone could plant in a shared one.
  BARGE_ASSIGN_OR_RETURN(std::string temp_dir, env.CreateTempDir(DirName(target), ".barge-get-"));
  const std::string temp = JoinPath(temp_dir, "file");
  auto fail = [&](Error e) -> Error { return e.Also(env.RemoveTree(temp_dir)); };
  if (Status s = Dump(env, *m, file, path, temp); !s.ok()) return fail(Error(s.error()).set_path(dest));
  if (Status s = PunchZeroBlocks(env, temp, file.size_bytes); !s.ok()) return fail(s.error());
  if (Status s = env.Rename(temp, target); !s.ok()) return fail(s.error());
  IgnoreError(env.RemoveDir(temp_dir), "an empty hidden folder beside the file; the copy is in place");
  FileCopy r;
  r.point = m->point();
  r.destination = target == AbsolutePath(dest) ? dest : JoinPath(dest, BaseName(target));
  r.size_bytes = file.size_bytes;
  return r;
}

Result<FileCopy> GetFileToStream(Env& env, const FilesRequest& req, const std::string& path, std::ostream& out) {
  BARGE_RETURN_IF_ERROR(CheckFsPath(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<MountedPoint> m, MountedPoint::Mount(env, req));
  BARGE_ASSIGN_OR_RETURN(FileEntry file, LookupFile(env, *m, path));
  const std::string temp = JoinPath(m->dir(), "file");
  BARGE_RETURN_IF_ERROR(Dump(env, *m, file, path, temp));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> in, env.OpenSource(temp));
  std::vector<std::byte> buffer(1 << 20);
  for (uint64_t offset = 0; offset < file.size_bytes; offset += buffer.size()) {
    const uint64_t n = std::min<uint64_t>(buffer.size(), file.size_bytes - offset);
    BARGE_RETURN_IF_ERROR(in->ReadAt(offset, std::span(buffer).first(n)));
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(n));
    if (!out) return Error::FromErrno(errno, "writing the file to standard output", path);
  }
  out.flush();
  if (!out) return Error::FromErrno(errno, "writing the file to standard output", path);
  FileCopy r;
  r.point = m->point();
  r.size_bytes = file.size_bytes;
  return r;
}

}  // namespace barge::pipeline
