// FaultEnv: errors injected by call kind and count, and power loss
// simulated over a target Env. The model is described in fault_env.h.
#include "blockio/fault_env.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <utility>

namespace barge {
namespace {

constexpr size_t Index(EnvOp op) { return static_cast<size_t>(op); }

bool IsBoundary(EnvOp op) {
  return op == EnvOp::kSync || op == EnvOp::kSyncDir || op == EnvOp::kRename ||
         op == EnvOp::kLink || op == EnvOp::kUnlink;
}

// A file or folder, by device and inode.
struct Id {
  uint64_t device = 0;
  uint64_t inode = 0;
  auto operator<=>(const Id&) const = default;
};

Id IdOf(const FileStat& st) { return {st.device, st.inode}; }

// What a folder entry names.
struct Node {
  Id id;
  bool is_dir = false;
};

// One change of one folder entry, not yet durable.
struct NameChange {
  Id dir;                // the folder, as SyncDir finds it
  std::string dir_path;  // where the folder is now (kept up to date as folders move)
  std::string name;
  std::optional<Node> before;  // what the entry named before the change
  std::optional<Node> after;   // and after it
  // `before` is a folder that moved to another name (a rename's source),
  // rather than an empty folder that was removed or replaced.
  bool before_moved = false;
};

// A file's data since it was last durable.
struct FileData {
  uint64_t synced_size = 0;
  // The old contents of the bytes below synced_size changed since, by
  // offset; the ranges are disjoint.
  std::map<uint64_t, std::vector<std::byte>> saved;
};

// A file kept alive by a hard link in the stash.
struct PinState {
  int open_sinks = 0;
};

// Absolute, lexically normal, no trailing slash: folder paths can then be
// compared by prefix when a folder moves.
std::string Normal(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path.empty() ? "." : path, ec);
  if (ec) p = path;
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

bool AllZero(const std::vector<std::byte>& bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

using CallRange = std::optional<std::pair<uint64_t, uint64_t>>;  // offset, length

}  // namespace

class FaultEnv::Impl {
 public:
  Impl(Env& target, std::string stash) : target_(target), stash_(Normal(stash)) {}

  // Whether a call may go ahead.
  struct Admission {
    Status status;      // an error: the call fails with it and has no effect
    bool dies = false;  // the call takes effect, then returns the power-loss error
  };

  Admission Admit(EnvOp op, const std::string& path, CallRange range = std::nullopt) {
    std::lock_guard lock(mu_);
    if (dead_) return {Dead(path)};
    uint64_t n = ++calls_[Index(op)];
    if (IsBoundary(op)) {
      ++boundaries_;
      if (crash_left_) {
        if (*crash_left_ == 0) {  // CrashAfter(0): dies before this boundary
          dead_ = true;
          return {Dead(path)};
        }
        if (--*crash_left_ == 0) {
          // Other threads' calls fail from now on; this one still lands.
          dead_ = true;
          return {OkStatus(), true};
        }
      }
    }
    for (const Rule& r : rules_) {
      if (r.op != op || (r.and_after ? n < r.n : n != r.n)) continue;
      std::string what = "injected " + std::string(EnvOpName(op));
      if (range) return {Error::FromErrno(r.err, what, path, range->first, range->second)};
      return {Error::FromErrno(r.err, what, path)};
    }
    return {};
  }

  static Error Dead(const std::string& path) {
    return Error::IoError("simulated power loss").set_path(path);
  }

  template <typename T>
  static Result<T> Finish(const Admission& a, Result<T> r, const std::string& path) {
    if (a.dies) return Dead(path);
    return r;
  }

  // ---- errors and counters ----
  void FailCall(EnvOp op, uint64_t n, int err, bool and_after) {
    std::lock_guard lock(mu_);
    rules_.push_back({op, std::max<uint64_t>(n, 1), err, and_after});
  }
  void ClearFaults() {
    std::lock_guard lock(mu_);
    rules_.clear();
  }
  uint64_t calls(EnvOp op) const {
    std::lock_guard lock(mu_);
    return calls_[Index(op)];
  }
  uint64_t boundaries() const {
    std::lock_guard lock(mu_);
    return boundaries_;
  }
  void ResetCounters() {
    std::lock_guard lock(mu_);
    calls_ = {};
    boundaries_ = 0;
  }
  void CrashAfter(std::optional<uint64_t> n) {
    std::lock_guard lock(mu_);
    crash_left_ = n;
  }
  bool crashed() const {
    std::lock_guard lock(mu_);
    return dead_;
  }
  size_t pending_name_changes() const {
    std::lock_guard lock(mu_);
    return changes_.size();
  }
  size_t unsynced_files() const {
    std::lock_guard lock(mu_);
    return files_.size();
  }

