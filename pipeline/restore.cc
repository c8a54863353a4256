// Restore and verify jobs.
#include "pipeline/restore.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "blockio/env.h"
#include "blockio/path.h"
#include "formats/qcow2_check.h"
#include "formats/units.h"
#include "pipeline/chain.h"
#include "pipeline/destination_spec.h"
#include "pipeline/output.h"
#include "pipeline/point_reader.h"
#include "pipeline/verification_record.h"

namespace barge::pipeline {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The layer file of `point`'s chain that holds a guest offset's bytes: a
// cluster that does not match its digest is named by it (the damaged file),
// not by the top image the copy reads through.
HolderLookup LayerHolding(const OpenedPoint& point) {
  return [&point](uint64_t offset) -> std::string {
    auto map = point.image->Map(offset, 1);
    if (!map.ok() || map->empty() || map->front().depth < 0) return "";
    const formats::Image* layer = point.image.get();
    for (int depth = map->front().depth; depth > 0 && layer != nullptr; --depth) layer = layer->backing();
    return layer != nullptr ? layer->info().path : "";
  };
}

// A copy of `point` checked against its digests: every cluster (a mismatch
// names the damaged layer), skipped zero runs as ranges, the image digest by
// the point's own fold. Whether zero runs are skipped is the caller's.
void CheckAgainst(CopyOptions& copy, const OpenedPoint& point) {
  copy.digest_algorithm = point.point->manifest.image_digest_algorithm;
  copy.verify = [&point](uint64_t c) { return point.Expected(c); };
  copy.verify_holder = LayerHolding(point);
  copy.verify_zero_run = [&point](uint64_t b, uint64_t e) { return FirstListedData(point.digests, b, e); };
}

}  // namespace

Result<RestoreResult> RunRestore(Env& env, const RestoreRequest& req) {
  auto start = std::chrono::steady_clock::now();
  if (req.output_format != "raw" && req.output_format != "qcow2") {
    return Error::InvalidArgument("output format must be raw or qcow2");
  }
  // A point's own manifest or image names its folder and the point, as
  // for verify and list.
  BARGE_ASSIGN_OR_RETURN(PointLocation where, LocatePoint(env, req.chain_dir, req.at));
  BARGE_ASSIGN_OR_RETURN(ChainFolder chain, LoadChainFolder(env, where.chain_dir));
  BARGE_ASSIGN_OR_RETURN(size_t index, chain.Resolve(where.at));
  BARGE_ASSIGN_OR_RETURN(OpenedPoint point, OpenPoint(env, chain, index));
  const formats::BackupManifest& m = point.point->manifest;
  // Block devices and NBD exports are written in place, raw.
  BARGE_ASSIGN_OR_RETURN(OutputKind kind, OutputKindOf(env, req.destination));
  if (kind != OutputKind::kFile && req.output_format != "raw") {
    return Error::InvalidArgument("block devices and NBD exports take raw output").set_path(RedactNbdUri(req.destination));
  }
  OutputSpec out_spec;
  out_spec.location = req.destination;
  out_spec.nbd = req.destination_nbd;
  out_spec.replace = OutputReplace::kForceIfHoldsData;
  out_spec.force = req.force;
  out_spec.sync = req.sync;
  out_spec.access = req.access;
  out_spec.size_bytes = m.virtual_size;
  out_spec.nbd_retry = req.copy.nbd_retry;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Output> output, OpenOutput(env, out_spec));
  // Said once the destination is accepted (a refused one says only why).
  if (req.on_point) req.on_point(index, m);

  DestinationSpec dest_spec;
  dest_spec.format = req.output_format == "qcow2" ? DestinationFormat::kQcow2 : DestinationFormat::kRaw;
  dest_spec.virtual_size = m.virtual_size;
  dest_spec.cluster_bytes = m.cluster_size;
  dest_spec.compression = req.compression;
  // Over existing bytes, zero ranges must really be written.
  dest_spec.skip_zeroes_if_zero_initialized = !output->in_place();
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Destination> dest, MakeDestination(output->sink(), dest_spec));

  CopyOptions copy = req.copy;
  copy.cluster_bytes = m.cluster_size;
  copy.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, m.cluster_size);
  copy.compression = req.output_format == "qcow2" ? req.compression : formats::Compression::kNone;
  copy.compression_level = req.compression_level;
  CheckAgainst(copy, point);
  // Runs reading as zeros stay holes (a new qcow2: unallocated; a raw file
  // that reads as zeros: not written) and cost nothing per cluster.
  copy.skip_zero_extents = dest_spec.skip_zeroes_if_zero_initialized && output->sink().capabilities().zero_initialized;
  Destination* dests[] = {dest.get()};
  auto copied = RunCopy(*point.image, {{0, m.virtual_size}}, dests, copy);
  if (!copied.ok()) return Error(copied.error()).Wrap("restore of " + m.id);
  if (copied->image_digest != m.image_digest) {
    return Error::Corruption("restored image digest " + copied->image_digest.ToHex() +
                             " differs from the manifest's " + m.image_digest.ToHex())
        .set_path(point.point->manifest_path);
  }
  BARGE_RETURN_IF_ERROR(output->Commit());

  RestoreResult r;
  r.manifest = m;
  r.position = index;
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  r.layers = layers.size();
  r.bytes_read = copied->bytes_read;
  r.bytes_written = (copied->clusters.data + copied->clusters.compressed) * uint64_t{m.cluster_size};
  r.image_digest = copied->image_digest;
  r.seconds = SecondsSince(start);
  return r;
}

