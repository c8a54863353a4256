// FaultEnv: errors injected by call kind and count, and power loss
// simulated over a target Env: here the pins, the name changes and their
// undoing, and the Env calls (the model is described in fault_env.h).
#include "blockio/fault_env.h"

#include <algorithm>

#include "blockio/fault_env_internal.h"
#include "blockio/path.h"

namespace barge {

std::string FaultEnv::Impl::Normal(const std::string& path) {
  // Lexical (blockio/path.h): no trailing slash, "." and ".." resolved.
  return AbsolutePath(path.empty() ? "." : path);
}

std::string FaultEnv::Impl::Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

// ---- pins ----

Status FaultEnv::Impl::PinFile(const Id& id, const std::string& path) {
  if (pins_.count(id)) return OkStatus();
  // A hard link to a symbolic link would pin the link, not the file.
  auto real = target_.RealPath(path);
  return Pin(id, real.ok() ? *real : path);
}

Status FaultEnv::Impl::Pin(const Id& id, const std::string& path) {
  if (pins_.count(id)) return OkStatus();
  std::string pin = PinPath(id);
  Status s = target_.Link(path, pin);
  if (!s.ok()) {
    if (s.error().errno_value() == EXDEV) {
      return Error::Internal("FaultEnv: the stash " + stash_ +
                             " must be on the filesystem of the files under test")
          .set_path(path);
    }
    auto st = target_.StatNoFollow(pin);  // a pin made before and forgotten is fine
    if (!st.ok() || IdOf(*st) != id) return s;
  }
  pins_.emplace(id, PinState{});
  return OkStatus();
}

void FaultEnv::Impl::ReleaseUnneededPins() {
  for (auto it = pins_.begin(); it != pins_.end();) {
    const Id& id = it->first;
    bool needed = it->second.open_sinks > 0 || files_.count(id) > 0 ||
                  std::any_of(changes_.begin(), changes_.end(), [&](const NameChange& c) {
                    return c.before && !c.before->is_dir && c.before->id == id;
                  });
    // A pin that cannot be removed now stays, and is tried again later.
    if (needed || !target_.Unlink(PinPath(id)).ok()) {
      ++it;
      continue;
    }
    it = pins_.erase(it);
  }
}

// ---- names ----

void FaultEnv::Impl::MovedFolder(const std::string& from, const std::string& to) {
  for (NameChange& c : changes_) {
    if (c.dir_path == from) {
      c.dir_path = to;
    } else if (c.dir_path.size() > from.size() && c.dir_path.starts_with(from) &&
               c.dir_path[from.size()] == '/') {
      c.dir_path = to + c.dir_path.substr(from.size());
    }
  }
}

Result<std::unique_ptr<BlockSink>> FaultEnv::Impl::OpenSink(const std::string& path, SinkMode mode,
                                                            const FileOptions& options) {
  std::lock_guard lock(mu_);
  std::string p = Normal(path);
  bool existed = NodeAt(p).has_value();
  if (existed && mode == SinkMode::kTruncate) {
    // Opening empties the file: save its durable contents first.
    auto st = target_.Stat(p);
    if (st.ok() && st->is_regular() && st->size_bytes > 0) {
      BARGE_RETURN_IF_ERROR(PinFile(IdOf(*st), p));
      BARGE_RETURN_IF_ERROR(SaveLocked(IdOf(*st), 0, st->size_bytes));
    }
  }
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, target_.OpenSink(path, mode, options));
  // Only regular files' data is tracked (not block devices).
  std::optional<Id> tracked;
  auto st = target_.Stat(p);
  if (st.ok() && st->is_regular()) {
    tracked = IdOf(*st);
    BARGE_RETURN_IF_ERROR(PinFile(*tracked, p));
    ++pins_[*tracked].open_sinks;
  }
  if (!existed) {
    auto node = NodeAt(p);
    auto loc = Locate(p);
    if (node && loc) Record(*loc, std::nullopt, node);
  }
  return WrapSink(std::move(sink), tracked, options.sync);
}