  // ---- file data ----

  // Saves the durable contents of [offset, end) of file `id` that are not
  // saved yet, before a change to them.
  Status SaveBeforeChange(const Id& id, uint64_t offset, uint64_t end) {
    std::lock_guard lock(mu_);
    return SaveLocked(id, offset, end);
  }

  // A Flush with fdatasync went through.
  void MarkFileDurable(const Id& id) {
    std::lock_guard lock(mu_);
    files_.erase(id);
    ReleaseUnneededPins();
  }

  void SinkClosed(const Id& id) {
    std::lock_guard lock(mu_);
    auto it = pins_.find(id);
    if (it == pins_.end()) return;  // forgotten by SimulatePowerLoss meanwhile
    if (--it->second.open_sinks == 0) ReleaseUnneededPins();
  }

  // ---- Env calls (after Admit) ----

  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options);
  Status CreateDir(const std::string& dir);
  Status Rename(const std::string& from, const std::string& to);
  Status Link(const std::string& from, const std::string& to);
  Status Unlink(const std::string& path);
  Status RemoveDir(const std::string& dir);
  Status SyncDir(const std::string& dir);
  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& path, const LockOptions& options);

  // ---- power loss ----
  Status SimulatePowerLoss();
  void MarkDurable() {
    std::lock_guard lock(mu_);
    files_.clear();
    changes_.clear();
    ReleaseUnneededPins();
  }
  // Removes everything in the stash.
  Status EmptyStash();

  Env& target() { return target_; }

  class Sink;
  class Source;

 private:
  struct Rule {
    EnvOp op;
    uint64_t n;
    int err;
    bool and_after;
  };
  struct Loc {
    Id dir;
    std::string dir_path;
    std::string name;
  };

  std::string PinPath(const Id& id) const {
    return Join(stash_, "p-" + std::to_string(id.device) + "-" + std::to_string(id.inode));
  }
  std::string ParkPath(const Id& id) const {
    return Join(stash_, "d-" + std::to_string(id.device) + "-" + std::to_string(id.inode));
  }

  std::optional<Node> NodeAt(const std::string& path) {
    auto st = target_.StatNoFollow(path);
    if (!st.ok()) return std::nullopt;
    return Node{IdOf(*st), st->is_directory()};
  }

  // The folder and name of a normal path.
  std::optional<Loc> Locate(const std::string& normal) {
    size_t slash = normal.find_last_of('/');
    if (slash == std::string::npos || slash + 1 == normal.size()) return std::nullopt;
    std::string dir = slash == 0 ? "/" : normal.substr(0, slash);
    auto st = target_.Stat(dir);
    if (!st.ok()) return std::nullopt;
    return Loc{IdOf(*st), dir, normal.substr(slash + 1)};
  }

  Status SaveLocked(const Id& id, uint64_t offset, uint64_t end);    // mu_ held
  Status PinFile(const Id& id, const std::string& path);              // mu_ held
  Status Pin(const Id& id, const std::string& path);                  // mu_ held
  void ReleaseUnneededPins();                                         // mu_ held
  void MovedFolder(const std::string& from, const std::string& to);  // mu_ held
  Status UndoNameChange(const NameChange& change);                   // mu_ held
  Status RestoreFileData(const Id& id, const FileData& data);        // mu_ held

  void Record(const Loc& loc, std::optional<Node> before, std::optional<Node> after,
              bool before_moved = false) {  // mu_ held
    changes_.push_back({loc.dir, loc.dir_path, loc.name, before, after, before_moved});
  }

  Env& target_;
  const std::string stash_;
  mutable std::mutex mu_;
  std::array<uint64_t, kEnvOpCount> calls_{};  // guarded by mu_
  uint64_t boundaries_ = 0;                     // guarded by mu_
  std::optional<uint64_t> crash_left_;          // boundaries until the crash; guarded by mu_
  bool dead_ = false;                           // guarded by mu_
  std::vector<Rule> rules_;                     // guarded by mu_
  std::map<Id, FileData> files_;                // files with unsynced data; guarded by mu_
  std::map<Id, PinState> pins_;                      // guarded by mu_
  std::vector<NameChange> changes_;             // oldest first; guarded by mu_
};