namespace {

// A point whose backup data passed verification, ready for `against`.
struct VerifiedPoint {
  OpenedPoint point;
  CopyOptions copy;  // as used, but for `verify` (it pointed at the local point)
  uint64_t bytes_read = 0;
  uint64_t clusters_checked = 0;
};

// Checks point `index` itself: manifests, digest tables, the structure of
// each layer not checked yet, every cluster's digest and the image digest.
Result<VerifiedPoint> VerifyPointData(Env& env, const ChainFolder& chain, size_t index, const CopyOptions& options,
                                      std::vector<bool>& structure_checked) {
  VerifiedPoint v;
  BARGE_ASSIGN_OR_RETURN(v.point, OpenPoint(env, chain, index));
  const formats::BackupManifest& m = v.point.point->manifest;
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  for (size_t l : layers) {
    if (structure_checked[l]) continue;
    BARGE_RETURN_IF_ERROR(CheckLayerStructure(env, chain.PathOf(chain.points[l].manifest.image)));
    structure_checked[l] = true;
  }
  // A chain over a base: the base chain's layers under it too.
  for (const std::string& base_image : v.point.base_images) {
    BARGE_RETURN_IF_ERROR(CheckLayerStructure(env, base_image));
  }
  v.copy = options;
  v.copy.cluster_bytes = m.cluster_size;
  v.copy.chunk_bytes = ChunkBytesFor(v.copy.chunk_bytes, m.cluster_size);
  v.copy.compression = formats::Compression::kNone;
  CheckAgainst(v.copy, v.point);
  // No destination: runs reading as zeros are checked against the digests
  // as a range, in time independent of their length.
  v.copy.skip_zero_extents = true;
  auto copied = RunCopy(*v.point.image, {{0, m.virtual_size}}, {}, v.copy);
  v.copy.verify = nullptr;
  v.copy.verify_holder = nullptr;
  v.copy.verify_zero_run = nullptr;
  v.copy.skip_zero_extents = false;
  if (!copied.ok()) return Error(copied.error()).Wrap("verify of " + m.id);
  if (copied->image_digest != m.image_digest) {
    return Error::Corruption("image digest " + copied->image_digest.ToHex() +
                             " differs from the manifest's " + m.image_digest.ToHex())
        .set_path(v.point.point->manifest_path);
  }
  v.bytes_read = copied->bytes_read;
  v.clusters_checked = (m.virtual_size + m.cluster_size - 1) / m.cluster_size;
  return v;
}

// True when a failed check says something about the backup itself
// (damaged, unreadable or missing data), not an interruption or a lack of
// resources: such a failure is recorded, and --all goes on past it.
bool IsAboutTheData(const Error& e) {
  const ErrorCode code = e.code();
  return code == ErrorCode::kCorruption || code == ErrorCode::kIoError || code == ErrorCode::kNotFound;
}

// Keeps the outcome of a point's check as its verification record: a pass,
// or a failure about the data (IsAboutTheData). A record that cannot be
// written is a warning, not a failed verification.
void RecordOutcome(Env& env, const ChainFolder& chain, size_t index, const Result<VerifiedPoint>& outcome,
                   double seconds, int64_t layers_mtime_ns, std::vector<std::string>& warnings) {
  if (!outcome.ok() && !IsAboutTheData(outcome.error())) return;
  const formats::BackupManifest& m = chain.points[index].manifest;
  VerificationRecord r;
  r.id = m.id;
  r.ok = outcome.ok();
  if (!outcome.ok()) r.error = outcome.error().ToString();
  r.verified_at = formats::FormatRfc3339({formats::Now().seconds, 0});  // whole seconds, as manifests
  r.duration_seconds = seconds;
  r.clusters_checked = outcome.ok() ? outcome->clusters_checked : 0;
  r.image = m.image;
  auto st = env.Stat(chain.PathOf(m.image));
  r.image_bytes = st.ok() ? st->size_bytes : 0;
  r.image_digest = m.image_digest;
  r.image_digest_algorithm = m.image_digest_algorithm;
  r.layers_mtime_ns = layers_mtime_ns;
  Status s = WriteVerificationRecord(env, chain, index, r);
  if (!s.ok()) warnings.push_back("could not record the verification of " + m.id + ": " + s.error().ToString());
}

// The points `req` names, oldest first.
Result<std::vector<size_t>> VerifyTargets(const VerifyRequest& req, const ChainFolder& chain,
                                          const std::string& at) {
  std::vector<size_t> targets;
  if (req.all_points && !req.against.location.empty()) {
    return Error::InvalidArgument("--against compares one point with a source; drop --all");
  }
  if (req.all_points) {
    for (size_t i = 0; i < chain.points.size(); ++i) targets.push_back(i);
    if (targets.empty()) return Error::NotFound("the chain folder holds no backups").set_path(chain.dir);
  } else {
    BARGE_ASSIGN_OR_RETURN(size_t index, chain.Resolve(at));
    targets.push_back(index);
  }
  return targets;
}

// What comparing a source with a point found.
struct SourceComparison {
  uint64_t bytes_read = 0;
  std::optional<Error> differs;  // kInvalidArgument naming the source
};

// Compares `against` with a point whose data verified (`verified`, its
// copy options as used). Returns how it compared, or the error that kept
// the source from being read.
// Of point `verified` (position `index` of `chain`) whose guest `offset`
// differs from the source: which backup stored that cluster, when it is
// not the point's newest layer (no later point changed it), as a clause
// saying the chain may not be this disk's; else "".
std::string OlderLayerNote(const ChainFolder& chain, size_t index, const VerifiedPoint& verified, uint64_t offset) {
  auto layers = chain.LayersOf(index);
  if (!layers.ok() || layers->size() < 2) return "";
  auto mapped = verified.point.image->Map(offset, 1);
  if (!mapped.ok() || mapped->empty() || (*mapped)[0].depth <= 0) return "";
  const auto depth = static_cast<size_t>((*mapped)[0].depth);
  if (depth >= layers->size()) return "";
  const std::string& holder = chain.points[(*layers)[layers->size() - 1 - depth]].manifest.id;
  return "; the cluster there is as backup " + holder + " stored it and no later point of the chain changed it: " +
         "the chain does not match this disk (an incremental of it was read from another disk's file under the "
         "same path, e.g. swapped disk files; such points restore neither disk: take a full backup), or the disk "
         "changed since";
}

Result<SourceComparison> CompareWithSource(Env& env, const SourceSpec& against, const VerifiedPoint& verified,
                                           const ChainFolder& chain) {
  const formats::BackupManifest& m = verified.point.point->manifest;
  CopyOptions copy = verified.copy;
  const OpenedPoint& point = verified.point;
  CheckAgainst(copy, point);
  // No destination: the source's holes are checked against the digests as
  // runs.
  copy.skip_zero_extents = true;
  SourceSpec spec = against;
  spec.nbd_retry = verified.copy.nbd_retry;
  BARGE_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(env, spec));
  SourceComparison result;
  if (src.image->size_bytes() != m.virtual_size) {
    result.differs = Error::InvalidArgument("the source has " + formats::HumanBytesExact(src.image->size_bytes()) +
                                            ", the backup " + formats::HumanBytesExact(m.virtual_size))
                         .set_path(RedactNbdUri(against.location));
    return result;
  }
  auto compared = RunCopy(*src.image, WholeDisk(*src.image), {}, copy);
  if (compared.ok()) {
    result.bytes_read = compared->bytes_read;
    return result;
  }
  Error e = std::move(compared).error();
  // The backup's own data checked out: a source that reads otherwise
  // changed since (or is another disk). Its bytes are no damage to the
  // backup, so it is no kCorruption; the command still calls it a
  // mismatch (verify's exit 2, docs/errors.md).
  if (e.code() != ErrorCode::kCorruption) return e.Wrap("reading the source to compare");
  const std::string older = e.offset() ? OlderLayerNote(chain, point.index, verified, *e.offset()) : "";
  result.differs = Error::InvalidArgument("the source differs from backup " + m.id +
                                          " (the backup itself verified; the source changed since or is "
                                          "another disk): " + e.message() + older)
                       .set_path(RedactNbdUri(against.location));
  if (e.offset() && e.length()) {
    result.differs->set_range(*e.offset(), *e.length());
  } else if (e.offset()) {
    result.differs->set_offset(*e.offset());
  }
  return result;
}

}  // namespace

