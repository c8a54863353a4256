// A replicate's destinations (pipeline/replicate_steps.h): each decided
// (an existing matching copy reused, another refused without --force), a
// staged copy of an interrupted run found and checked (pipeline/resume.h),
// and the copy's output and writer opened, new or resumed.
#include <algorithm>

#include "blockio/path.h"
#include "formats/qcow2_writer.h"
#include "pipeline/destination_spec.h"
#include "pipeline/overlay_destination.h"
#include "pipeline/replicate_steps.h"
#include "pipeline/resume.h"

namespace barge::pipeline::replicate_steps {

namespace {

// Forwards to the real destination and reports its own progress, so each
// copy's line moves at the speed of its writer, not of the reader.
class ProgressDestination final : public Destination {
 public:
  ProgressDestination(std::unique_ptr<Destination> inner, size_t index, uint64_t total,
                      const std::function<void(size_t, uint64_t, uint64_t)>* progress)
      : inner_(std::move(inner)), index_(index), total_(total), progress_(progress) {}

  const std::string& name() const override { return inner_->name(); }
  formats::Compression compression() const override { return inner_->compression(); }
  Status Consume(const Chunk& chunk) override {
    BARGE_RETURN_IF_ERROR(inner_->Consume(chunk));
    if (progress_ && *progress_) {
      auto now = std::chrono::steady_clock::now();
      if (now - last_ >= std::chrono::milliseconds(100)) {
        last_ = now;
        (*progress_)(index_, chunk.offset_bytes + chunk.length_bytes, total_);
      }
    }
    return OkStatus();
  }
  Status Finish() override {
    BARGE_RETURN_IF_ERROR(inner_->Finish());
    if (progress_ && *progress_) (*progress_)(index_, total_, total_);
    return OkStatus();
  }

