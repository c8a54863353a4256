// StagedFile: locked temporary name, flush, link or rename, folder sync.
#include "pipeline/staged_file.h"

#include "blockio/path.h"

namespace barge::pipeline {

Result<std::unique_ptr<StagedFile>> StagedFile::Create(Env& env, const std::string& final_path,
                                                       bool overwrite, bool sync) {
  if (!overwrite) {
    auto st = env.Stat(final_path);
    if (st.ok()) {
      return Error::InvalidArgument("output exists (remove it or choose another name)")
          .set_path(final_path);
    }
    if (st.error().code() != ErrorCode::kNotFound) return st.error();
  }
  std::string temp = TempPathFor(final_path);
  // A leftover of a killed run is unlocked, hence ours to replace; a live
  // writer's is not.
  LockOptions lo;
  lo.busy_message = "another process is writing this file";
  auto lock = env.LockFile(temp, lo);
  if (!lock.ok()) {
    Error e = std::move(lock).error();
    if (e.code() == ErrorCode::kBusy) e.set_path(final_path);
    return e;
  }
  TempRegistration registration(temp);
  FileOptions options;
  options.sync = sync;
  auto sink = env.OpenSink(temp, SinkMode::kTruncate, options);
  if (!sink.ok()) return std::move(sink).error().Also(env.UnlinkIfExists(temp));
  std::unique_ptr<StagedFile> file(new StagedFile(env, final_path, std::move(temp), std::move(lock).value(),
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