// A sink that counts and fails calls and saves what its writes overwrite.
class FaultEnv::Impl::Sink final : public BlockSink {
 public:
  // `tracked`: the file's identity when it is a regular file (pinned, one
  // open sink counted). `durable_flush`: Flush runs fdatasync.
  Sink(Impl& env, std::unique_ptr<BlockSink> target, std::optional<Id> tracked, bool durable_flush)
      : env_(env), target_(std::move(target)), tracked_(tracked), durable_flush_(durable_flush) {}
  ~Sink() override {
    target_.reset();
    if (tracked_) env_.SinkClosed(*tracked_);
  }

  const std::string& name() const override { return target_->name(); }
  uint64_t size_bytes() const override { return target_->size_bytes(); }
  SinkCapabilities capabilities() const override { return target_->capabilities(); }

  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    BARGE_RETURN_IF_ERROR(BeforeChange(offset, data.size(), offset + data.size()));
    return target_->WriteAt(offset, data);
  }
  Status WriteZeroes(uint64_t offset, uint64_t length) override {
    BARGE_RETURN_IF_ERROR(BeforeChange(offset, length, offset + length));
    return target_->WriteZeroes(offset, length);
  }
  Status Trim(uint64_t offset, uint64_t length) override {
    BARGE_RETURN_IF_ERROR(BeforeChange(offset, length, offset + length));
    return target_->Trim(offset, length);
  }
  Status Truncate(uint64_t size) override {
    // Everything from the new size on may go.
    BARGE_RETURN_IF_ERROR(BeforeChange(size, 0, UINT64_MAX));
    return target_->Truncate(size);
  }
  Status Flush() override {
    Admission a = env_.Admit(EnvOp::kSync, name());
    if (!a.status.ok()) return a.status;
    Status s = target_->Flush();
    if (s.ok() && tracked_ && durable_flush_) env_.MarkFileDurable(*tracked_);
    return Finish(a, std::move(s), name());
  }

 private:
  // Counts a kWrite (the range in an injected error is offset, length) and
  // saves the durable bytes of [offset, end) it is about to change.
  Status BeforeChange(uint64_t offset, uint64_t length, uint64_t end) {
    Admission a = env_.Admit(EnvOp::kWrite, name(), std::pair(offset, length));
    if (!a.status.ok()) return a.status;
    if (!tracked_) return OkStatus();
    return env_.SaveBeforeChange(*tracked_, offset, end);
  }

  Impl& env_;
  std::unique_ptr<BlockSink> target_;
  const std::optional<Id> tracked_;
  const bool durable_flush_;
};

// A source that counts and fails reads.
class FaultEnv::Impl::Source final : public BlockSource {
 public:
  Source(Impl& env, std::unique_ptr<BlockSource> target) : env_(env), target_(std::move(target)) {}

  const std::string& name() const override { return target_->name(); }
  uint64_t size_bytes() const override { return target_->size_bytes(); }
  SourceCapabilities capabilities() const override { return target_->capabilities(); }

  Status ReadAt(uint64_t offset, std::span<std::byte> out) override {
    Admission a = env_.Admit(EnvOp::kRead, name(), std::pair(offset, uint64_t{out.size()}));
    if (!a.status.ok()) return a.status;
    return target_->ReadAt(offset, out);
  }

  // Each request is one kRead; the ones that go ahead reach the target's
  // ReadMany together, so batching is kept.
  Status ReadMany(std::span<ReadRequest> requests) override {
    std::vector<ReadRequest> pass;
    std::vector<size_t> pass_index;
    Status first;
    for (size_t i = 0; i < requests.size(); ++i) {
      ReadRequest& r = requests[i];
      r.status = env_.Admit(EnvOp::kRead, name(), std::pair(r.offset, uint64_t{r.buffer.size()})).status;
      if (r.status.ok()) {
        pass.push_back({r.offset, r.buffer, {}});
        pass_index.push_back(i);
      } else if (first.ok()) {
        first = r.status;
      }
    }
    if (!pass.empty()) {
      Status s = target_->ReadMany(pass);
      for (size_t j = 0; j < pass.size(); ++j) requests[pass_index[j]].status = pass[j].status;
      if (!s.ok() && first.ok()) first = std::move(s);
    }
    return first;
  }

  void WillNeed(uint64_t offset, uint64_t length) override { target_->WillNeed(offset, length); }

  Result<ExtentList> Extents(uint64_t offset, uint64_t length) override {
    Admission a = env_.Admit(EnvOp::kRead, name(), std::pair(offset, length));
    if (!a.status.ok()) return a.status.error();
    return target_->Extents(offset, length);
  }

