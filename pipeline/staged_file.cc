// StagedFile: temporary name, flush, rename, sync.
#include "pipeline/staged_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "blockio/env.h"

namespace barge::pipeline {

namespace fs = std::filesystem;

std::string StagedTempPath(const std::string& final_path) { return TempPathFor(final_path); }

Status CheckOutputPath(const std::string& path) {
  Env& env = Env::Default();
  auto st = env.Stat(path);
  if (st.ok()) {
    if (st->is_regular()) return OkStatus();
    if (st->is_directory()) {
      return Error::InvalidArgument("is a folder; name the output file in it").set_path(path);
    }
    if (st->is_block_device()) return OkStatus();
    return Error::InvalidArgument(
               "is not a regular file or block device (a character device such as /dev/null, a FIFO or a "
               "socket): the output is written under a temporary name beside it and renamed over it, which "
               "cannot work here; write to a file, a block device or an NBD export")
        .set_path(path);
  }
  if (st.error().code() != ErrorCode::kNotFound) return st.error();
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) return OkStatus();
  auto d = env.Stat(dir);
  if (!d.ok() || !d->is_directory()) {
    return Error::NotFound("the output's folder does not exist").set_path(dir);
  }
  return OkStatus();
}

Status SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Error::FromErrno(errno, "open folder", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Error::FromErrno(err, "fsync folder", dir);
  return OkStatus();
}

namespace {

// Locks `temp`, creating it. A sweep of stale temporaries holds a
// leftover's lock for an instant before removing it: kBusy is retried
// briefly before it counts as another live writer.
Result<std::unique_ptr<EnvLock>> LockTemp(Env& env, const std::string& temp, const std::string& final_path) {
  LockOptions o;
  o.busy_message = "another process is writing this output now (its temporary " + temp + " is locked)";
  for (int attempt = 0;; ++attempt) {
    auto lock = env.LockFile(temp, o);
    if (lock.ok() || lock.error().code() != ErrorCode::kBusy || attempt == 4) {
      if (!lock.ok() && lock.error().code() == ErrorCode::kBusy) {
        return Error(lock.error()).set_path(final_path);
      }
      return lock;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

Result<std::unique_ptr<StagedFile>> StagedFile::Create(const std::string& final_path,
                                                       bool overwrite, bool sync) {
  Env& env = Env::Default();
  BARGE_RETURN_IF_ERROR(CheckOutputPath(final_path));
  if (!overwrite && env.Exists(final_path)) {
    return Error::InvalidArgument("output exists (remove it or choose another name)")
        .set_path(final_path);
  }
  if (auto st = env.Stat(final_path); st.ok() && st->is_block_device()) {
    return Error::InvalidArgument("is a block device: it is written in place, not replaced").set_path(final_path);
  }
  std::string temp = StagedTempPath(final_path);
  // Only a regular file can be a writer's temporary; anything else at the
  // name (a planted symbolic link above all) is removed, never written
  // through.
  if (auto st = env.StatNoFollow(temp); st.ok() && !st->is_regular()) {
    BARGE_RETURN_IF_ERROR(env.Unlink(temp));
  }
  // Locked before it is written: a live writer's temporary is refused
  // (kBusy), the unlocked leftover of a killed run is ours to truncate.
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<EnvLock> lock, LockTemp(env, temp, final_path));
  TempRegistration registered(temp);
  FileOptions options;
  options.sync = sync;
  auto sink = env.OpenSink(temp, SinkMode::kTruncate, options);
  if (!sink.ok()) {
    (void)env.Unlink(temp);
    return sink.error();
  }
  return std::unique_ptr<StagedFile>(new StagedFile(final_path, temp, std::move(lock), std::move(registered),
                                                    std::move(sink).value(), overwrite, sync));
}

StagedFile::StagedFile(std::string final_path, std::string temp_path, std::unique_ptr<EnvLock> lock,
                       TempRegistration registered, std::unique_ptr<BlockSink> sink, bool overwrite, bool sync)
    : final_path_(std::move(final_path)), temp_path_(std::move(temp_path)), lock_(std::move(lock)),
      registered_(std::move(registered)), sink_(std::move(sink)), overwrite_(overwrite), sync_(sync) {}

StagedFile::~StagedFile() { Abandon(); }

void StagedFile::Release() {
  registered_ = TempRegistration();
  lock_.reset();
}

void StagedFile::Abandon() {
  if (done_) return;
  done_ = true;
  sink_.reset();
  // Removed while still locked: no other writer can have it.
  (void)Env::Default().Unlink(temp_path_);
  Release();
}

Status StagedFile::Commit() {
  if (done_) return Error::InvalidArgument("staged file already finished").set_path(final_path_);
  Env& env = Env::Default();
  BARGE_RETURN_IF_ERROR(sink_->Flush());
  sink_.reset();
  if (!overwrite_) {
    // link() fails if the target appeared meanwhile; rename() would replace it.
    if (Status s = env.Link(temp_path_, final_path_); !s.ok()) {
      Abandon();
      return s;
    }
    (void)env.Unlink(temp_path_);
  } else if (Status s = env.Rename(temp_path_, final_path_); !s.ok()) {
    Abandon();
    return s;
  }
  done_ = true;
  Release();
  if (!sync_) return OkStatus();
  return SyncDirectory(fs::path(final_path_).parent_path().string());
}

}  // namespace barge::pipeline
