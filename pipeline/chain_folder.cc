// The chain-folder writer's protocol: lock, load, sweep, stage, commit.
#include "pipeline/chain_folder.h"

#include <cctype>
#include <set>

#include "blockio/path.h"
#include "pipeline/chain_files.h"
#include "pipeline/merge_journal.h"
#include "pipeline/verification_record.h"

namespace barge::pipeline {

Result<std::unique_ptr<ChainWriter>> ChainWriter::Open(Env& env, const std::string& dir,
                                                       const ChainWriterOptions& options) {
  std::unique_ptr<ChainWriter> w(new ChainWriter(env, options));
  const ChainLock* lock = options.held;
  if (lock == nullptr && options.create) {
    // Before any folder is made in a target another user controls.
    BARGE_RETURN_IF_ERROR(CheckFolderOwner(env, dir));
    // The folders this run creates (parent, then chain folder): a first
    // backup that fails removes them again.
    for (const std::string& d : {options.parent_dir, dir}) {
      if (d.empty()) continue;
      auto st = env.Stat(d);
      if (!st.ok() && st.error().code() == ErrorCode::kNotFound) w->created_dirs_.push_back(d);
    }
    for (int attempt = 0; !w->own_lock_; ++attempt) {
      BARGE_RETURN_IF_ERROR(CreateFolders(env, dir, options.access.value_or(FileAccess::Private())));
      auto acquired = ChainLock::Acquire(env, dir);
      // A failed first backup of the same chain may have removed the folder
      // between our mkdir and our lock: make it again.
      if (!acquired.ok() && acquired.error().code() == ErrorCode::kNotFound && attempt < 3) continue;
      if (!acquired.ok()) return acquired.error();
      w->own_lock_.emplace(std::move(acquired).value());
    }
    lock = &*w->own_lock_;
  } else if (lock == nullptr) {
    BARGE_ASSIGN_OR_RETURN(ChainLock taken, ChainLock::Acquire(env, dir));
    w->own_lock_.emplace(std::move(taken));
    lock = &*w->own_lock_;
  }
  if (options.access) BARGE_RETURN_IF_ERROR(ShareFolder(env, dir, *options.access));
  BARGE_ASSIGN_OR_RETURN(w->access_, FolderAccess(env, dir));
  BARGE_ASSIGN_OR_RETURN(w->chain_, LoadChainFolder(env, dir, lock));
  if (options.remove_leftovers) BARGE_RETURN_IF_ERROR(w->RemoveLeftovers());
  // From here on a failed first backup leaves no lock file and no empty
  // folder behind.
  w->cleanup_armed_ = options.create && w->own_lock_ && w->chain_.empty();
  return w;
}

ChainWriter::~ChainWriter() {
  // Staged files first (the manifest's, then the digests', then the
  // image's temporary), while the lock is still held.
  while (!small_.empty()) small_.pop_back();
  image_.reset();
  if (!cleanup_armed_) return;
  IgnoreError(own_lock_->RemoveLockFile(), "a failed backup's error is on its way; a stale .lock is harmless");
  // Deepest first; RemoveDir fails on a folder someone else filled.
  for (auto it = created_dirs_.rbegin(); it != created_dirs_.rend(); ++it) {
    IgnoreError(env_.RemoveDir(*it), "a folder another job filled meanwhile stays");
  }
}

// Removes images, digest tables (.digests, .sha256) and verification records that no manifest
// names (what a run killed between renames leaves, and the records of
// points a merge folded), and temporaries no live writer holds. Called
// with the chain lock held.
Result<std::vector<std::string>> ChainWriter::RemoveLeftovers(const std::string& keep_temporary) {
  std::set<std::string> named;
  for (const auto& p : chain_.points) {
    named.insert(p.manifest.image);
    named.insert(p.manifest.digest_table);
    if (!p.manifest.strong_digest_table.empty()) named.insert(p.manifest.strong_digest_table);
    named.insert(VerificationFileName(p.manifest.id));
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env_.ListDir(chain_.dir));
  for (const std::string& name : names) {
    std::string ext = Extension(name);
    bool ours = !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])) &&
                (ext == ".qcow2" || ext == ".digests" || ext == ".sha256" || ext == ".verified");
    if (ours && !named.count(name)) BARGE_RETURN_IF_ERROR(env_.UnlinkIfExists(chain_.PathOf(name)));
  }
  // The sweep takes only unlocked temporaries: holding the kept one's lock
  // while it runs spares it.
  std::unique_ptr<EnvLock> spared;
  if (!keep_temporary.empty()) {
    LockOptions lo;
    lo.create = false;
    auto lock = env_.LockFile(chain_.PathOf(keep_temporary), lo);
    if (lock.ok()) spared = std::move(lock).value();
  }
  return SweepStaleTemporaries(env_, chain_.dir);
}