namespace {

// The base of the chain under point `index` of `chain` (its first layer's
// manifest's), as {base chain folder, base point id}; nullopt when none.
std::optional<std::pair<std::string, std::string>> BaseOf(const ChainFolder& chain, size_t index) {
  auto layers = chain.LayersOf(index);
  if (!layers.ok() || layers->empty()) return std::nullopt;
  const auto& base = chain.points[layers->front()].manifest.base;
  if (!base) return std::nullopt;
  return std::make_pair(LexicallyNormal(JoinPath(chain.dir, base->chain)), base->id);
}

// Verifies each base the points `passed` of `chain` stand on, and their
// bases in turn (each point once), as points of their own chains, adding
// an outcome per base to `report`. A base that fails its check is the
// report's failure (about the data); other errors end the run.
Status VerifyBases(Env& env, const ChainFolder& chain, const std::vector<size_t>& passed, const CopyOptions& copy,
                   VerifyReport& report) {
  std::vector<std::pair<std::string, std::string>> queue;
  for (size_t index : passed) {
    if (auto b = BaseOf(chain, index)) queue.push_back(*b);
  }
  for (size_t next = 0; next < queue.size() && next < 64; ++next) {
    // Named copies, not a structured binding: clang 14 (Debian 12) cannot
    // capture a binding in the lambdas below.
    const std::string dir = queue[next].first;
    const std::string id = queue[next].second;
    if (std::any_of(report.bases.begin(), report.bases.end(),
                    [&](const BaseVerifyOutcome& o) { return o.chain_dir == dir && o.id == id; })) {
      continue;
    }
    BaseVerifyOutcome& o = report.bases.emplace_back();
    o.chain_dir = dir;
    o.id = id;
    auto base_chain = LoadChainFolder(env, dir);
    size_t index = 0;
    auto check = [&]() -> Result<VerifiedPoint> {
      if (!base_chain.ok()) return base_chain.error();
      BARGE_ASSIGN_OR_RETURN(index, base_chain->Resolve(id));
      std::vector<bool> checked(base_chain->points.size(), false);
      return VerifyPointData(env, *base_chain, index, copy, checked);
    };
    Result<VerifiedPoint> verified = check();
    if (!verified.ok()) {
      Error e = Error(verified.error()).Wrap("base " + id + " of the chain");
      if (!IsAboutTheData(verified.error())) return e;
      o.error = e.ToString();
      if (!report.failure) report.failure = e;
      continue;
    }
    o.passed = true;
    o.clusters_checked = verified->clusters_checked;
    report.bytes_read += verified->bytes_read;
    if (auto b = BaseOf(*base_chain, index)) queue.push_back(*b);
  }
  return OkStatus();
}

}  // namespace