 private:
  std::unique_ptr<Destination> inner_;
  size_t index_;
  uint64_t total_;
  const std::function<void(size_t, uint64_t, uint64_t)>* progress_;  // must outlive this
  std::chrono::steady_clock::time_point last_{};
};

// Every copy's destination; qcow2 copies carry the bitmaps, and with
// --backing keep store only the source's top layer.
DestinationSpec CopyDestinationSpec(const Job& job) {
  DestinationSpec spec;
  spec.format = job.out_qcow2 ? DestinationFormat::kQcow2 : DestinationFormat::kRaw;
  spec.virtual_size = job.result.virtual_size;
  spec.cluster_bytes = job.options.copy.cluster_bytes;
  spec.compression = job.options.copy.compression;
  spec.bitmaps = job.bitmaps;
  if (job.keep) {
    spec.backing_file = job.result.backing_file;
    spec.backing_format = job.result.backing_format;
    spec.overlay_allocated = &job.top_allocation;
  }
  return spec;
}

// Decides what becomes of destination `i`: refused (failed), reused by the
// expected checksum (never written), or written in this pass (returned).
std::optional<Pending> DecideDestination(Job& job, size_t i) {
  const std::string& path = job.destinations[i];
  job.result.replicas[i].path = job.Shown(i);
  if (job.IsNbd(i)) {
    // An export is never reused (nothing says it still holds what a record
    // describes) and is written in place; it needs --force when it holds
    // data, unless it holds what this tool wrote there before.
    Pending p;
    p.index = i;
    p.nbd_ours = job.env.Exists(ReplicaRecordPath(job.RecordBase(i))) || job.env.Exists(job.JournalPathFor(i));
    p.replaces_existing = true;
    return p;
  }
  auto status = job.env.Stat(path);
  if (!status.ok() && status.error().code() != ErrorCode::kNotFound) {
    job.Fail(i, status.error());
    return std::nullopt;
  }
  bool exists = status.ok();
  if (exists && !status->is_regular()) {
    job.Fail(i, Error::NotSupported("destination is not a regular file").set_path(path));
    return std::nullopt;
  }
  Pending p;
  p.index = i;
  if (!exists) return p;
  auto record = ReadReplicaRecord(job.env, path);
  bool usable = record.ok() && record->format == job.result.format &&
                record->virtual_size == job.result.virtual_size &&
                record->backing_file == job.result.backing_file && FileMatchesRecord(job.env, path, *record);
  if (usable && !job.expected.empty() && Lower(record->sha512) == job.expected) {
    job.result.replicas[i].state = ReplicaState::kReused;
    job.result.replicas[i].file_bytes = record->file_bytes;
    job.reused_pre.push_back(i);
    return std::nullopt;
  }
  if (usable && job.expected.empty()) {
    p.maybe_reuse = *record;
  } else if (!job.options.force) {
    job.Fail(i, Error::InvalidArgument("exists and is not a matching copy (use --force to replace it)")
                    .set_path(path));
    return std::nullopt;
  }
  p.replaces_existing = true;
  return p;
}

// What makes a run "the same replicate" as one that staged a copy
// (pipeline/backup_resume.h's key, its fields put to a copy's use).
ResumeKey KeyFor(const Job& job, size_t i) {
  ResumeKey k;
  k.id = "replicate";
  k.image = job.IsNbd(i) ? job.Shown(i) : BaseName(job.destinations[i]);
  k.type = "copy:" + job.result.format;
  k.disk = RedactNbdUri(job.options.source_location);  // never its credentials
  if (!job.options.resume_identity.empty()) {
    k.disk = job.options.resume_identity;
  } else if (auto st = job.env.Stat(job.options.source_location); st.ok() && st->is_regular()) {
    // A source file changed since (a VM wrote it) would mix two states.
    k.source_stamp = std::to_string(st->size_bytes) + "@" + std::to_string(st->mtime_ns);
  }
  k.virtual_size = job.result.virtual_size;
  k.cluster_size = job.options.copy.cluster_bytes;
  k.compression = job.out_qcow2 ? formats::CompressionSpec{job.options.copy.compression,
                                                           job.options.copy.compression_level}
                                      .ToString()
                                : std::string("none");
  k.parent = job.source.info().format == formats::ImageFormat::kQcow2 ? job.source.info().backing_file : "";
  k.work_digest = RangesDigest(WholeDisk(job.source));
  k.tool_version = kReplicateToolVersion;
  return k;
}

// Opens what an interrupted run staged for destination i, to read it back:
// the temporary beside a file, the export itself for an NBD target.
Result<std::unique_ptr<BlockSource>> OpenStagedCopy(Job& job, size_t i) {
  const std::string& d = job.destinations[i];
  if (!job.IsNbd(i)) return job.env.OpenSource(TempPathFor(d));
  BARGE_ASSIGN_OR_RETURN(NbdOptions options, NbdOptionsFor(job.env, d, job.options.nbd));
  options.retry = job.options.copy.nbd_retry;
  return OpenNbdSource(d, options);
}

// Looks for what a killed or failed run staged for pending copy `p`: keeps
// it in p.staged when its journal's key matches and some of its clusters
// check out; else removes its journal (the temporary is replaced as
// usual). Returns why it was not (or not all) kept, "" when it was, and
// nullopt when nothing was staged.
std::optional<std::string> FindStagedCopy(Job& job, Pending& p, const DestinationSpec& spec) {
  const std::string& path = job.destinations[p.index];
  p.journal_path = job.JournalPathFor(p.index);
  ResumeTerms terms;
  terms.refused = !job.options.resume ? std::string("resuming is off")
                  : job.keep          ? std::string("--backing keep copies are not resumed")
                                      : std::string();
  terms.expected = [&job, &p](const ResumeKey&) { return KeyFor(job, p.index); };
  std::unique_ptr<KeptData> kept;
  if (!job.out_qcow2) {
    // An export that cannot be reached now still holds what the journal
    // says: the journal stays for a run that reaches it (this one fails to
    // open it as its output too, before writing anything).
    kept = std::make_unique<StagedRaw>(
        "the staged copy", [&job, &p] { return OpenStagedCopy(job, p.index); }, job.result.virtual_size,
        spec.cluster_bytes, job.IsNbd(p.index));
  } else if (auto options = Qcow2OptionsFor(spec); options.ok()) {
    kept = std::make_unique<StagedQcow2>(
        job.env, "the staged copy", [path](const ResumeKey&) { return TempPathFor(path); }, *options);
  } else {
    kept = std::make_unique<KeptCheck>("the staged copy",
                                       [e = options.error()](const LoadedJournal&) -> Result<StagedCheck> { return e; });
  }
  ResumeDecision found = FindResume(job.env, ResumeSite{p.journal_path, ""}, terms, *kept);
  if (!found.found()) return std::nullopt;
  if (found.resumed()) p.staged = found.KeptJournal();
  return found.reason;
}

// Feeds the job's SHA-512 with the kept part of a staged copy (the source's
// bytes below the resume point, as the copy holds them: journaled clusters
// checked against their digests, zeros elsewhere) and collects their
// digests. Read from the copy, not the source.
Status HashKeptPart(Job& job, const Pending& p, const DestinationSpec& spec) {
  LoadedJournal kept = JournalUpTo(*p.staged, job.resume_cluster);
  const uint64_t end = std::min(job.result.virtual_size, job.resume_cluster * spec.cluster_bytes);
  uint64_t fed = 0;
  auto feed = [&](uint64_t index, std::span<const std::byte> bytes) -> Status {
    BARGE_RETURN_IF_ERROR(job.sha512.UpdateZeros(index * spec.cluster_bytes - fed));
    BARGE_RETURN_IF_ERROR(job.sha512.Update(bytes));
    fed = index * spec.cluster_bytes + bytes.size();
    return OkStatus();
  };
  const std::string staged = TempPathFor(job.destinations[p.index]);
  Result<StagedCheck> check = Error::InvalidArgument("no check");
  if (job.out_qcow2) {
    BARGE_ASSIGN_OR_RETURN(formats::Qcow2WriterOptions options, Qcow2OptionsFor(spec));
    // A journal cut short of its last checkpoint ends where its kept
    // clusters' layout does.
    BARGE_ASSIGN_OR_RETURN(auto layout, formats::Qcow2Writer::PlanStored(options, StoredClusters(kept.entries)));
    kept.end_bytes = layout.end_bytes;
    check = CheckStaged(job.env, staged, options, kept, feed);
  } else {
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> src, OpenStagedCopy(job, p.index));
    check = CheckStagedRaw(*src, job.result.virtual_size, spec.cluster_bytes, kept, feed);
  }
  if (!check.ok()) return std::move(check).error();
  if (check->next_cluster != job.resume_cluster) {
    return Error::Corruption("the staged copy changed while it was read back: " + check->problem)
        .set_path(job.Shown(p.index));
  }
  BARGE_RETURN_IF_ERROR(job.sha512.UpdateZeros(end - fed));
  for (const JournalEntry& e : kept.entries) {
    if (e.stored.kind != formats::StoredKind::kZero) job.kept_digests.push_back({e.stored.cluster_index, e.digest});
  }
  return OkStatus();
}

// The copy's writer, new or resumed from its staged temporary (p.staged
// cut at job.resume_cluster), in p.writer; with job.options.resume also
// its journal (p.journal). Returns the function that makes what the
// writer stored durable, for the journal's checkpoints (empty for a
// --backing keep copy, which keeps no journal).
Result<std::function<Result<uint64_t>()>> MakeCopyWriter(Job& job, Pending& p, const DestinationSpec& spec) {
  BlockSink& sink = p.output->sink();
  const uint64_t cs = spec.cluster_bytes;
  std::vector<JournalEntry> kept;
  if (job.resume_cluster > 0) kept = JournalUpTo(*p.staged, job.resume_cluster).entries;
  std::function<Result<uint64_t>()> sync;
  if (job.out_qcow2 && !job.keep) {
    BARGE_ASSIGN_OR_RETURN(formats::Qcow2WriterOptions options, Qcow2OptionsFor(spec));
    std::unique_ptr<formats::Qcow2Writer> writer;
    BlockSink* target = &sink;
    if (job.resume_cluster > 0) {
      p.resumed_sink = std::make_unique<ResumedSink>(sink);
      target = p.resumed_sink.get();
      BARGE_ASSIGN_OR_RETURN(writer, formats::Qcow2Writer::Resume(*target, options, StoredClusters(kept)));
    } else {
      BARGE_ASSIGN_OR_RETURN(writer, formats::Qcow2Writer::Create(*target, options));
    }
    auto q = std::make_unique<Qcow2Destination>(std::move(writer), target->name(), spec.compression, spec.zero_policy);
    Qcow2Destination* made = q.get();
    sync = [made]() { return made->writer().Sync(); };
    p.writer = std::move(q);
  } else if (!job.out_qcow2) {
    BlockSink* target = &sink;
    if (job.resume_cluster > 0 && !p.output->in_place()) {
      // What a killed run wrote past the kept part goes: the rest is
      // written again as on a new file (holes skipped). An export keeps
      // its size and is written over, holes as zeroes, as on a first run.
      BARGE_RETURN_IF_ERROR(sink.Truncate(std::min(job.result.virtual_size, job.resume_cluster * cs)));
      p.resumed_sink = std::make_unique<ResumedSink>(sink);
      target = p.resumed_sink.get();
    }
    RawDestinationOptions r;
    r.virtual_size = spec.virtual_size;
    r.skip_zeroes_if_zero_initialized = spec.skip_zeroes_if_zero_initialized;
    p.writer = std::make_unique<RawDestination>(*target, r);
    sync = [target]() -> Result<uint64_t> {
      BARGE_RETURN_IF_ERROR(target->Flush());
      return target->size_bytes();
    };
  } else {
    BARGE_ASSIGN_OR_RETURN(p.writer, MakeDestination(sink, spec));  // --backing keep: never resumed
    return sync;
  }
  if (job.options.resume) {
    BARGE_ASSIGN_OR_RETURN(uint64_t end, sync());
    BARGE_ASSIGN_OR_RETURN(p.journal, ResumeJournal::Create(job.env, p.journal_path, KeyFor(job, p.index), kept,
                                                            job.resume_cluster, end));
  }
  return sync;
}

// Copy-job steps 2 and 3 for one copy: opens its output (staged under a
// temporary name) and makes its destination; false (failed) when either fails.
bool OpenCopyOutput(Job& job, Pending& p, const DestinationSpec& dest_spec) {
  const bool resumed = job.resume_cluster > 0;
  OutputSpec out_spec;
  out_spec.location = job.destinations[p.index];
  out_spec.replace = OutputReplace::kReplace;  // decided by DecideDestination
  out_spec.allow_nbd = false;
  out_spec.sweep = false;                      // swept once per folder
  out_spec.adopt = resumed;
  if (job.IsNbd(p.index)) {
    out_spec.allow_nbd = true;
    out_spec.replace = OutputReplace::kForceIfHoldsData;
    out_spec.force = job.options.force || p.nbd_ours;
    out_spec.nbd = job.options.nbd;
    out_spec.nbd_retry = job.options.copy.nbd_retry;
    out_spec.size_bytes = job.result.virtual_size;
    out_spec.adopt = false;
  }
  auto output = OpenOutput(job.env, out_spec);
  if (!output.ok()) {
    // An export not opened was not written: what its journal describes is
    // still there for the next run.
    if (!job.IsNbd(p.index)) job.DropJournal(p);
    job.Fail(p.index, std::move(output).error());
    return false;
  }
  p.output = std::move(output).value();
  if (p.output->in_place()) {
    // The export is about to change: an old record must not describe it.
    if (Status s = job.env.UnlinkIfExists(ReplicaRecordPath(job.RecordBase(p.index))); !s.ok()) {
      job.Abandon(p, std::move(s).error());
      return false;
    }
  }
  auto made = MakeCopyWriter(job, p, dest_spec);
  if (!made.ok()) {
    job.Abandon(p, std::move(made).error());
    return false;
  }
  std::unique_ptr<Destination> dest;
  if (p.journal != nullptr) {
    const uint64_t from = std::min(job.result.virtual_size, job.resume_cluster * dest_spec.cluster_bytes);
    auto journaled = std::make_unique<JournaledDestination>(*p.writer, std::move(made).value(), *p.journal, false,
                                                            CheckpointBytes(job.result.virtual_size - from),
                                                            kCheckpointInterval);
    p.journaled = journaled.get();
    dest = std::move(journaled);
  } else {
    dest = std::move(p.writer);
  }
  p.destination =
      std::make_unique<ProgressDestination>(std::move(dest), p.index, job.result.virtual_size, &job.options.progress);
  return true;
}

}  // namespace