Status FaultEnv::Impl::CreateDir(const std::string& dir, uint32_t mode) {
  std::lock_guard lock(mu_);
  std::string p = Normal(dir);
  bool existed = NodeAt(p).has_value();
  BARGE_RETURN_IF_ERROR(target_.CreateDir(dir, mode));
  if (!existed) {
    auto node = NodeAt(p);
    auto loc = Locate(p);
    if (node && loc) Record(*loc, std::nullopt, node);
  }
  return OkStatus();
}

Status FaultEnv::Impl::Rename(const std::string& from, const std::string& to) {
  std::lock_guard lock(mu_);
  std::string f = Normal(from), t = Normal(to);
  auto moved = NodeAt(f);
  auto victim = NodeAt(t);
  auto from_loc = Locate(f);
  auto to_loc = Locate(t);
  // rename(2) between two names of one file does nothing.
  bool track = moved && from_loc && to_loc && !(victim && victim->id == moved->id);
  if (track) {
    // Either may have to come back under its old name.
    if (!moved->is_dir) BARGE_RETURN_IF_ERROR(Pin(moved->id, f));
    if (victim && !victim->is_dir) BARGE_RETURN_IF_ERROR(Pin(victim->id, t));
  }
  Status s = target_.Rename(from, to);
  if (!s.ok() || !track) return s;
  if (moved->is_dir) MovedFolder(f, t);
  Record(*from_loc, moved, std::nullopt, /*before_moved=*/true);
  Record(*to_loc, victim, moved);
  return s;
}

Status FaultEnv::Impl::Link(const std::string& from, const std::string& to) {
  std::lock_guard lock(mu_);
  BARGE_RETURN_IF_ERROR(target_.Link(from, to));
  std::string t = Normal(to);
  auto node = NodeAt(t);
  auto loc = Locate(t);
  if (node && loc) Record(*loc, std::nullopt, node);
  return OkStatus();
}

Status FaultEnv::Impl::CreateSymlink(const std::string& link_target, const std::string& path) {
  std::lock_guard lock(mu_);
  BARGE_RETURN_IF_ERROR(target_.CreateSymlink(link_target, path));
  // A new entry, as a create: undone by removing the link.
  std::string p = Normal(path);
  auto node = NodeAt(p);
  auto loc = Locate(p);
  if (node && loc) Record(*loc, std::nullopt, node);
  return OkStatus();
}

Status FaultEnv::Impl::Unlink(const std::string& path) {
  std::lock_guard lock(mu_);
  std::string p = Normal(path);
  auto node = NodeAt(p);
  auto loc = Locate(p);
  bool track = node && loc && !node->is_dir;
  // The file stays in the stash until the removal is durable.
  if (track) BARGE_RETURN_IF_ERROR(Pin(node->id, p));
  Status s = target_.Unlink(path);
  if (s.ok() && track) Record(*loc, node, std::nullopt);
  return s;
}

Status FaultEnv::Impl::RemoveDir(const std::string& dir) {
  std::lock_guard lock(mu_);
  std::string p = Normal(dir);
  auto node = NodeAt(p);
  auto loc = Locate(p);
  BARGE_RETURN_IF_ERROR(target_.RemoveDir(dir));
  // An empty folder: undone by creating it again.
  if (node && loc) Record(*loc, node, std::nullopt);
  return OkStatus();
}

Status FaultEnv::Impl::SyncDir(const std::string& dir) {
  std::lock_guard lock(mu_);
  BARGE_RETURN_IF_ERROR(target_.SyncDir(dir));
  auto st = target_.Stat(dir.empty() ? "." : dir);
  if (!st.ok()) return OkStatus();
  Id id = IdOf(*st);
  std::erase_if(changes_, [&](const NameChange& c) { return c.dir == id; });
  ReleaseUnneededPins();
  return OkStatus();
}

Result<std::unique_ptr<EnvLock>> FaultEnv::Impl::LockFile(const std::string& path,
                                                          const LockOptions& options) {
  // Not under mu_: a lock may wait for another process.
  std::string p = Normal(path);
  bool existed = NodeAt(p).has_value();
  auto lock_or = target_.LockFile(path, options);
  if (lock_or.ok() && options.create && !existed) {
    std::lock_guard lock(mu_);
    auto node = NodeAt(p);
    auto loc = Locate(p);
    if (node && loc) Record(*loc, std::nullopt, node);
  }
  return lock_or;
}

// ---- power loss ----

