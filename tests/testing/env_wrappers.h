// Env wrappers for tests (blockio/env.h): a test picks the Env a job runs
// on instead of reaching into the job through hooks.
//   StopEnv: a process killed right after its n-th durability boundary.
//   FaultFilesEnv: FaultSink/FaultSource (blockio/fault.h) around the
//   files a job opens, chosen by path.
//   FailOpenEnv: opening one file for reading fails (EIO).
// Power loss (dropping what was not synced) is blockio/fault_env.h's job.
#pragma once

#include <atomic>
#include <cerrno>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "blockio/env.h"
#include "blockio/fault.h"

namespace barge::testing {

// Stops as a killed process does: right after the n-th boundary call that
// `match` accepts has taken effect, that call returns kIoError "simulated
// crash", and so does every later call, of the Env and of the sinks,
// sources and locks it opened, without touching anything. What was written
// before stays as it is. Boundaries are the calls after which the files
// on disk differ in a way a crash test cares about, as FaultEnv counts
// them: a sink's Flush (kSync), SyncDir, Rename, Link (and CreateSymlink),
// Unlink and RemoveDir (kUnlink). Thread-safe.
class StopEnv final : public EnvWrapper {
 public:
  // The path a boundary is told by: the file flushed, the folder synced,
  // the name a rename or link creates, the name removed.
  using Match = std::function<bool(EnvOp op, const std::string& path)>;
  struct Boundary {
    EnvOp op;
    std::string path;
  };

  explicit StopEnv(Env& target) : EnvWrapper(target) {}

  // 0: never stop. An unset `match` accepts every boundary.
  void StopAfter(uint64_t n, Match match = {}) {
    std::lock_guard lock(mu_);
    stop_after_ = n;
    match_ = std::move(match);
    matched_ = 0;
  }
  bool stopped() const { return stopped_.load(); }
  // The boundaries that took effect, in order (the stopping one included).
  std::vector<Boundary> log() const {
    std::lock_guard lock(mu_);
    return log_;
  }
  bool Happened(EnvOp op, const std::function<bool(const std::string&)>& path) const {
    for (const Boundary& b : log()) {
      if (b.op == op && path(b.path)) return true;
    }
    return false;
  }

  Status Dead() const { return Error::IoError("simulated crash (the process is gone)"); }