// Decides every destination, where the pass starts (the resume point: the
// least of what every copy to be written kept from an interrupted run, or
// 0), and opens those to be written in this pass. `spared` (locks keeping
// staged temporaries from the sweep) is released before they are adopted.
std::vector<Pending> OpenDestinations(Job& job, std::vector<std::unique_ptr<EnvLock>>& spared) {
  job.result.replicas.resize(job.destinations.size());
  DestinationSpec dest_spec = CopyDestinationSpec(job);
  std::vector<Pending> decided;
  for (size_t i = 0; i < job.destinations.size(); ++i) {
    std::optional<Pending> p = DecideDestination(job, i);
    if (p) decided.push_back(std::move(*p));
  }
  std::optional<ResumeNote> note;
  uint64_t resume = decided.empty() ? 0 : ~uint64_t{0};
  for (Pending& p : decided) {
    std::optional<std::string> problem = FindStagedCopy(job, p, dest_spec);
    if (problem && !note) note.emplace();
    if (problem && note->problem.empty()) note->problem = *problem;
    resume = p.staged ? std::min(resume, p.staged->next_cluster) : 0;
  }
  if (note && resume == 0 && note->problem.empty()) note->problem = "another copy has nothing staged";
  job.resume_cluster = resume;
  if (resume > 0) {
    Status hashed = HashKeptPart(job, decided.front(), dest_spec);
    if (!hashed.ok()) {
      note->problem = "the staged copy cannot be read back (" + hashed.error().message() + ")";
      job.resume_cluster = 0;
      job.sha512.Reset();
      job.kept_digests.clear();
    }
  }
  if (note) {
    note->resumed = job.resume_cluster > 0;
    note->total_bytes = job.result.virtual_size;
    note->staged_bytes = std::min(job.result.virtual_size, job.resume_cluster * dest_spec.cluster_bytes);
    job.result.resume = note;
    if (job.options.on_resume) job.options.on_resume(*note);
  }
  if (job.resume_cluster == 0) {
    for (Pending& p : decided) {
      if (p.staged) job.DropJournal(p);
      p.staged.reset();
    }
  }
  spared.clear();
  std::vector<Pending> pending;
  for (Pending& p : decided) {
    if (p.journal_path.empty()) p.journal_path = job.JournalPathFor(p.index);
    if (OpenCopyOutput(job, p, dest_spec)) pending.push_back(std::move(p));
  }
  return pending;
}

}  // namespace barge::pipeline::replicate_steps