 private:
  Impl& env_;
  std::unique_ptr<BlockSource> target_;
};

// ---- file data ----

Status FaultEnv::Impl::SaveLocked(const Id& id, uint64_t offset, uint64_t end) {
  auto it = files_.find(id);
  if (it == files_.end()) {
    // The file was durable up to now: as it is on disk.
    BARGE_ASSIGN_OR_RETURN(FileStat st, target_.Stat(PinPath(id)));
    it = files_.emplace(id, FileData{st.size_bytes, {}}).first;
  }
  FileData& f = it->second;
  end = std::min(end, f.synced_size);
  if (offset >= end) return OkStatus();
  // The parts of [offset, end) not saved yet: a byte is saved once, before
  // its first change since the last sync, so the log holds durable bytes.
  std::vector<std::pair<uint64_t, uint64_t>> gaps;
  uint64_t pos = offset;
  auto s = f.saved.upper_bound(offset);
  if (s != f.saved.begin()) --s;
  for (; s != f.saved.end() && s->first < end; ++s) {
    uint64_t saved_end = s->first + s->second.size();
    if (saved_end <= pos) continue;
    if (s->first > pos) gaps.emplace_back(pos, s->first);
    pos = std::max(pos, saved_end);
  }
  if (pos < end) gaps.emplace_back(pos, end);
  if (gaps.empty()) return OkStatus();
  FileOptions o;
  o.use_uring = false;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> src, target_.OpenSource(PinPath(id), o));
  uint64_t size = src->size_bytes();
  for (auto [a, b] : gaps) {
    // Bytes past the end of the file (a shrink this Env did not see) are
    // saved as zeros.
    std::vector<std::byte> old(b - a);
    if (a < size) {
      BARGE_RETURN_IF_ERROR(src->ReadAt(a, std::span(old.data(), std::min(b, size) - a)));
    }
    f.saved.emplace(a, std::move(old));
  }
  return OkStatus();
}

Status FaultEnv::Impl::RestoreFileData(const Id& id, const FileData& data) {
  FileOptions o;
  o.use_uring = false;
  o.write_behind = false;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink,
                         target_.OpenSink(PinPath(id), SinkMode::kExisting, o));
  for (const auto& [offset, old] : data.saved) {
    if (AllZero(old)) {
      BARGE_RETURN_IF_ERROR(sink->WriteZeroes(offset, old.size()));  // a hole, most likely
    } else {
      BARGE_RETURN_IF_ERROR(sink->WriteAt(offset, old));
    }
  }
  BARGE_RETURN_IF_ERROR(sink->Truncate(data.synced_size));
  return sink->Flush();
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
  return std::unique_ptr<BlockSink>(new Sink(*this, std::move(sink), tracked, options.sync));
}

Status FaultEnv::Impl::CreateDir(const std::string& dir) {
  std::lock_guard lock(mu_);
  std::string p = Normal(dir);
  bool existed = NodeAt(p).has_value();
  BARGE_RETURN_IF_ERROR(target_.CreateDir(dir));
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
  Impl::Admission a = impl_->Admit(EnvOp::kOpen, path);
  if (!a.status.ok()) return a.status.error();
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> source, target().OpenSource(path, options));
  return std::unique_ptr<BlockSource>(new Impl::Source(*impl_, std::move(source)));
}

Result<std::unique_ptr<BlockSink>> FaultEnv::OpenSink(const std::string& path, SinkMode mode,
                                                      const FileOptions& options) {
  Impl::Admission a = impl_->Admit(EnvOp::kOpen, path);
  if (!a.status.ok()) return a.status.error();
  return impl_->OpenSink(path, mode, options);
}

Result<FileStat> FaultEnv::Stat(const std::string& path) {
  Impl::Admission a = impl_->Admit(EnvOp::kStat, path);
  if (!a.status.ok()) return a.status.error();
  return target().Stat(path);
}

Result<FileStat> FaultEnv::StatNoFollow(const std::string& path) {
  Impl::Admission a = impl_->Admit(EnvOp::kStat, path);
  if (!a.status.ok()) return a.status.error();
  return target().StatNoFollow(path);
}

Result<std::vector<std::string>> FaultEnv::ListDir(const std::string& dir) {
  Impl::Admission a = impl_->Admit(EnvOp::kList, dir);
  if (!a.status.ok()) return a.status.error();
  return target().ListDir(dir);
}

