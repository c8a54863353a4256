// StagedFile: locked temporary name, flush, link or rename, folder sync.
#include "pipeline/staged_file.h"

#include <unistd.h>

#include <chrono>
#include <thread>

#include "blockio/leftovers.h"
#include "blockio/path.h"

namespace barge::pipeline {

Status CheckOutputPath(Env& env, const std::string& path) {
  auto st = env.Stat(path);
  if (st.ok()) {
    if (st->is_regular() || st->is_block_device()) return OkStatus();
    if (st->is_directory()) {
      return Error::InvalidArgument("is a folder; name the output file in it").set_path(path);
    }
    return Error::InvalidArgument(
               "is not a regular file or block device (a character device such as /dev/null, a FIFO or a "
               "socket): the output is written under a temporary name beside it and renamed over it, which "
               "cannot work here; write to a file, a block device or an NBD export")
        .set_path(path);
  }
  if (st.error().code() != ErrorCode::kNotFound) return st.error();
  std::string dir = DirName(path);
  if (dir.empty() || dir == ".") return OkStatus();
  auto d = env.Stat(dir);
  if (!d.ok() || !d->is_directory()) {
    return Error::NotFound("the output's folder does not exist").set_path(dir);
  }
  return OkStatus();
}

namespace {

// An error about the temporary names the output the user asked for (the
// temporary is barge's own business): its path becomes `final_path`.
Error Named(Error e, const std::string& temp_path, const std::string& final_path) {
  if (e.path().empty() || e.path() == temp_path) e.set_path(final_path);
  return e;
}

Status Named(Status s, const std::string& temp_path, const std::string& final_path) {
  if (s.ok()) return s;
  return Named(std::move(s).error(), temp_path, final_path);
}

// The temporary's sink as the writer sees it: named after the final path,
// so that the errors and messages of every layer above (qcow2 writer,
// destinations, the pipeline) name the user's file.
class NamedSink final : public BlockSink {
 public:
  NamedSink(std::unique_ptr<BlockSink> target, std::string final_path)
      : target_(std::move(target)), final_path_(std::move(final_path)) {}
  const std::string& name() const override { return final_path_; }
  uint64_t size_bytes() const override { return target_->size_bytes(); }
  SinkCapabilities capabilities() const override { return target_->capabilities(); }
  Status WriteAt(uint64_t offset, std::span<const std::byte> data) override {
    return Fix(target_->WriteAt(offset, data));
  }
  Status WriteZeroes(uint64_t offset, uint64_t length) override {
    return Fix(target_->WriteZeroes(offset, length));
  }
  Status Trim(uint64_t offset, uint64_t length) override { return Fix(target_->Trim(offset, length)); }
  Status Flush() override { return Fix(target_->Flush()); }
  Status Truncate(uint64_t size_bytes) override { return Fix(target_->Truncate(size_bytes)); }