Result<VerifyReport> RunVerify(Env& env, const VerifyRequest& req) {
  auto start = std::chrono::steady_clock::now();
  BARGE_ASSIGN_OR_RETURN(PointLocation where, LocatePoint(env, req.path, req.at));
  BARGE_ASSIGN_OR_RETURN(ChainFolder chain, LoadChainFolder(env, where.chain_dir));
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> targets, VerifyTargets(req, chain, where.at));

  VerifyReport report;
  std::vector<bool> structure_checked(chain.points.size(), false);
  std::vector<bool> failed(chain.points.size(), false);
  auto outcome = [&](VerifyOutcome::State state, size_t index) -> VerifyOutcome& {
    const formats::BackupManifest& m = chain.points[index].manifest;
    VerifyOutcome& o = report.points.emplace_back();
    o.state = state;
    o.position = index;
    o.id = m.id;
    o.started_at = m.started_at;
    return o;
  };
  // Ends the run early: the report, `e` its failure (an error that stops
  // the run outranks an earlier point's failure).
  auto stop = [&](Error e) -> VerifyReport {
    report.failure = std::move(e);
    report.seconds = SecondsSince(start);
    return std::move(report);
  };
  for (size_t index : targets) {
    // A point that reads through a layer that failed is not checked: its
    // verdict would only repeat that failure.
    if (auto layers = chain.LayersOf(index); layers.ok()) {
      auto bad = std::find_if(layers->begin(), layers->end(), [&](size_t l) { return failed[l]; });
      if (bad != layers->end()) {
        outcome(VerifyOutcome::State::kSkipped, index).failed_layer = chain.points[*bad].manifest.id;
        continue;
      }
    }
    const auto point_start = std::chrono::steady_clock::now();
    // Taken before the check: a layer modified during it makes the record stale.
    const int64_t layers_mtime_ns = NewestLayerMtime(env, chain, index);
    auto verified = VerifyPointData(env, chain, index, req.copy, structure_checked);
    RecordOutcome(env, chain, index, verified, SecondsSince(point_start), layers_mtime_ns, report.warnings);
    if (!verified.ok()) {
      if (!IsAboutTheData(verified.error())) return stop(verified.error());
      failed[index] = true;
      outcome(VerifyOutcome::State::kFailed, index).error = verified.error().ToString();
      if (!req.all_points) return stop(verified.error());
      if (!report.failure) report.failure = verified.error();
      continue;
    }

    uint64_t against_bytes = 0;
    if (!req.against.location.empty()) {
      auto compared = CompareWithSource(env, req.against, *verified, chain);
      if (!compared.ok()) return stop(compared.error());
      if (compared->differs) {
        VerifyOutcome& o = outcome(VerifyOutcome::State::kPassed, index);
        o.source_differs = true;
        o.clusters_checked = verified->clusters_checked;
        o.bytes_read = verified->bytes_read;
        report.source_differs = true;
        return stop(*compared->differs);
      }
      against_bytes = compared->bytes_read;
      report.against_checked = true;
    }
    VerifyOutcome& passed = outcome(VerifyOutcome::State::kPassed, index);
    passed.clusters_checked = verified->clusters_checked;
    passed.bytes_read = verified->bytes_read + against_bytes;
    report.clusters_checked += passed.clusters_checked;
    report.bytes_read += passed.bytes_read;
  }
  if (!report.failure) {
    std::vector<size_t> passed;
    for (const VerifyOutcome& o : report.points) {
      if (o.state == VerifyOutcome::State::kPassed) passed.push_back(o.position);
    }
    Status bases = VerifyBases(env, chain, passed, req.copy, report);
    if (!bases.ok()) return stop(bases.error());
  }
  report.seconds = SecondsSince(start);
  return report;
}

size_t VerifyReport::Count(VerifyOutcome::State state) const {
  return std::count_if(points.begin(), points.end(), [state](const VerifyOutcome& o) { return o.state == state; });
}

}  // namespace barge::pipeline