Status FaultEnv::CreateDir(const std::string& dir) {
  Impl::Admission a = impl_->Admit(EnvOp::kMkdir, dir);
  if (!a.status.ok()) return a.status;
  return impl_->CreateDir(dir);
}

Status FaultEnv::Rename(const std::string& from, const std::string& to) {
  Impl::Admission a = impl_->Admit(EnvOp::kRename, to);
  if (!a.status.ok()) return a.status;
  return Impl::Finish(a, impl_->Rename(from, to), to);
}

Status FaultEnv::Link(const std::string& from, const std::string& to) {
  Impl::Admission a = impl_->Admit(EnvOp::kLink, to);
  if (!a.status.ok()) return a.status;
  return Impl::Finish(a, impl_->Link(from, to), to);
}

Status FaultEnv::Unlink(const std::string& path) {
  Impl::Admission a = impl_->Admit(EnvOp::kUnlink, path);
  if (!a.status.ok()) return a.status;
  return Impl::Finish(a, impl_->Unlink(path), path);
}

Status FaultEnv::RemoveDir(const std::string& dir) {
  Impl::Admission a = impl_->Admit(EnvOp::kUnlink, dir);
  if (!a.status.ok()) return a.status;
  return Impl::Finish(a, impl_->RemoveDir(dir), dir);
}

Status FaultEnv::SyncDir(const std::string& dir) {
  Impl::Admission a = impl_->Admit(EnvOp::kSyncDir, dir);
  if (!a.status.ok()) return a.status;
  return Impl::Finish(a, impl_->SyncDir(dir), dir);
}

Result<SpaceInfo> FaultEnv::Space(const std::string& path) {
  Impl::Admission a = impl_->Admit(EnvOp::kStat, path);
  if (!a.status.ok()) return a.status.error();
  return target().Space(path);
}

Status FaultEnv::SetOwner(const std::string& path, uint32_t uid, uint32_t gid) {
  Impl::Admission a = impl_->Admit(EnvOp::kSetOwner, path);
  if (!a.status.ok()) return a.status;
  return target().SetOwner(path, uid, gid);
}

Status FaultEnv::SetMode(const std::string& path, uint32_t mode) {
  Impl::Admission a = impl_->Admit(EnvOp::kSetOwner, path);
  if (!a.status.ok()) return a.status;
  return target().SetMode(path, mode);
}

Result<std::string> FaultEnv::RealPath(const std::string& path) {
  Impl::Admission a = impl_->Admit(EnvOp::kStat, path);
  if (!a.status.ok()) return a.status.error();
  return target().RealPath(path);
}

Result<std::unique_ptr<EnvLock>> FaultEnv::LockFile(const std::string& path,
                                                    const LockOptions& options) {
  Impl::Admission a = impl_->Admit(EnvOp::kLock, path);
  if (!a.status.ok()) return a.status.error();
  return impl_->LockFile(path, options);
}

Result<std::unique_ptr<EnvLock>> FaultEnv::LockImage(const std::string& path, ImageAccess access) {
  Impl::Admission a = impl_->Admit(EnvOp::kLock, path);
  if (!a.status.ok()) return a.status.error();
  return target().LockImage(path, access);
}

// ---- the crash campaign ----

Result<uint64_t> ForEachCrashPoint(FaultEnv& env, const std::function<Status()>& setup,
                                   const std::function<Status(Env&)>& op,
                                   const std::function<void(const CrashPoint&)>& check) {
  auto run = [&](std::optional<uint64_t> crash_after) -> Result<CrashPoint> {
    BARGE_RETURN_IF_ERROR(setup());
    env.MarkDurable();
    env.ResetCounters();
    if (crash_after) {
      env.CrashAfter(*crash_after);
    } else {
      env.CancelCrash();
    }
    CrashPoint point;
    {
      ScopedDefaultEnv scoped(env);
      point.op_status = op(env);
    }
    point.crashed = env.crashed();
    point.after_boundaries = point.crashed && crash_after ? *crash_after : env.boundaries();
    BARGE_RETURN_IF_ERROR(env.SimulatePowerLoss());
    return point;
  };
  BARGE_ASSIGN_OR_RETURN(CrashPoint clean, run(std::nullopt));
  uint64_t total = clean.after_boundaries;
  clean.boundaries = total;
  check(clean);
  for (uint64_t i = 0; i <= total; ++i) {
    BARGE_ASSIGN_OR_RETURN(CrashPoint point, run(i));
    point.boundaries = total;
    check(point);
  }
  return total + 2;
}

}  // namespace barge
