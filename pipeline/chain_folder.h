// The protocol every job that writes a chain folder follows (backup,
// merge): lock the folder, load its chain (an interrupted merge completed
// first), sweep what killed runs left, stage a new point's files (image,
// digest table, manifest) and commit them in order, the manifest last, so
// that a manifest only ever names complete files (docs/formats/backup.md).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/sink.h"
#include "pipeline/chain.h"
#include "pipeline/file_access.h"
#include "pipeline/staged_file.h"

namespace barge::pipeline {

struct ChainWriterOptions {
  // Errors of staging and committing are wrapped "JOB: ..." ("backup").
  std::string job = "backup";
  // Make the folder (and its parent) when missing. Then, when the folder
  // holds no point yet, a writer destroyed before Commit removes its lock
  // file and the folders it made: a first backup that fails leaves nothing.
  bool create = false;
  // With `create`: the folder the chain folder is made in ("" for none),
  // removed too when this writer made it.
  std::string parent_dir;
  // The caller's lock of the folder (ChainLock::Acquire), or null: taken
  // here, failing at once (kBusy) when another job holds it.
  const ChainLock* held = nullptr;
  // Who may read the chain (pipeline/file_access.h). Set: the folders this
  // writer makes get it, and an existing chain folder whose own access
  // differs is given it, with its files (ShareFolder: `--group` shares a
  // chain from now on). Unset: new folders are private (0700), an existing
  // chain folder keeps its own. Every file written then gets the folder's
  // access (FileAccess::OfFolder), whatever the umask.
  std::optional<FileAccess> access;
  // Remove the images, digest tables and verification records no manifest
  // names, and stale temporaries (RemoveLeftovers), right after loading.
  bool remove_leftovers = false;
};

// The writer of one chain folder, holding its lock for its life. One
// thread at a time; `env` must outlive it.
class ChainWriter {
 public:
  // Locks (or uses options.held), loads the chain (LoadChainFolder with the
  // lock held) and, with options.remove_leftovers, removes the leftovers.
  // Returns the writer; kNotFound naming the folder when it is missing (and
  // not created); kBusy when another job holds it; LoadChainFolder's and
  // RemoveLeftovers' errors.
  static Result<std::unique_ptr<ChainWriter>> Open(Env& env, const std::string& dir,
                                                   const ChainWriterOptions& options);
  // Removes staged files not committed (the manifest first), then, for a
  // failed first backup, the lock file and the folders it made.
  ~ChainWriter();
  ChainWriter(const ChainWriter&) = delete;
  ChainWriter& operator=(const ChainWriter&) = delete;

  const ChainFolder& chain() const { return chain_; }
  const std::string& dir() const { return chain_.dir; }
  // The access of every file written into the folder (FileAccess::OfFolder).
  const FileAccess& file_access() const { return access_; }

  // Removes stale temporaries of killed runs (a live writer's are locked
  // and kept), best effort: what cannot be removed now goes at a later run.
  void SweepTemporaries();
  // Images, digest tables and verification records no manifest names, and
  // stale temporaries but `keep_temporary` (a file name; "" for none): what
  // options.remove_leftovers does at Open, for a job that first looks at
  // what a killed run staged (a resumed backup). Returns the names of the
  // stale temporaries it swept (in a bucket: killed runs' multipart
  // uploads, aborted), for the job to report.
  Result<std::vector<std::string>> RemoveLeftovers(const std::string& keep_temporary = {});

  // The new point's image, staged under its temporary name: the sink to
  // write it through (valid until Commit or destruction). Errors wrapped
  // "JOB: starting NAME".
  Result<BlockSink*> StageImage(const std::string& name);
  // The same, taking over the temporary a killed or failed run staged for
  // NAME as it is (StagedFile::Adopt).
  Result<BlockSink*> AdoptStagedImage(const std::string& name);
  // Leaves the staged image for a later run to adopt (StagedFile::Keep)
  // and keeps the folder (no first-backup cleanup): a failed backup that
  // will resume. The small files staged are removed as on any failure.
  Status KeepStagedImage();
  // A small file of the new point (digest table, then manifest), written
  // and flushed under its temporary name. Errors wrapped "JOB: writing
  // NAME".
  Status StageSmallFile(const std::string& name, std::span<const std::byte> bytes);
  // Publishes the image, then the small files in the order staged. On a
  // failure (a commit can fail after its rename, syncing the folder), the
  // last small file (the manifest) is removed first, then the image and the
  // others, so that no manifest ever names a removed file; the error is
  // wrapped "JOB". On success the folder is the chain's for good (no
  // first-backup cleanup).
  Status Commit();

  // A merge's staged version of NAME (".NAME.merge-new", MergeStagedName),
  // written durably (Env::WriteFileAtomic); the merge journal renames it.
  // Returns its size.
  Result<uint64_t> StageReplacement(const std::string& name, std::span<const std::byte> bytes);

 private:
  ChainWriter(Env& env, ChainWriterOptions options) : env_(env), options_(std::move(options)) {}

  Env& env_;
  ChainWriterOptions options_;
  std::optional<ChainLock> own_lock_;
  ChainFolder chain_;
  FileAccess access_;
  // Folders this writer made (parent first); empty once committed.
  std::vector<std::string> created_dirs_;
  bool cleanup_armed_ = false;
  std::unique_ptr<StagedFile> image_;
  std::vector<std::unique_ptr<StagedFile>> small_;
};

}  // namespace barge::pipeline
