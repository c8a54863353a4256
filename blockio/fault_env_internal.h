// The FaultEnv's implementation class, shared by fault_env.cc (names,
// pins, power loss, the Env calls) and fault_env_data.cc (wrapped sinks and
// sources, the undo log of file data). Not a public header.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "blockio/fault_env.h"

namespace barge {

class FaultEnv::Impl {
 public:
  // A file or folder, by device and inode.
  struct Id {
    uint64_t device = 0;
    uint64_t inode = 0;
    auto operator<=>(const Id&) const = default;
  };

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

  using CallRange = std::optional<std::pair<uint64_t, uint64_t>>;  // offset, length

  static Id IdOf(const FileStat& st) { return {st.device, st.inode}; }
  // Absolute, lexically normal, no trailing slash: folder paths can then be
  // compared by prefix when a folder moves.
  static std::string Normal(const std::string& path);
  static std::string Join(const std::string& dir, const std::string& name);
  static size_t Index(EnvOp op) { return static_cast<size_t>(op); }
  static bool IsBoundary(EnvOp op) {
    return op == EnvOp::kSync || op == EnvOp::kSyncDir || op == EnvOp::kRename ||
           op == EnvOp::kLink || op == EnvOp::kUnlink;
  }

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
      injections_.push_back({op, n, r.err, path});
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

  // Admits a call of `op` and runs `call` (which returns a Result) when it
  // may go ahead.
  template <typename Call>
  auto Gate(EnvOp op, const std::string& path, Call&& call) -> decltype(call()) {
    Admission a = Admit(op, path);
    if (!a.status.ok()) return a.status.error();
    return Finish(a, call(), path);
  }

  // ---- errors and counters ----
  void FailCall(EnvOp op, uint64_t n, int err, bool and_after) {
    std::lock_guard lock(mu_);
    rules_.push_back({op, std::max<uint64_t>(n, 1), err, and_after});
  }
  void ClearFaults() {
    std::lock_guard lock(mu_);
    rules_.clear();
    injections_.clear();
  }
  std::vector<FaultEnv::Injection> injections() const {
    std::lock_guard lock(mu_);
    return injections_;
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

  // fault_env_data.cc: the wrapped sinks and sources, and the undo log.
  // `tracked`: the file's identity when it is a regular file (pinned, one
  // open sink counted). `durable_flush`: the target's Flush runs fdatasync.
  std::unique_ptr<BlockSink> WrapSink(std::unique_ptr<BlockSink> target, std::optional<Id> tracked,
                                      bool durable_flush);
  std::unique_ptr<BlockSource> WrapSource(std::unique_ptr<BlockSource> target);
  // Saves the durable contents of [offset, end) of file `id` that are not
  // saved yet, before a change to them.
  Status SaveBeforeChange(const Id& id, uint64_t offset, uint64_t end);
  // A Flush with fdatasync went through.
  void MarkFileDurable(const Id& id);
  void SinkClosed(const Id& id);

  // ---- Env calls (after Admit) ----

  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& options);
  Status CreateDir(const std::string& dir, uint32_t mode);
  Status Rename(const std::string& from, const std::string& to);
  Status Link(const std::string& from, const std::string& to);
  Status CreateSymlink(const std::string& link_target, const std::string& path);
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

  class Sink;
  class Source;

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
  std::vector<FaultEnv::Injection> injections_; // failed by a rule; guarded by mu_
  std::map<Id, FileData> files_;                // files with unsynced data; guarded by mu_
  std::map<Id, PinState> pins_;                 // guarded by mu_
  std::vector<NameChange> changes_;             // oldest first; guarded by mu_
};

}  // namespace barge