void ChainWriter::SweepTemporaries() {
  IgnoreError(SweepStaleTemporaries(env_, chain_.dir), "a leftover that cannot be removed now goes at a later run");
}

Result<BlockSink*> ChainWriter::StageImage(const std::string& name) {
  auto created = StagedFile::Create(env_, chain_.PathOf(name), /*overwrite=*/false, /*sync=*/true, &access_);
  if (!created.ok()) return std::move(created).error().Wrap(options_.job + ": starting " + name);
  image_ = std::move(created).value();
  return &image_->sink();
}

Result<BlockSink*> ChainWriter::AdoptStagedImage(const std::string& name) {
  auto adopted = StagedFile::Adopt(env_, chain_.PathOf(name));
  if (!adopted.ok()) return std::move(adopted).error().Wrap(options_.job + ": resuming " + name);
  image_ = std::move(adopted).value();
  return &image_->sink();
}

Status ChainWriter::KeepStagedImage() {
  if (image_ == nullptr) return OkStatus();
  Status kept = image_->Keep();
  image_.reset();
  if (kept.ok()) cleanup_armed_ = false;  // the folder holds what the next run resumes
  return kept;
}

Status ChainWriter::StageSmallFile(const std::string& name, std::span<const std::byte> bytes) {
  auto created = StagedFile::Create(env_, chain_.PathOf(name), /*overwrite=*/false, /*sync=*/true, &access_);
  if (!created.ok()) return std::move(created).error().Wrap(options_.job + ": writing " + name);
  small_.push_back(std::move(created).value());
  StagedFile& out = *small_.back();
  Status st = out.sink().WriteAt(0, bytes);
  if (st.ok()) st = out.sink().Flush();
  if (!st.ok()) return std::move(st).error().Wrap(options_.job + ": writing " + name);
  return OkStatus();
}

Status ChainWriter::Commit() {
  Status committed = image_ != nullptr ? image_->Commit() : OkStatus();
  for (size_t i = 0; committed.ok() && i < small_.size(); ++i) committed = small_[i]->Commit();
  // A chain folder this run made (and its parent, if made too) is durable
  // only once the folder holding it is synced: else a power loss after the
  // backup reported done loses the whole new chain (the reliability
  // campaign's backup-base scenario, the first to write into a new chain
  // folder, found it). A failure here is a failed commit, undone below.
  for (size_t i = 0; committed.ok() && i < created_dirs_.size(); ++i) {
    committed = env_.SyncDir(DirName(created_dirs_[i]));
  }
  if (!committed.ok()) {
    // A commit can fail after its rename (syncing the folder): the manifest
    // goes first so that no manifest ever names a removed file.
    Error e = Error(committed.error()).Wrap(options_.job);
    std::vector<std::string> order;
    if (!small_.empty()) order.push_back(small_.back()->final_path());
    if (image_ != nullptr) order.push_back(image_->final_path());
    for (size_t i = 0; i + 1 < small_.size(); ++i) order.push_back(small_[i]->final_path());
    for (const std::string& path : order) e.Also(env_.UnlinkIfExists(path));
    return e;
  }
  cleanup_armed_ = false;  // the chain has its point
  return OkStatus();
}

Result<uint64_t> ChainWriter::StageReplacement(const std::string& name, std::span<const std::byte> bytes) {
  BARGE_RETURN_IF_ERROR(WriteFileWithAccess(env_, chain_.PathOf(MergeStagedName(name)), bytes, access_));
  return bytes.size();
}

}  // namespace barge::pipeline
