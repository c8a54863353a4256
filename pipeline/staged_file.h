// Output files that appear under their final name only when complete: data
// goes to a hidden temporary name beside the target (".NAME.barge-tmp",
// blockio/env.h's TempPathFor), is flushed, then published (linked, or
// renamed over an older file) and the folder synced. The writer holds a
// LockFile on the temporary so that a sweep (SweepStaleTemporaries) can tell
// a live writer's file from a killed run's leftover, and registers it for
// removal on a forced exit (TempRegistration). A crash or error leaves no
// file that looks finished. Every step goes through the Env.
#pragma once

#include <memory>
#include <string>

#include "blockio/env.h"
#include "blockio/sink.h"
#include "pipeline/file_access.h"

namespace barge::pipeline {

// One thread at a time.
class StagedFile {
 public:
  // `env` must outlive the object.
  // Returns: the staged file, its temporary created empty and locked;
  // kInvalidArgument if `final_path` exists and !overwrite, or cannot name
  // an output file (CheckOutputPath; a block device is written in place,
  // never staged); kBusy (naming `final_path`) if another process is
  // writing the same temporary. The unlocked leftover of a killed run is
  // taken over; anything but a regular file at the temporary's name (a
  // planted symbolic link) is removed, never written through.
  // sync = false: no fdatasync of the file nor fsync of its folder (the
  // output may be lost or incomplete after a crash; see FileOptions::sync).
  // `access`: the temporary (hence the published file) is created with its
  // file mode and group, exactly (pipeline/file_access.h); null: 0644, the
  // umask applying (a replica or overlay QEMU opens).
  static Result<std::unique_ptr<StagedFile>> Create(Env& env, const std::string& final_path,
                                                    bool overwrite = false, bool sync = true,
                                                    const FileAccess* access = nullptr);
  // Takes over the temporary a killed or failed run left at `final_path`'s
  // temporary name (a resumed backup, pipeline/backup_resume.h): locked,
  // opened as is (not truncated), registered. kNotFound when it is gone,
  // kBusy when a live writer holds it; `final_path` must not exist unless
  // `overwrite` (the commit then renames over it).
  static Result<std::unique_ptr<StagedFile>> Adopt(Env& env, const std::string& final_path, bool sync = true,
                                                   bool overwrite = false);
  // Removes an uncommitted temporary (see Abandon).
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  BlockSink& sink() { return *sink_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

  // Flushes, publishes under the final name (link when !overwrite, so a
  // file that appeared meanwhile is never replaced; rename otherwise) and
  // syncs the folder. A failure before the publish removes the temporary;
  // one after it (the folder sync) leaves the published file.
  Status Commit();
  // Flushes and closes the temporary and leaves it for a later run to
  // Adopt (unlocked: a sweep would remove it). A failed flush removes it.
  Status Keep();
  // Closes and removes the temporary now. The destructor does the same
  // and can only drop a failure: the temporary is then unlocked, and the
  // next sweep of its folder removes it.
  Status Abandon();

 private:
  StagedFile(Env& env, std::string final_path, std::string temp_path, std::unique_ptr<EnvLock> lock,
             TempRegistration registration, bool overwrite, bool sync);
  Env& env_;
  std::string final_path_;
  std::string temp_path_;
  std::unique_ptr<EnvLock> lock_;  // on the temporary, until it is gone
  TempRegistration registration_;
  std::unique_ptr<BlockSink> sink_;
  bool overwrite_;
  bool sync_;
  bool done_ = false;
};

// Whether `path` can name an output file: nothing there yet (in a folder
// that exists), a regular file or a block device (the caller accepts or
// refuses those). kInvalidArgument naming `path` for a folder, a character
// device (/dev/null), a FIFO or a socket; kNotFound naming the folder when
// it is missing.
Status CheckOutputPath(Env& env, const std::string& path);

}  // namespace barge::pipeline