  // Runs a boundary call unless stopped, then counts it.
  Status AtBoundary(EnvOp op, const std::string& path, const std::function<Status()>& call) {
    if (stopped()) return Dead();
    Status s = call();
    if (!s.ok()) return s;
    std::lock_guard lock(mu_);
    log_.push_back({op, path});
    if (stop_after_ == 0 || (match_ && !match_(op, path))) return s;
    if (++matched_ < stop_after_) return s;
    stopped_ = true;
    return Error::IoError("simulated crash right after " + std::string(EnvOpName(op)) + " of " + path);
  }

  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& o) override {
    if (stopped()) return Dead().error();
    BARGE_ASSIGN_OR_RETURN(auto source, target().OpenSource(path, o));
    return std::unique_ptr<BlockSource>(new Source(*this, std::move(source)));
  }
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& o) override {
    if (stopped()) return Dead().error();
    BARGE_ASSIGN_OR_RETURN(auto sink, target().OpenSink(path, mode, o));
    return std::unique_ptr<BlockSink>(new Sink(*this, std::move(sink)));
  }
  Result<FileStat> Stat(const std::string& p) override { return Alive([&] { return target().Stat(p); }); }
  Result<FileStat> StatNoFollow(const std::string& p) override {
    return Alive([&] { return target().StatNoFollow(p); });
  }
  Result<std::vector<std::string>> ListDir(const std::string& d) override {
    return Alive([&] { return target().ListDir(d); });
  }
  Status CreateDir(const std::string& d, uint32_t mode = 0755) override {
    return Alive([&] { return target().CreateDir(d, mode); });
  }
  Status Rename(const std::string& from, const std::string& to) override {
    return AtBoundary(EnvOp::kRename, to, [&] { return target().Rename(from, to); });
  }
  Status Link(const std::string& from, const std::string& to) override {
    return AtBoundary(EnvOp::kLink, to, [&] { return target().Link(from, to); });
  }
  Status CreateSymlink(const std::string& link_target, const std::string& p) override {
    return AtBoundary(EnvOp::kLink, p, [&] { return target().CreateSymlink(link_target, p); });
  }
  Result<std::string> ReadLink(const std::string& p) override {
    return Alive([&] { return target().ReadLink(p); });
  }
  Status Unlink(const std::string& p) override {
    return AtBoundary(EnvOp::kUnlink, p, [&] { return target().Unlink(p); });
  }
  Status RemoveDir(const std::string& d) override {
    return AtBoundary(EnvOp::kUnlink, d, [&] { return target().RemoveDir(d); });
  }
  Status SyncDir(const std::string& d) override {
    return AtBoundary(EnvOp::kSyncDir, d, [&] { return target().SyncDir(d); });
  }
  Result<SpaceInfo> Space(const std::string& p) override { return Alive([&] { return target().Space(p); }); }
  Status SetOwner(const std::string& p, uint32_t uid, uint32_t gid) override {
    return Alive([&] { return target().SetOwner(p, uid, gid); });
  }
  Status SetMode(const std::string& p, uint32_t mode) override {
    return Alive([&] { return target().SetMode(p, mode); });
  }
  Result<std::string> RealPath(const std::string& p) override {
    return Alive([&] { return target().RealPath(p); });
  }
  Result<std::unique_ptr<EnvLock>> LockFile(const std::string& p, const LockOptions& o) override {
    return Alive([&] { return target().LockFile(p, o); });
  }
  Result<std::unique_ptr<EnvLock>> LockImage(const std::string& p, ImageAccess a) override {
    return Alive([&] { return target().LockImage(p, a); });
  }

 private:
  template <typename F>
  auto Alive(F&& call) -> decltype(call()) {
    if (stopped()) return Dead().error();
    return call();
  }

  class Sink final : public BlockSink {
   public:
    Sink(StopEnv& env, std::unique_ptr<BlockSink> target) : env_(env), target_(std::move(target)) {}
    const std::string& name() const override { return target_->name(); }
    uint64_t size_bytes() const override { return target_->size_bytes(); }
    SinkCapabilities capabilities() const override { return target_->capabilities(); }
    Status WriteAt(uint64_t o, std::span<const std::byte> d) override {
      return env_.Alive([&] { return target_->WriteAt(o, d); });
    }
    Status WriteZeroes(uint64_t o, uint64_t n) override {
      return env_.Alive([&] { return target_->WriteZeroes(o, n); });
    }
    Status Trim(uint64_t o, uint64_t n) override { return env_.Alive([&] { return target_->Trim(o, n); }); }
    Status Flush() override {
      return env_.AtBoundary(EnvOp::kSync, name(), [&] { return target_->Flush(); });
    }
    Status Truncate(uint64_t s) override { return env_.Alive([&] { return target_->Truncate(s); }); }

   private:
    StopEnv& env_;
    std::unique_ptr<BlockSink> target_;
  };

  class Source final : public BlockSource {
   public:
    Source(StopEnv& env, std::unique_ptr<BlockSource> target) : env_(env), target_(std::move(target)) {}
    const std::string& name() const override { return target_->name(); }
    uint64_t size_bytes() const override { return target_->size_bytes(); }
    SourceCapabilities capabilities() const override { return target_->capabilities(); }
    Status ReadAt(uint64_t o, std::span<std::byte> out) override {
      return env_.Alive([&] { return target_->ReadAt(o, out); });
    }
    Status ReadMany(std::span<ReadRequest> requests) override {
      return env_.Alive([&] { return target_->ReadMany(requests); });
    }
    void WillNeed(uint64_t o, uint64_t n) override { target_->WillNeed(o, n); }
    Result<ExtentList> Extents(uint64_t o, uint64_t n) override {
      return env_.Alive([&] { return target_->Extents(o, n); });
    }

   private:
    StopEnv& env_;
    std::unique_ptr<BlockSource> target_;
  };

  mutable std::mutex mu_;
  uint64_t stop_after_ = 0;  // guarded by mu_
  Match match_;              // guarded by mu_
  uint64_t matched_ = 0;     // guarded by mu_
  std::vector<Boundary> log_;  // guarded by mu_
  std::atomic<bool> stopped_{false};
};

// Puts a FaultSink (FaultSource) around every sink (source) it opens and
// hands its injector to `on_sink` (`on_source`) with the path, which adds
// rules or delays for the files it picks (blockio/fault.h). The callbacks
// run on the opening thread.
class FaultFilesEnv final : public EnvWrapper {
 public:
  using Configure = std::function<void(const std::string& path, FaultInjector& faults)>;
  FaultFilesEnv(Env& target, Configure on_sink, Configure on_source = {})
      : EnvWrapper(target), on_sink_(std::move(on_sink)), on_source_(std::move(on_source)) {}

  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& o) override {
    BARGE_ASSIGN_OR_RETURN(auto source, target().OpenSource(path, o));
    if (!on_source_) return source;
    auto fault = std::make_unique<FaultSource>(std::move(source));
    on_source_(path, fault->faults());
    return std::unique_ptr<BlockSource>(std::move(fault));
  }
  Result<std::unique_ptr<BlockSink>> OpenSink(const std::string& path, SinkMode mode,
                                              const FileOptions& o) override {
    BARGE_ASSIGN_OR_RETURN(auto sink, target().OpenSink(path, mode, o));
    if (!on_sink_) return sink;
    auto fault = std::make_unique<FaultSink>(std::move(sink));
    on_sink_(path, fault->faults());
    return std::unique_ptr<BlockSink>(std::move(fault));
  }

 private:
  Configure on_sink_;
  Configure on_source_;
};

// Opening `path` as a source fails with EIO; everything else passes.
class FailOpenEnv final : public EnvWrapper {
 public:
  FailOpenEnv(Env& target, std::string path) : EnvWrapper(target), path_(std::move(path)) {}
  Result<std::unique_ptr<BlockSource>> OpenSource(const std::string& path, const FileOptions& o) override {
    if (path == path_) return Error::FromErrno(EIO, "open", path);
    return target().OpenSource(path, o);
  }

 private:
  std::string path_;
};

}  // namespace barge::testing