Status FaultEnv::Impl::UndoNameChange(const NameChange& c) {
  std::string path = Join(c.dir_path, c.name);
  // Take away what the change put there. Something else there is an
  // untracked change (outside this Env), left alone.
  if (c.after) {
    auto now = NodeAt(path);
    if (now && now->id == c.after->id) {
      if (now->is_dir) {
        // Parked, not removed: it may move back under an older name.
        std::string park = ParkPath(now->id);
        BARGE_RETURN_IF_ERROR(target_.Rename(path, park));
        MovedFolder(path, park);
      } else {
        BARGE_RETURN_IF_ERROR(target_.Unlink(path));
      }
    }
  }
  if (!c.before) return OkStatus();
  // A folder removed for good takes its pending entries with it.
  auto folder = target_.Stat(c.dir_path);
  if (!folder.ok() || !folder->is_directory() || NodeAt(path)) return OkStatus();
  if (!c.before->is_dir) return target_.Link(PinPath(c.before->id), path);
  std::string park = ParkPath(c.before->id);
  if (NodeAt(park)) {
    BARGE_RETURN_IF_ERROR(target_.Rename(park, path));
    MovedFolder(park, path);
    return OkStatus();
  }
  if (!c.before_moved) return target_.CreateDir(path);
  // A folder moved away whose new entry is durable: it cannot have both
  // names, and stays where it is (see fault_env.h).
  return OkStatus();
}

Status FaultEnv::Impl::SimulatePowerLoss() {
  std::lock_guard lock(mu_);
  Status first;
  auto keep_first = [&](Status s) {
    if (!s.ok() && first.ok()) first = std::move(s);
  };
  // Data first, while every tracked file is pinned; then names, newest
  // first, so that each undo finds the tree as its change left it.
  for (const auto& [id, data] : files_) keep_first(RestoreFileData(id, data));
  for (size_t i = changes_.size(); i-- > 0;) keep_first(UndoNameChange(changes_[i]));
  keep_first(EmptyStash());
  files_.clear();
  changes_.clear();
  pins_.clear();
  dead_ = false;
  crash_left_.reset();
  return first;
}

