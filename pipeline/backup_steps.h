// The steps of a backup (pipeline/backup.h's RunBackup) and what they
// carry from one to the next. Internal to the backup: backup.cc opens the
// source and chain and plans the work; backup_image.cc finds what a killed
// run staged, makes the image, copies into it and commits it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/extent.h"
#include "formats/digest_table.h"
#include "formats/manifest.h"
#include "pipeline/backup.h"
#include "pipeline/backup_resume.h"
#include "pipeline/chain.h"
#include "pipeline/chain_folder.h"
#include "pipeline/clean_sample.h"
#include "pipeline/copy.h"
#include "pipeline/destination.h"
#include "pipeline/digest_changes.h"
#include "pipeline/endpoints.h"
#include "pipeline/export_lock.h"
#include "pipeline/resume.h"

namespace barge::pipeline::backup_steps {

// What a backup carries from one step to the next. Declared in the order
// the steps fill it: the chain writer goes before the source is closed.
struct BackupRun {
  SourceSpec spec;
  OpenedSource src;
  uint64_t size = 0;
  formats::DiskIdentity identity;
  std::unique_ptr<ChainWriter> writer;
  uint32_t cluster = 0;
  formats::DigestTable parent_digests;  // an incremental's parent's
  // The parent's strong table (digest modes; or kept by the chain), the
  // scan of the source against it, what the record missed, and whether
  // this point keeps a strong table.
  std::optional<PointStrongTable> parent_strong;
  std::optional<DigestChanges> scan;
  RangeList missed;
  uint64_t missed_clusters = 0;
  bool write_strong = false;
  std::string dirty_description;
  RangeList work;
  formats::BackupManifest m;
  // Resume: the run's start (also a resumed run's own: the point holds the
  // source as this run reads it, so its time and id are this run's, never
  // the killed run's), the journal's key and path, the staged image's name
  // (the killed run's point's; renamed to this run's), the staged clusters
  // kept and the guest cluster the copy goes on from; `remaining` is the
  // work from there.
  std::string started_at;
  std::string staged_image;
  ResumeKey key;
  ResumeSite site;  // the chain folder's journal and work set (BackupResumeSite)
  std::vector<JournalEntry> kept;
  uint64_t resume_cluster = 0;
  RangeList remaining;
  RangeList changed_since_staged;  // req.staged_earlier: the changes since its checkpoint
  std::optional<ResumeNote> note;
  std::unique_ptr<ResumeJournal> journal;
  std::vector<std::string> stale;  // killed runs' temporaries the sweep removed (RemoveLeftovers)
  // --base: the base chain's folder (held by an export lock, so that no
  // merge or forget removes the point meanwhile), the point, opened.
  std::string base_dir;
  std::unique_ptr<ExportLock> base_lock;
  ChainFolder base_chain;
  std::optional<OpenedPoint> base_point;
  uint64_t base_compared_bytes = 0;
  CleanSample clean_sample;
  std::string replaced;  // the sample found another disk: why a full instead
  bool over_parent() const { return m.parent.has_value() || m.base.has_value(); }
};

// A point's id: its sequence and the run's start.
std::string IdFor(uint32_t sequence, const std::string& started_at);

// Looks for what a killed or failed run of this backup staged (FindResume
// over the chain folder's site): resumes from it when its key matches and
// its clusters check out (run.kept, run.resume_cluster, run.staged_image),
// else its journal goes. Then removes the chain folder's leftovers
// (sparing a resumed staged image) and sets run.remaining and run.note.
Status FindStaged(Env& env, const BackupRequest& req, BackupRun& run);

// 3. Makes the destination: the point's qcow2 image, staged in the chain
// folder, or the staged one a killed run left, taken over. With
// req.resume, starts the journal (holding what was kept). `resumed_sink`
// must outlive the destination.
Result<std::unique_ptr<Qcow2Destination>> MakeImage(Env& env, const BackupRequest& req, BackupRun& run,
                                                    std::unique_ptr<ResumedSink>& resumed_sink);

// 4. Runs the copy of what is left of the work set into `dest`.
Result<CopyResult> CopyWork(const BackupRequest& req, BackupRun& run, Destination& dest);

// After a failed copy: keeps the staged image and journal for the next run
// when the source failed and the request keeps them, else discards the
// journal. Returns `error`, worded for what was kept.
Error KeepOrDrop(Env& env, const BackupRequest& req, BackupRun& run, JournaledDestination* journaled, Error error);

// 5. Commits the point: digests and manifest staged beside the image,
// then all published.
Status CommitPoint(Env& env, BackupRun& run, const CopyResult& copied, const formats::Qcow2WriterStats& stats,
                   std::chrono::steady_clock::time_point start);

}  // namespace barge::pipeline::backup_steps
