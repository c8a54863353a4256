// barge files: nbdfuse over barge's verified nbdkit plugin, read by debugfs.
#include "pipeline/files.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <thread>

#include "blockio/leftovers.h"
#include "blockio/path.h"
#include "pipeline/chain.h"
#include "pipeline/chain_files.h"
#include "pipeline/child_process.h"
#include "pipeline/export.h"
#include "pipeline/point_reader.h"

namespace barge::pipeline {

namespace {

Status CheckFsPath(const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return Error::InvalidArgument("a path in the point's filesystem starts with / (got '" + path + "')");
  }
  if (path.find_first_of("\"\n") != std::string::npos) {
    return Error::InvalidArgument("a path with a double quote or a line break cannot be read with debugfs: " + path);
  }
  return OkStatus();
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

  // Runs `debugfs -R REQUEST DISK`; its stdout. Its stderr (beyond the
  // version banner) is the error, classified for `path`.
  Result<std::string> Debugfs(const std::string& request, const std::string& path) {
    ChildProcess debugfs;
    SpawnOptions o;
    o.stdout_path = JoinPath(dir_, "debugfs.out");
    o.stderr_path = JoinPath(dir_, "debugfs.err");
    BARGE_RETURN_IF_ERROR(debugfs.Spawn({"debugfs", "-R", request, disk()}, o, "e2fsprogs (debugfs)"));
    const int status = debugfs.Wait();
    BARGE_ASSIGN_OR_RETURN(std::string out, env_.ReadFile(o.stdout_path, 64 << 20));
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

 private:
  explicit MountedPoint(Env& env) : env_(env) {}
  Env& env_;
  std::unique_ptr<PointReader> reader_;  // checks done, export lock held
  FilesPoint point_;
  uint32_t partition_ = 0;
  std::string dir_;
  bool created_ = false;
  ChildProcess nbdfuse_;
};

// debugfs `ls -p`: "/INODE/MODE/UID/GID/NAME/SIZE/" per entry.
std::vector<FileEntry> ParseListing(const std::string& text) {
  std::vector<FileEntry> entries;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() < 2 || line[0] != '/') continue;
    std::vector<std::string> f;
    size_t start = 1;
    for (size_t slash; (slash = line.find('/', start)) != std::string::npos; start = slash + 1) {
      f.push_back(line.substr(start, slash - start));
    }
    if (f.size() < 6 || f[4] == "." || f[4] == ".." || f[4].empty()) continue;
    FileEntry e;
    e.inode = std::strtoull(f[0].c_str(), nullptr, 10);
    e.mode = static_cast<uint32_t>(std::strtoul(f[1].c_str(), nullptr, 8));
    e.name = f[4];
    e.size_bytes = std::strtoull(f[5].c_str(), nullptr, 10);
    // A deleted entry debugfs shows has inode 0.
    if (e.inode != 0) entries.push_back(std::move(e));
  }
  return entries;
}

Result<std::vector<FileEntry>> List(MountedPoint& m, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::string out, m.Debugfs("ls -p \"" + path + "\"", path));
  return ParseListing(out);
}

}  // namespace

Result<FilesListing> ListFiles(Env& env, const FilesRequest& req, const std::string& path) {
  BARGE_RETURN_IF_ERROR(CheckFsPath(path));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<MountedPoint> m, MountedPoint::Mount(env, req));
  FilesListing r;
  r.point = m->point();
  BARGE_ASSIGN_OR_RETURN(r.entries, List(*m, path));
  return r;
}

Result<FileCopy> GetFile(Env& env, const FilesRequest& req, const std::string& path, const std::string& dest) {
  BARGE_RETURN_IF_ERROR(CheckFsPath(path));
  if (path == "/") return Error::InvalidArgument("/ is a folder, not a file").set_path(path);
  if (env.Exists(dest)) return Error::InvalidArgument("the destination exists (remove it first)").set_path(dest);
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<MountedPoint> m, MountedPoint::Mount(env, req));
  std::string parent = DirName(path);
  if (parent.empty()) parent = "/";
  BARGE_ASSIGN_OR_RETURN(std::vector<FileEntry> siblings, List(*m, parent));
  const std::string name = BaseName(path);
  auto it = std::find_if(siblings.begin(), siblings.end(), [&](const FileEntry& e) { return e.name == name; });
  if (it == siblings.end()) {
    return Error::NotFound("no such file in backup " + m->point().manifest.id).set_path(path);
  }
  if (!it->is_regular()) {
    return Error::InvalidArgument("not a regular file in backup " + m->point().manifest.id).set_path(path);
  }
  const std::string target = AbsolutePath(dest);
  // debugfs writes through any link at its output's name: it writes into
  // a fresh private folder beside the destination (the same filesystem,
  // for the rename), never to a name someone could plant in a shared one.
  BARGE_ASSIGN_OR_RETURN(std::string temp_dir, env.CreateTempDir(DirName(target), "." + BaseName(target) + ".barge-"));
  const std::string temp = JoinPath(temp_dir, "file");
  auto fail = [&](Error e) -> Error { return e.Also(env.RemoveTree(temp_dir)); };
  if (auto dumped = m->Debugfs("dump \"" + path + "\" \"" + temp + "\"", path); !dumped.ok()) {
    return fail(dumped.error());
  }
  auto st = env.Stat(temp);
  if (!st.ok()) return fail(Error::IoError("debugfs wrote no file").set_path(dest));
  if (st->size_bytes != it->size_bytes) {
    return fail(Error::IoError("debugfs wrote " + std::to_string(st->size_bytes) + " bytes of " +
                               std::to_string(it->size_bytes))
                    .set_path(dest));
  }
  if (Status s = env.Rename(temp, target); !s.ok()) return fail(s.error());
  IgnoreError(env.RemoveDir(temp_dir), "an empty hidden folder beside the file; the copy is in place");
  FileCopy r;
  r.point = m->point();
  r.size_bytes = it->size_bytes;
  return r;
}

}  // namespace barge::pipeline