 private:
  Status Fix(Status s) const { return Named(std::move(s), target_->name(), final_path_); }
  std::unique_ptr<BlockSink> target_;
  std::string final_path_;
};

// Removes `temp` when no live writer holds it: the leftover of a run that
// published its output but failed to remove the temporary's name (a hard
// link to the output). Such a file is in no folder a backup or merge
// sweeps, so the next writer of the same name takes it (issue 13).
Status RemoveStaleTemporary(Env& env, const std::string& temp) {
  LockOptions lo;
  lo.create = false;
  auto lock = env.LockFile(temp, lo);
  if (!lock.ok()) {
    ErrorCode code = lock.error().code();
    return code == ErrorCode::kNotFound || code == ErrorCode::kBusy ? OkStatus() : Status(lock.error());
  }
  // Removed while locked, as Abandon does.
  return env.UnlinkIfExists(temp);
}

// Locks `temp`, creating it. A sweep of stale temporaries holds a
// leftover's lock for an instant before removing it: kBusy is retried
// briefly before it counts as another live writer.
Result<std::unique_ptr<EnvLock>> LockTemp(Env& env, const std::string& temp, const std::string& final_path,
                                          uint32_t create_mode) {
  LockOptions lo;
  lo.create_mode = create_mode;  // the lock creates the temporary
  lo.busy_message = "another process is writing this file (its temporary " + temp + " is locked)";
  for (int attempt = 0;; ++attempt) {
    auto lock = env.LockFile(temp, lo);
    if (lock.ok()) return lock;
    Error e = std::move(lock).error();
    if (e.code() != ErrorCode::kBusy) return Named(std::move(e), temp, final_path);
    if (attempt == 4) return e.set_path(final_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

Result<std::unique_ptr<StagedFile>> StagedFile::Create(Env& env, const std::string& final_path,
                                                       bool overwrite, bool sync, const FileAccess* access) {
  BARGE_RETURN_IF_ERROR(CheckOutputPath(env, final_path));
  {
    auto st = env.Stat(final_path);
    if (st.ok() && st->is_block_device()) {
      return Error::InvalidArgument("is a block device: it is written in place, not replaced").set_path(final_path);
    }
    if (st.ok() && !overwrite) {
      return Error::InvalidArgument("output exists (remove it or choose another name)")
          .set_path(final_path)
          .Also(Named(RemoveStaleTemporary(env, TempPathFor(final_path)), TempPathFor(final_path), final_path));
    }
    if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
  }
  std::string temp = TempPathFor(final_path);
  // Only a regular file can be a writer's temporary; anything else at the
  // name (a planted symbolic link above all) is removed, never written
  // through.
  if (auto planted = RemovePlanted(env, temp); !planted.ok()) {
    return Named(planted.error(), temp, final_path);
  }
  // A leftover of a killed run is unlocked, hence ours to replace; a live
  // writer's is not.
  const uint32_t create_mode = access != nullptr ? access->file_mode : LockOptions().create_mode;
  auto lock = LockTemp(env, temp, final_path, create_mode);
  if (!lock.ok()) return lock.error();
  // A leftover is taken over only from this user: another user's file under
  // the temporary's name (planted in a shared folder such as /tmp, to read
  // what is written through it) goes, and a fresh one of ours is made. In
  // a sticky folder nobody else can swap ours out afterwards.
  if (auto held = env.StatNoFollow(temp); held.ok() && held->uid != ::geteuid()) {
    lock->reset();
    if (Status removed = env.UnlinkIfExists(temp); !removed.ok()) return Named(removed.error(), temp, final_path);
    lock = LockTemp(env, temp, final_path, create_mode);
    if (!lock.ok()) return lock.error();
    if (auto again = env.StatNoFollow(temp); !again.ok() || again->uid != ::geteuid()) {
      return Error::InvalidArgument("another user keeps a file at the temporary name " + temp).set_path(final_path);
    }
  }
  TempRegistration registration(temp);
  FileOptions options;
  options.sync = sync;
  // Never through a link swapped in after the lock (the lock's open refused one).
  options.no_follow = true;
  options.regular_only = true;
  if (access != nullptr) options.create_mode = access->file_mode;
  auto sink = env.OpenSink(temp, SinkMode::kTruncate, options);
  if (!sink.ok()) return Named(std::move(sink).error(), temp, final_path).Also(env.UnlinkIfExists(temp));
  if (access != nullptr) {
    // A killed run's leftover keeps its mode through O_TRUNC, and the umask
    // may have narrowed a group bit: made exact before any byte is written.
    if (Status fixed = ApplyAccess(env, temp, *access); !fixed.ok()) {
      return Named(std::move(fixed).error(), temp, final_path).Also(env.UnlinkIfExists(temp));
    }
  }
  std::unique_ptr<StagedFile> file(new StagedFile(env, final_path, std::move(temp), std::move(lock).value(),
                                                  std::move(registration), overwrite, sync));
  file->sink_ = std::make_unique<NamedSink>(std::move(sink).value(), final_path);
  return file;
}

Result<std::unique_ptr<StagedFile>> StagedFile::Adopt(Env& env, const std::string& final_path, bool sync,
                                                      bool overwrite) {
  if (auto st = env.Stat(final_path); st.ok() && !overwrite) {
    return Error::InvalidArgument("output exists (remove it or choose another name)").set_path(final_path);
  }
  std::string temp = TempPathFor(final_path);
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.StatNoFollow(temp));
  if (!st.is_regular()) return Error::NotFound("no staged file to resume").set_path(final_path);
  LockOptions lo;
  lo.create = false;
  lo.busy_message = "another process is writing this file (its temporary " + temp + " is locked)";
  auto lock = env.LockFile(temp, lo);
  if (!lock.ok()) return Named(std::move(lock).error(), temp, final_path);
  TempRegistration registration(temp);
  FileOptions options;
  options.sync = sync;
  options.no_follow = true;
  options.regular_only = true;
  auto sink = env.OpenSink(temp, SinkMode::kExisting, options);
  if (!sink.ok()) return Named(std::move(sink).error(), temp, final_path);
  std::unique_ptr<StagedFile> file(new StagedFile(env, final_path, std::move(temp), std::move(lock).value(),
                                                  std::move(registration), overwrite, sync));
  file->sink_ = std::make_unique<NamedSink>(std::move(sink).value(), final_path);
  return file;
}

StagedFile::StagedFile(Env& env, std::string final_path, std::string temp_path,
                       std::unique_ptr<EnvLock> lock, TempRegistration registration, bool overwrite,
                       bool sync)
    : env_(env), final_path_(std::move(final_path)), temp_path_(std::move(temp_path)),
      lock_(std::move(lock)), registration_(std::move(registration)), overwrite_(overwrite), sync_(sync) {}

StagedFile::~StagedFile() {
  IgnoreError(Abandon(),
              "an error is already on its way out; the unlocked temporary goes at the next sweep");
}

Status StagedFile::Abandon() {
  if (done_) return OkStatus();
  done_ = true;
  sink_.reset();
  // Removed while still locked, so a sweep never sees it unlocked and half
  // written.
  Status removed = env_.UnlinkIfExists(temp_path_);
  lock_.reset();
  registration_ = TempRegistration();
  return removed;
}

Status StagedFile::Keep() {
  if (done_) return OkStatus();
  Status s = sink_->Flush();
  if (!s.ok()) return Named(std::move(s).error(), temp_path_, final_path_).Also(Abandon());
  done_ = true;
  sink_.reset();
  registration_ = TempRegistration();
  lock_.reset();
  return OkStatus();
}

Status StagedFile::Commit() {
  if (done_) return Error::InvalidArgument("staged file already finished").set_path(final_path_);
  Status s = sink_->Flush();
  sink_.reset();
  if (s.ok()) {
    // link() fails if the target appeared meanwhile; rename() would replace it.
    s = overwrite_ ? env_.Rename(temp_path_, final_path_) : env_.Link(temp_path_, final_path_);
    if (!s.ok()) {
      Error e = std::move(s).error();
      s = e.errno_value() != 0
              ? Error::FromErrno(e.errno_value(), overwrite_ ? "publish (rename)" : "publish (link)", final_path_)
              : Named(std::move(e), temp_path_, final_path_);
    }
  }
  if (!s.ok()) return Named(std::move(s).error(), temp_path_, final_path_).Also(Abandon());
  done_ = true;
  registration_ = TempRegistration();
  Status published = overwrite_ ? OkStatus() : env_.Unlink(temp_path_);
  lock_.reset();
  BARGE_RETURN_IF_ERROR(Named(std::move(published), temp_path_, final_path_));
  if (!sync_) return OkStatus();
  return env_.SyncDir(DirName(final_path_));
}

}  // namespace barge::pipeline
