// StagedFile: locked temporary name, flush, link or rename, folder sync.
#include "pipeline/staged_file.h"

#include <chrono>
#include <thread>

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

// Locks `temp`, creating it. A sweep of stale temporaries holds a
// leftover's lock for an instant before removing it: kBusy is retried
// briefly before it counts as another live writer.
Result<std::unique_ptr<EnvLock>> LockTemp(Env& env, const std::string& temp, const std::string& final_path) {
  LockOptions lo;
  lo.busy_message = "another process is writing this file (its temporary " + temp + " is locked)";
  for (int attempt = 0;; ++attempt) {
    auto lock = env.LockFile(temp, lo);
    if (lock.ok()) return lock;
    Error e = std::move(lock).error();
    if (e.code() != ErrorCode::kBusy) return e;
    if (attempt == 4) return e.set_path(final_path);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

Result<std::unique_ptr<StagedFile>> StagedFile::Create(Env& env, const std::string& final_path,
                                                       bool overwrite, bool sync) {
  BARGE_RETURN_IF_ERROR(CheckOutputPath(env, final_path));
  {
    auto st = env.Stat(final_path);
    if (st.ok() && st->is_block_device()) {
      return Error::InvalidArgument("is a block device: it is written in place, not replaced").set_path(final_path);
    }
    if (st.ok() && !overwrite) {
      return Error::InvalidArgument("output exists (remove it or choose another name)")
          .set_path(final_path);
    }
    if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
  }
  std::string temp = TempPathFor(final_path);
  // Only a regular file can be a writer's temporary; anything else at the
  // name (a planted symbolic link above all) is removed, never written
  // through.
  if (auto st = env.StatNoFollow(temp); st.ok() && !st->is_regular()) {
    BARGE_RETURN_IF_ERROR(env.Unlink(temp));
  }
  // A leftover of a killed run is unlocked, hence ours to replace; a live
  // writer's is not.
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EnvLock> lock, LockTemp(env, temp, final_path));
  TempRegistration registration(temp);
  FileOptions options;
  options.sync = sync;
  auto sink = env.OpenSink(temp, SinkMode::kTruncate, options);
  if (!sink.ok()) return std::move(sink).error().Also(env.UnlinkIfExists(temp));
  std::unique_ptr<StagedFile> file(new StagedFile(env, final_path, std::move(temp), std::move(lock),
                                                  std::move(registration), overwrite, sync));
  file->sink_ = std::move(sink).value();
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

Status StagedFile::Commit() {
  if (done_) return Error::InvalidArgument("staged file already finished").set_path(final_path_);
  Status s = sink_->Flush();
  sink_.reset();
  if (s.ok()) {
    // link() fails if the target appeared meanwhile; rename() would replace it.
    s = overwrite_ ? env_.Rename(temp_path_, final_path_) : env_.Link(temp_path_, final_path_);
  }
  if (!s.ok()) return std::move(s).error().Also(Abandon());
  done_ = true;
  registration_ = TempRegistration();
  Status published = overwrite_ ? OkStatus() : env_.Unlink(temp_path_);
  lock_.reset();
  BARGE_RETURN_IF_ERROR(published);
  if (!sync_) return OkStatus();
  return env_.SyncDir(DirName(final_path_));
}

}  // namespace barge::pipeline