Status FaultEnv::Impl::EmptyStash() {
  auto names = target_.ListDir(stash_);
  if (!names.ok()) {
    return names.error().code() == ErrorCode::kNotFound ? OkStatus() : Status(names.error());
  }
  Status first;
  for (const std::string& name : *names) {
    Status s = target_.RemoveTree(Join(stash_, name));
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

// ---- FaultEnv ----

FaultEnv::FaultEnv(Env& target, std::string stash_dir)
    : EnvWrapper(target), impl_(std::make_unique<Impl>(target, stash_dir)) {
  // A stash that cannot be made or emptied shows later, as errors of the
  // calls that pin files in it.
  Status made = target.CreateDirs(stash_dir);
  Status emptied = made.ok() ? impl_->EmptyStash() : made;
}

// Nothing to report a failure to here: a stash left behind is the test
// folder's to remove.
FaultEnv::~FaultEnv() { Status emptied = impl_->EmptyStash(); }

void FaultEnv::FailCall(EnvOp op, uint64_t n, int err, bool and_after) {
  impl_->FailCall(op, n, err, and_after);
}
void FaultEnv::ClearFaults() { impl_->ClearFaults(); }
std::vector<FaultEnv::Injection> FaultEnv::injections() const { return impl_->injections(); }
uint64_t FaultEnv::calls(EnvOp op) const { return impl_->calls(op); }
uint64_t FaultEnv::boundaries() const { return impl_->boundaries(); }
void FaultEnv::ResetCounters() { impl_->ResetCounters(); }
void FaultEnv::CrashAfter(uint64_t n) { impl_->CrashAfter(n); }
void FaultEnv::CancelCrash() { impl_->CrashAfter(std::nullopt); }
bool FaultEnv::crashed() const { return impl_->crashed(); }
Status FaultEnv::SimulatePowerLoss() { return impl_->SimulatePowerLoss(); }
void FaultEnv::MarkDurable() { impl_->MarkDurable(); }
size_t FaultEnv::pending_name_changes() const { return impl_->pending_name_changes(); }
size_t FaultEnv::unsynced_files() const { return impl_->unsynced_files(); }

Result<std::unique_ptr<BlockSource>> FaultEnv::OpenSource(const std::string& path,
                                                          const FileOptions& options) {
  return impl_->Gate(EnvOp::kOpen, path, [&]() -> Result<std::unique_ptr<BlockSource>> {
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> source, target().OpenSource(path, options));
    return impl_->WrapSource(std::move(source));
  });
}

Result<std::unique_ptr<BlockSink>> FaultEnv::OpenSink(const std::string& path, SinkMode mode,
                                                      const FileOptions& options) {
  return impl_->Gate(EnvOp::kOpen, path, [&] { return impl_->OpenSink(path, mode, options); });
}

Result<FileStat> FaultEnv::Stat(const std::string& path) {
  return impl_->Gate(EnvOp::kStat, path, [&] { return target().Stat(path); });
}

Result<FileStat> FaultEnv::StatNoFollow(const std::string& path) {
  return impl_->Gate(EnvOp::kStat, path, [&] { return target().StatNoFollow(path); });
}

Result<std::vector<std::string>> FaultEnv::ListDir(const std::string& dir) {
  return impl_->Gate(EnvOp::kList, dir, [&] { return target().ListDir(dir); });
}

Status FaultEnv::CreateDir(const std::string& dir, uint32_t mode) {
  return impl_->Gate(EnvOp::kMkdir, dir, [&] { return impl_->CreateDir(dir, mode); });
}

// A temporary folder is private to the process that made it: a power cut
// that forgets it only loses what the run had not committed, so it is not
// tracked for rollback.
Result<std::string> FaultEnv::CreateTempDir(const std::string& parent, std::string_view prefix) {
  return impl_->Gate(EnvOp::kMkdir, parent, [&] { return target().CreateTempDir(parent, prefix); });
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  return impl_->Gate(EnvOp::kRename, to, [&] { return impl_->Rename(from, to); });
}

Status FaultEnv::Link(const std::string& from, const std::string& to) {
  return impl_->Gate(EnvOp::kLink, to, [&] { return impl_->Link(from, to); });
}

Status FaultEnv::CreateSymlink(const std::string& link_target, const std::string& path) {
  return impl_->Gate(EnvOp::kLink, path, [&] { return impl_->CreateSymlink(link_target, path); });
}

Result<std::string> FaultEnv::ReadLink(const std::string& path) {
  return impl_->Gate(EnvOp::kStat, path, [&] { return target().ReadLink(path); });
}

Status FaultEnv::Unlink(const std::string& path) {
  return impl_->Gate(EnvOp::kUnlink, path, [&] { return impl_->Unlink(path); });
}

Status FaultEnv::RemoveDir(const std::string& dir) {
  return impl_->Gate(EnvOp::kUnlink, dir, [&] { return impl_->RemoveDir(dir); });
}

Status FaultEnv::SyncDir(const std::string& dir) {
  return impl_->Gate(EnvOp::kSyncDir, dir, [&] { return impl_->SyncDir(dir); });
}

Result<SpaceInfo> FaultEnv::Space(const std::string& path) {
  return impl_->Gate(EnvOp::kStat, path, [&] { return target().Space(path); });
}

Status FaultEnv::SetOwner(const std::string& path, uint32_t uid, uint32_t gid) {
  return impl_->Gate(EnvOp::kSetOwner, path, [&] { return target().SetOwner(path, uid, gid); });
}

Status FaultEnv::SetMode(const std::string& path, uint32_t mode) {
  return impl_->Gate(EnvOp::kSetOwner, path, [&] { return target().SetMode(path, mode); });
}

Result<std::string> FaultEnv::RealPath(const std::string& path) {
  return impl_->Gate(EnvOp::kStat, path, [&] { return target().RealPath(path); });
}

Result<std::unique_ptr<EnvLock>> FaultEnv::LockFile(const std::string& path,
                                                    const LockOptions& options) {
  return impl_->Gate(EnvOp::kLock, path, [&] { return impl_->LockFile(path, options); });
}

Result<std::unique_ptr<EnvLock>> FaultEnv::LockImage(const std::string& path, ImageAccess access) {
  return impl_->Gate(EnvOp::kLock, path, [&] { return target().LockImage(path, access); });
}

}  // namespace barge
