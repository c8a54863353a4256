// Output files that appear under their final name only when complete: data
// goes to a hidden temporary name beside the target, is flushed, then
// renamed (and the folder synced). A crash or error leaves no file that looks
// finished; the destructor removes an uncommitted temporary. The writer
// holds an Env::LockFile on its temporary and registers it
// (TempRegistration): a sweep (SweepStaleTemporaries) never removes a live
// writer's file, and a forced exit (a second SIGINT) removes it.
#pragma once

#include <memory>
#include <string>

#include "blockio/env.h"
#include "blockio/sink.h"

namespace barge::pipeline {

// One thread at a time.
class StagedFile {
 public:
  // Fails with kInvalidArgument if `final_path` exists and !overwrite, and
  // with kBusy (naming `final_path`) while another live process writes the
  // same temporary; the unlocked leftover of a killed run is taken over.
  // sync = false: no fdatasync of the file nor fsync of its folder (the
  // output may be lost or incomplete after a crash; see FileOptions::sync).
  static Result<std::unique_ptr<StagedFile>> Create(const std::string& final_path,
                                                    bool overwrite = false, bool sync = true);
  ~StagedFile();
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  BlockSink& sink() { return *sink_; }
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

  // Flushes, renames to the final name and syncs the folder.
  Status Commit();
  // Removes the temporary file now (also done by the destructor).
  void Abandon();

 private:
  StagedFile(std::string final_path, std::string temp_path, std::unique_ptr<EnvLock> lock,
             TempRegistration registered, std::unique_ptr<BlockSink> sink, bool overwrite, bool sync);
  // Releases the lock and the registration (the temporary is gone or renamed).
  void Release();
  std::string final_path_;
  std::string temp_path_;
  std::unique_ptr<EnvLock> lock_;
  TempRegistration registered_;
  std::unique_ptr<BlockSink> sink_;
  bool overwrite_;
  bool sync_;
  bool done_ = false;
};

// The temporary name StagedFile uses for `final_path` (".NAME.barge-tmp",
// blockio's TempPathFor). Exposed so cleanup and tests can find leftovers
// of a killed run.
std::string StagedTempPath(const std::string& final_path);

// Whether `path` can name an output file: nothing there yet (in a folder
// that exists) or a regular file. kInvalidArgument naming `path` for a
// folder, a character device (/dev/null), a FIFO or a socket; kNotFound
// naming the folder when it is missing. Block devices are the caller's to
// accept or refuse before this.
Status CheckOutputPath(const std::string& path);

// fsync of a folder (after a rename or unlink in it).
Status SyncDirectory(const std::string& dir);

}  // namespace barge::pipeline
