// The steps of a replicate (pipeline/replicate.h's RunReplicate) and what
// they carry: the job and each destination being written. Internal to the
// replicate: replicate_destinations.cc decides and opens each destination
// (reused, refused, new or resumed through pipeline/resume.h);
// replicate.cc runs the copy pass, checks, records and commits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/extent.h"
#include "formats/image.h"
#include "pipeline/backup_resume.h"
#include "pipeline/destination.h"
#include "pipeline/endpoints.h"
#include "pipeline/output.h"
#include "pipeline/replicate.h"
#include "pipeline/resume.h"
#include "pipeline/stages.h"

namespace barge::pipeline::replicate_steps {

// The writer's version in a resume journal's key: a staged copy of another
// version's layout is never continued.
constexpr char kReplicateToolVersion[] = "0.1.0";

// One destination being written in this pass.
struct Pending {
  size_t index = 0;
  std::unique_ptr<Output> output;
  // Resuming (declared before `destination`, which points into them): the
  // sink over an adopted temporary, the copy's writer, its journal.
  std::unique_ptr<ResumedSink> resumed_sink;
  std::unique_ptr<Destination> writer;
  std::unique_ptr<ResumeJournal> journal;
  JournaledDestination* journaled = nullptr;  // inside `destination`, or null
  std::string journal_path;
  // A staged copy of an interrupted run that checked out, cut to what it
  // verified; nullopt when there is none to resume from.
  std::optional<LoadedJournal> staged;
  std::unique_ptr<Destination> destination;
  // An existing copy with a readable record whose checksum is unknown until
  // the pass ends: reused (and the temporary dropped) when it matches.
  std::optional<ReplicaRecord> maybe_reuse;
  bool replaces_existing = false;
  // An NBD target that this tool's record or journal names: written over
  // without --force (it holds what an earlier run wrote).
  bool nbd_ours = false;
  // An NBD target's size, taken before its connection is closed for the
  // read-back.
  uint64_t export_bytes = 0;
};

// How a copy is opened to be read back.
struct CopyOpen {
  formats::ImageFormat format = formats::ImageFormat::kRaw;
  // --backing keep: open the chain the copy names (the logical content),
  // under the source's path policy; else the copy alone (it is flat).
  bool keep_backing = false;
  bool allow_any_path = false;
  std::vector<std::string> allow_dirs;
  // An NBD target: how to connect to it.
  NbdAccess nbd;
  NbdRetryPolicy nbd_retry;
};

// One replicate job: the request, the facts worked out once before any copy
// is opened, and the result each step fills in. Lives in RunReplicate's frame
// (DestinationSpec points into top_allocation).
struct Job {
  Job(Env& env, formats::Image& source, std::span<const std::string> destinations, const ReplicateOptions& options,
      std::string expected)
      : env(env), source(source), destinations(destinations), options(options), expected(std::move(expected)) {}

  Env& env;
  formats::Image& source;
  std::span<const std::string> destinations;
  const ReplicateOptions& options;
  std::string expected;  // lowercase; "" when none was given
  bool out_qcow2 = false;
  bool keep = false;  // --backing keep
  CopyOpen copy_open;
  RangeList top_allocation;                  // --backing keep: what each copy stores
  std::vector<formats::BitmapSpec> bitmaps;  // carried to each qcow2 copy
  std::vector<size_t> reused_pre;            // reused by expected checksum, never written
  ReplicateResult result;

  bool IsNbd(size_t i) const { return IsNbdUri(destinations[i]); }
  // Destination i as shown and recorded: an NBD URI without its secrets.
  std::string Shown(size_t i) const { return RedactNbdUri(destinations[i]); }
  // Where destination i's checksum record goes (ReplicaRecordPath of it):
  // beside a file, in the state folder for an NBD target.
  std::string RecordBase(size_t i) const {
    return IsNbd(i) ? NbdTargetStatePath(options.state_dir, destinations[i]) : destinations[i];
  }
  std::string JournalPathFor(size_t i) const {
    return IsNbd(i) ? NbdTargetStatePath(options.state_dir, destinations[i]) + ".barge-resume"
                    : ReplicaJournalPath(destinations[i]);
  }
  void Fail(size_t i, Error e) {
    result.replicas[i].state = ReplicaState::kFailed;
    result.replicas[i].error = std::move(e);
  }
  // Drops a pending copy's temporary (and its resume journal); a failure
  // to remove it is reported with the reason the copy failed.
  void Abandon(Pending& p, Error e) {
    DropJournal(p);
    Fail(p.index, std::move(e.Also(p.output->Abandon())));
  }
  void DropJournal(Pending& p) {
    p.journal.reset();
    // A journal whose copy is gone is never resumed.
    if (!p.journal_path.empty()) DiscardResume(env, ResumeSite{p.journal_path, ""});
  }
  uint64_t resume_cluster = 0;  // where this pass starts (0: from the start)
  Sha512Stream sha512;          // fed with the kept part when resuming
  std::vector<ClusterDigest> kept_digests;  // the kept part's data clusters
};

// `s` in lowercase (ASCII).
std::string Lower(std::string s);

// Decides every destination (reuse, refuse, write; a staged copy of an
// interrupted run resumed or discarded, job.resume_cluster the pass's
// start) and opens the ones to write. `spared` holds the locks on staged
// copies taken before the folders were swept; they go once decided.
std::vector<Pending> OpenDestinations(Job& job, std::vector<std::unique_ptr<EnvLock>>& spared);

}  // namespace barge::pipeline::replicate_steps
