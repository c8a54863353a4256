// RunReplicate: decide per destination (reuse, write, refuse), one fan-out
// copy pass with SHA-512, then check, verify, rename and record each copy.
#include "pipeline/replicate.h"

#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "blockio/env.h"
#include "blockio/path.h"
#include "formats/json_fields.h"
#include "formats/manifest.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_writer.h"
#include "pipeline/endpoints.h"
#include "pipeline/destination_spec.h"
#include "pipeline/stages.h"
#include "pipeline/overlay_destination.h"
#include "pipeline/output.h"
#include "pipeline/replicate_steps.h"
#include "pipeline/resume.h"

namespace barge::pipeline {

using nlohmann::json;

Result<ReplicaFormat> ParseReplicaFormat(std::string_view name) {
  if (name == "keep") return ReplicaFormat::kKeep;
  if (name == "raw") return ReplicaFormat::kRaw;
  if (name == "qcow2") return ReplicaFormat::kQcow2;
  return Error::InvalidArgument("unknown format '" + std::string(name) + "' (use keep, raw or qcow2)");
}

Result<BackingPolicy> ParseBackingPolicy(std::string_view name) {
  if (name == "flatten") return BackingPolicy::kFlatten;
  if (name == "keep") return BackingPolicy::kKeep;
  return Error::InvalidArgument("unknown backing policy '" + std::string(name) + "' (use flatten or keep)");
}

std::string_view ReplicaStateName(ReplicaState state) {
  switch (state) {
    case ReplicaState::kReady: return "ready";
    case ReplicaState::kReused: return "reused";
    case ReplicaState::kFailed: return "failed";
  }
  return "?";
}

bool ReplicateResult::all_ok() const {
  if (checksum_mismatch) return false;
  for (const auto& r : replicas) {
    if (r.state == ReplicaState::kFailed) return false;
  }
  return true;
}

std::string ReplicaRecordPath(const std::string& path) { return path + ".sha512.json"; }

std::string ReplicaJournalPath(const std::string& path) {
  std::string dir = DirName(path);
  return (dir.empty() ? std::string() : dir + "/") + "." + BaseName(path) + ".barge-resume";
}

std::string NbdTargetStatePath(const std::string& state_dir, const std::string& uri) {
  const std::string shown = RedactNbdUri(uri);
  std::string name;
  for (unsigned char c : shown) {
    if (name.size() >= 120) break;
    if (std::isalnum(c) || std::string_view("_+=,.-").find(static_cast<char>(c)) != std::string_view::npos) {
      name += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      name += hex;
    }
  }
  char hash[24];
  std::snprintf(hash, sizeof hash, "-%016llx",
                static_cast<unsigned long long>(XXH3_64bits(shown.data(), shown.size())));
  return JoinPath(state_dir, name + hash);
}

Result<ReplicaRecord> DecodeReplicaRecord(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Error::Corruption("checksum record is not a JSON object");
  }
  // Numbers are type-checked first: get<uint64_t>() on a float (1e111)
  // is a float-to-integer conversion out of range, undefined behaviour.
  for (const char* key : {"virtual_size", "file_bytes"}) {
    if (!j.contains(key) || !j[key].is_number_unsigned()) {
      return Error::Corruption(std::string("checksum record: '") + key + "' is not a non-negative integer");
    }
  }
  if (!j.contains("file_mtime_ns") || !j["file_mtime_ns"].is_number_integer()) {
    return Error::Corruption("checksum record: 'file_mtime_ns' is not an integer");
  }
  ReplicaRecord r;
  try {
    r.sha512 = j.at("sha512").get<std::string>();
    r.virtual_size = j.at("virtual_size").get<uint64_t>();
    r.format = j.at("format").get<std::string>();
    r.file_bytes = j.at("file_bytes").get<uint64_t>();
    r.file_mtime_ns = j.at("file_mtime_ns").get<int64_t>();
    r.source = j.value("source", "");
    r.source_format = j.value("source_format", "");
    r.created = j.value("created", "");
    r.verified = j.value("verified", false);
    r.bitmaps = j.value("bitmaps", std::vector<std::string>{});
    r.backing_file = j.value("backing_file", "");
  } catch (const json::exception& e) {
    return Error::Corruption(std::string("checksum record: ") + e.what());
  }
  return r;
}

Result<ReplicaRecord> ReadReplicaRecord(Env& env, const std::string& path) {
  std::string record_path = ReplicaRecordPath(path);
  auto text = env.ReadFile(record_path, 1 << 20);
  if (!text.ok()) {
    if (text.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("no checksum record").set_path(record_path);
    }
    return text.error();
  }
  auto r = DecodeReplicaRecord(*text);
  if (!r.ok()) return std::move(r).error().set_path(record_path);
  return r;
}

namespace replicate_steps {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace replicate_steps

namespace {

using namespace replicate_steps;

struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

Result<FileStamp> StatFile(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(path));
  return FileStamp{st.size_bytes, st.mtime_ns};
}

bool IsHex512(const std::string& s) {
  if (s.size() != 128) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

struct ReadBack {
  std::string sha512_hex;
  std::vector<ClusterDigest> cluster_digests;
  std::vector<formats::BitmapSpec> bitmaps;
};

// Opens a copy (`path`; `final_path` is the name it has or will have, in
// the same folder) for reading back. A kept backing file that is not beside
// the copy is a kNotFound naming it.
Result<std::unique_ptr<formats::Image>> OpenCopy(Env& env, const std::string& path, const std::string& final_path,
                                                 const CopyOpen& how) {
  if (IsNbdUri(path)) {
    // An export written in place (raw).
    SourceSpec spec;
    spec.location = path;
    spec.format = "raw";
    spec.nbd = how.nbd;
    spec.nbd_retry = how.nbd_retry;
    BARGE_ASSIGN_OR_RETURN(OpenedSource opened, OpenSource(env, spec));
    return std::move(opened.image);
  }
  formats::OpenOptions open;
  open.format = how.format;
  open.open_backing = how.keep_backing;
  if (!how.keep_backing) return OpenImageFile(env, path, open);
  ApplyFolderRule(open, path, how.allow_any_path, how.allow_dirs);
  // Look for the backing file first, so a missing base gets a message that
  // says what to do rather than a bare "No such file".
  {
    open.open_backing = false;
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<formats::Image> top, OpenImageFile(env, path, open));
    open.open_backing = true;
    const std::string& name = top->info().backing_file;
    if (!name.empty() && name.find(':') == std::string::npos) {
      std::string resolved = LexicallyNormal(JoinPath(DirName(path), name));
      auto st = env.Stat(resolved);
      if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
      if (!st.ok()) {
        return Error::NotFound("backing file '" + name + "' not found at " + resolved +
                               ": deliver the base image beside the copy before verifying it "
                               "(--backing keep)")
            .set_path(final_path);
      }
    }
  }
  return OpenImageFile(env, path, open);
}

// Re-reads a copy through the pipeline: SHA-512 of its logical content, its
// data cluster digests and (qcow2) its bitmaps. A new copy is checked
// against the copy pass's per-cluster xxh3-128 digests (sha512 = false: the
// SHA-512 was taken once from the source, and equal cluster digests mean
// equal bytes); a reused copy has only its record's SHA-512 to be checked
// against.
// Only the first `virtual_size` bytes are read: an NBD export may be larger
// than the copy it holds.
Result<ReadBack> ReadBackCopy(Env& env, const std::string& path, const std::string& final_path,
                              const CopyOpen& how, const CopyOptions& geometry, bool with_bitmaps, bool sha512,
                              uint64_t virtual_size) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<formats::Image> image, OpenCopy(env, path, final_path, how));
  if (image->size_bytes() < virtual_size) {
    return Error::Corruption("the copy holds " + std::to_string(image->size_bytes()) + " bytes, the source " +
                             std::to_string(virtual_size))
        .set_path(RedactNbdUri(final_path));
  }
  CopyOptions o;
  o.cluster_bytes = geometry.cluster_bytes;
  o.chunk_bytes = geometry.chunk_bytes;
  o.memory_bytes = geometry.memory_bytes;
  o.threads = geometry.threads;
  o.compression = formats::Compression::kNone;
  o.sha512 = sha512;
  o.cancel = geometry.cancel;
  DigestCollector collector({.virtual_size = virtual_size, .cluster_bytes = o.cluster_bytes});
  Destination* dests[] = {&collector};
  RangeList work;
  if (virtual_size > 0) work.push_back({0, virtual_size});
  BARGE_ASSIGN_OR_RETURN(CopyResult r, RunCopy(*image, work, dests, o));
  ReadBack back{std::move(r.sha512_hex), std::move(r.cluster_digests), {}};
  if (with_bitmaps) {
    for (const auto& b : image->info().bitmaps) {
      BARGE_ASSIGN_OR_RETURN(RangeList dirty, formats::ReadBitmapDirtyRanges(*image, b.name));
      back.bitmaps.push_back({b.name, b.granularity_bytes, b.enabled, std::move(dirty)});
    }
  }
  return back;
}

bool SameBitmaps(const std::vector<formats::BitmapSpec>& a, const std::vector<formats::BitmapSpec>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& x : a) {
    bool found = false;
    for (const auto& y : b) {
      if (x.name != y.name) continue;
      found = x.granularity_bytes == y.granularity_bytes && x.enabled == y.enabled &&
              NormalizeRanges(x.dirty) == NormalizeRanges(y.dirty);
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace

Status WriteReplicaRecord(Env& env, const std::string& path, const ReplicaRecord& r) {
  json j = {{"sha512", r.sha512},          {"virtual_size", r.virtual_size},
            {"format", r.format},          {"file_bytes", r.file_bytes},
            {"file_mtime_ns", r.file_mtime_ns}, {"source", r.source},
            {"source_format", r.source_format}, {"created", r.created},
            {"verified", r.verified},      {"bitmaps", r.bitmaps},
            {"tool", "barge 0.1.0"}};
  if (!r.backing_file.empty()) j["backing_file"] = r.backing_file;
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::DumpJson(j, 2, "checksum record of " + path));
  return env.WriteFileAtomic(ReplicaRecordPath(path), text + "\n");
}

bool FileMatchesRecord(Env& env, const std::string& path, const ReplicaRecord& record) {
  auto st = StatFile(env, path);
  return st.ok() && st->size == record.file_bytes && st->mtime_ns == record.file_mtime_ns;
}

namespace {

// Checks the request before anything is touched; returns the expected
// SHA-512 in lowercase ("" when none).
Result<std::string> CheckRequest(Env& env, std::span<const std::string> destinations,
                                 const ReplicateOptions& options) {
  if (destinations.empty()) return Error::InvalidArgument("replicate: no destination");
  std::string expected = Lower(options.expected_sha512);
  if (!expected.empty() && !IsHex512(expected)) {
    return Error::InvalidArgument("expected SHA-512 must be 128 hex digits");
  }
  auto same = [&env](const std::string& a, const std::string& b) {
    if (IsNbdUri(a) || IsNbdUri(b)) return RedactNbdUri(a) == RedactNbdUri(b);
    return CanonicalPath(env, a) == CanonicalPath(env, b);
  };
  for (size_t i = 0; i < destinations.size(); ++i) {
    for (size_t k = 0; k < i; ++k) {
      if (same(destinations[i], destinations[k])) {
        return Error::InvalidArgument("destination given twice").set_path(RedactNbdUri(destinations[i]));
      }
    }
    if (IsNbdUri(destinations[i]) && options.state_dir.empty()) {
      return Error::InvalidArgument("an NBD target needs a state folder for its record and resume journal")
          .set_path(RedactNbdUri(destinations[i]));
    }
  }
  return expected;
}

// Locks the temporaries that resume journals name, so that the sweep
// below spares them (a resumable copy of an interrupted run) until the
// copies are decided.
std::vector<std::unique_ptr<EnvLock>> SpareStagedCopies(Env& env, std::span<const std::string> destinations) {
  std::vector<std::unique_ptr<EnvLock>> locks;
  for (const std::string& d : destinations) {
    if (IsNbdUri(d) || !env.Exists(ReplicaJournalPath(d))) continue;
    if (auto lock = SpareKeptFile(env, TempPathFor(d))) locks.push_back(std::move(lock));
  }
  return locks;
}

// Removes leftovers of killed runs in the destinations' folders, once per
// folder (a live writer's temporary is locked and kept).
void SweepDestinationFolders(Env& env, std::span<const std::string> destinations) {
  std::set<std::string> dirs;
  for (const auto& d : destinations) {
    if (!IsNbdUri(d)) dirs.insert(DirName(d));  // an export is written in place
  }
  for (const auto& dir : dirs) {
    IgnoreError(SweepStaleTemporaries(env, dir), "a leftover that cannot be removed now goes at a later run");
  }
}

// Picks the copies' format and backing policy, refusing a --backing keep the
// source or format cannot honour, and fills in the result's header.
Status PlanFormat(Job& job) {
  const formats::ImageInfo& info = job.source.info();
  bool source_qcow2 = info.format == formats::ImageFormat::kQcow2;
  job.out_qcow2 = job.options.format == ReplicaFormat::kQcow2 ||
                  (job.options.format == ReplicaFormat::kKeep && source_qcow2);
  formats::ImageFormat out_format = job.out_qcow2 ? formats::ImageFormat::kQcow2 : formats::ImageFormat::kRaw;
  job.keep = job.options.backing == BackingPolicy::kKeep;
  if (job.keep) {
    if (!source_qcow2 || info.backing_file.empty()) {
      return Error::InvalidArgument(
                 "--backing keep copies only the top layer of a qcow2 image with a backing file, but "
                 "this source " +
                 std::string(source_qcow2 ? "has no backing file" : "is not a qcow2 image") +
                 "; use --backing flatten (the default)")
          .set_path(info.path);
    }
    if (!job.out_qcow2) {
      return Error::InvalidArgument(
                 "--backing keep needs qcow2 copies (a raw file cannot name a backing file); use "
                 "--format keep or qcow2, or --backing flatten")
          .set_path(info.path);
    }
    if (job.source.backing() == nullptr || info.backing_format.empty()) {
      // OpenImage opens the chain by default; a source opened without it
      // cannot give the logical content the SHA-512 is about.
      return Error::InvalidArgument("--backing keep: the source's backing chain was not opened")
          .set_path(info.path);
    }
  }
  for (size_t i = 0; i < job.destinations.size(); ++i) {
    if (!job.out_qcow2 || !job.IsNbd(i)) continue;
    return Error::InvalidArgument(
               "an NBD export is written raw (it is a block device), but these copies are qcow2 (--format " +
               std::string(job.options.format == ReplicaFormat::kQcow2 ? "qcow2" : "keep, a qcow2 source") +
               "); use --format raw")
        .set_path(job.Shown(i));
  }
  if (std::any_of(job.destinations.begin(), job.destinations.end(), [](const std::string& d) { return IsNbdUri(d); })) {
    BARGE_RETURN_IF_ERROR(job.env.CreateDirs(job.options.state_dir));
  }
  job.result.virtual_size = job.source.size_bytes();
  job.result.format = std::string(formats::ImageFormatName(out_format));
  if (job.keep) {
    job.result.backing_file = info.backing_file;
    job.result.backing_format = info.backing_format;
  }
  job.copy_open.format = out_format;
  job.copy_open.keep_backing = job.keep;
  job.copy_open.allow_any_path = job.options.allow_any_path;
  job.copy_open.allow_dirs = job.options.allow_dirs;
  job.copy_open.nbd = job.options.nbd;
  job.copy_open.nbd_retry = job.options.copy.nbd_retry;
  return OkStatus();
}

// Reads what travels besides the content: with --backing keep the clusters
// the source's top layer stores, and the top layer's persistent bitmaps for
// a qcow2 copy (CBT survives the move). A stale (in-use) bitmap stops the
// job: copying it would hand out a bitmap that misses writes.
Status ReadTopLayer(Job& job) {
  if (job.keep) {
    auto allocated = TopLayerAllocation(job.source);
    if (!allocated.ok()) return std::move(allocated).error().Wrap("map the top layer");
    job.top_allocation = std::move(allocated).value();
  }
  const formats::ImageInfo& info = job.source.info();
  if (info.format != formats::ImageFormat::kQcow2) return OkStatus();
  for (const auto& b : info.bitmaps) {
    if (!job.out_qcow2) {
      job.result.bitmaps_dropped = true;
      continue;
    }
    // The copy's record (JSON) and result name each bitmap carried: a
    // name that is not UTF-8 is refused now, not after the copy.
    if (!formats::IsUtf8(b.name)) {
      return Error::InvalidArgument("a bitmap's name is not valid UTF-8, which the copy's record (JSON) cannot "
                                    "carry; remove it (qemu-img bitmap --remove) or copy to raw, which drops bitmaps")
          .set_path(info.path);
    }
    auto dirty = formats::ReadBitmapDirtyRanges(job.source, b.name);
    if (!dirty.ok()) return std::move(dirty).error().Wrap("bitmap " + b.name);
    job.bitmaps.push_back({b.name, b.granularity_bytes, b.enabled, std::move(dirty).value()});
    job.result.bitmaps.push_back(b.name);
  }
  return OkStatus();
}

// After a failed pass: a resumable copy keeps its temporary and journal
// for the next run when the source failed (its connection lost for good);
// not after a cancel, which asks to stop, nor when writing the copy failed
// (a full or failing disk: what it holds is not to be kept). An NBD target
// keeps its journal also when writing it failed (its connection lost past
// the retry bounds): every checkpoint journaled came after a flush of the
// export, and the next run reads the export back against the digests
// before it trusts any of it.
// Only an I/O failure (a peer lost past its retries) is resumed from: a
// source that changed or broke its format (kCorruption), or one refused
// (kNotSupported, kInvalidArgument, kNotFound), would refuse the next run's
// resume too, so nothing is kept and none is promised.
void KeepStaged(Job& job, Pending& p, const Error& error) {
  if (p.journaled != nullptr && error.code() == ErrorCode::kIoError &&
      KeepAfterFailure(error, *p.journaled, *p.journal, /*target_failure_keeps=*/p.output->in_place(),
                       [&p] { return p.output->Keep(); })) {
    p.journal.reset();
    job.Fail(p.index, Error(error).Wrap("the data written so far is kept: the next run of this replicate "
                                        "resumes from it; replicate"));
    return;
  }
  job.Abandon(p, error);
}

// Copy-job step 4: one read pass of the source with SHA-512 feeding every
// pending copy. Nothing (every copy abandoned) when the pass failed or the
// source's checksum is not the expected one.
std::optional<CopyResult> CopyPass(Job& job, std::vector<Pending>& pending) {
  CopyOptions copy = job.options.copy;
  copy.sha512 = true;
  copy.failure_policy = DestinationFailurePolicy::kIsolate;
  copy.progress = nullptr;
  if (!job.out_qcow2) copy.compression = formats::Compression::kNone;
  std::vector<Destination*> dests;
  for (auto& p : pending) dests.push_back(p.destination.get());
  RangeList work = WholeDisk(job.source);
  if (job.resume_cluster > 0) {
    copy.sha512_stream = &job.sha512;
    uint64_t from = std::min(job.result.virtual_size, job.resume_cluster * copy.cluster_bytes);
    work = {{from, job.result.virtual_size - from}};
    if (work.front().length == 0) work.clear();
  }
  auto copied = RunCopy(job.source, work, dests, copy);
  if (!copied.ok()) {
    // The source or a shared stage failed (or every destination did): no
    // copy can be trusted as finished. What a copy wrote is kept for the
    // next run when the source failed (KeepStaged), else dropped.
    for (auto& p : pending) KeepStaged(job, p, copied.error());
    return std::nullopt;
  }
  if (!job.kept_digests.empty()) {
    std::vector<ClusterDigest> all = job.kept_digests;
    all.insert(all.end(), copied->cluster_digests.begin(), copied->cluster_digests.end());
    copied->cluster_digests = std::move(all);
  }
  job.result.sha512_hex = copied->sha512_hex;
  job.result.bytes_read = copied->bytes_read;
  if (!job.expected.empty() && copied->sha512_hex != job.expected) {
    job.result.checksum_mismatch = true;
    for (auto& p : pending) {
      job.Abandon(p, Error::Corruption("checksum mismatch: expected SHA-512 " + job.expected + ", source has " +
                                       copied->sha512_hex));
    }
    return std::nullopt;
  }
  return std::move(copied).value();
}

// Recomputes a reused copy's SHA-512 and checks it against `want`.
void VerifyReused(Job& job, size_t i, const std::string& want) {
  const std::string& path = job.destinations[i];
  auto back = ReadBackCopy(job.env, path, path, job.copy_open, job.options.copy, false, true,
                           job.result.virtual_size);
  if (!back.ok()) {
    job.Fail(i, std::move(back).error().Wrap("verify"));
  } else if (back->sha512_hex != want) {
    job.Fail(i, Error::Corruption("existing copy's SHA-512 " + back->sha512_hex + " does not match its record " +
                                  want)
                    .set_path(path));
  } else {
    job.result.replicas[i].verified = true;
  }
}

// An existing copy with a record but no expected checksum: kept untouched
// (its temporary dropped) when it holds the copied content, else refused
// without --force. True when `p` is settled here.
bool SettleExisting(Job& job, Pending& p, const std::string& sha512_hex) {
  if (!p.maybe_reuse) return false;
  if (Lower(p.maybe_reuse->sha512) == sha512_hex) {
    // The existing copy already holds this content: keep it untouched.
    job.DropJournal(p);
    if (Status dropped = p.output->Abandon(); !dropped.ok()) {
      job.Fail(p.index, std::move(dropped).error());
      return true;
    }
    ReplicaResult& out = job.result.replicas[p.index];
    out.state = ReplicaState::kReused;
    out.file_bytes = p.maybe_reuse->file_bytes;
    if (job.options.verify) VerifyReused(job, p.index, sha512_hex);
    return true;
  }
  if (job.options.force) return false;
  job.Abandon(p, Error::InvalidArgument("exists with a different checksum (use --force to replace it)")
                     .set_path(job.Shown(p.index)));
  return true;
}

// --verify: re-reads a new copy under its temporary name and compares its
// cluster digests (and bitmaps) with the copy pass's; false (abandoned) on
// a difference.
bool VerifyNewCopy(Job& job, Pending& p, const CopyResult& copied) {
  const std::string path = job.Shown(p.index);
  // A file under its temporary name; an export where it is.
  const std::string& read_at = p.output->in_place() ? job.destinations[p.index] : p.output->temp_path();
  auto back = ReadBackCopy(job.env, read_at, job.destinations[p.index], job.copy_open, job.options.copy,
                           job.out_qcow2, false, job.result.virtual_size);
  if (!back.ok()) {
    // The copy is read back under its temporary name: an error names
    // the copy the user asked for (issue 13).
    Error e = std::move(back).error();
    if (e.path().empty() || (!p.output->in_place() && e.path() == p.output->temp_path())) e.set_path(path);
    job.Abandon(p, std::move(e).Wrap("verify"));
    return false;
  }
  std::string why;
  if (back->cluster_digests.size() != copied.cluster_digests.size()) why = "cluster count differs";
  else if (back->cluster_digests != copied.cluster_digests) why = "cluster digests differ";
  else if (job.out_qcow2 && !SameBitmaps(back->bitmaps, job.bitmaps)) why = "bitmaps differ";
  if (!why.empty()) {
    if (job.keep && why != "bitmaps differ") {
      why += " (is the backing file beside the copy the same as the source's?)";
    }
    job.Abandon(p, Error::Corruption("verify: re-read copy: " + why).set_path(path));
    return false;
  }
  job.result.replicas[p.index].verified = true;
  return true;
}

// Copy-job step 5 for a new copy: writes its record, then commits it under
// its name. The record is written before the copy appears under its name,
// and describes the temporary's size and mtime (the rename keeps them): a
// crash before the rename leaves a record that matches no file (not ready;
// the next run writes the copy again), one after it a ready copy. Never a
// file of ours without its record, which a re-run would refuse to replace
// without --force (issue 13).
void RecordAndCommit(Job& job, Pending& p, const std::string& sha512_hex) {
  const std::string path = job.Shown(p.index);
  const std::string record_base = job.RecordBase(p.index);
  ReplicaResult& out = job.result.replicas[p.index];
  // A stale record must never describe the new bytes: drop it first.
  if (p.replaces_existing) {
    if (Status s = job.env.UnlinkIfExists(ReplicaRecordPath(record_base)); !s.ok()) {
      job.Abandon(p, std::move(s).error());
      return;
    }
  }
  if (Status s = p.output->in_place() ? OkStatus() : p.output->sink().Flush(); !s.ok()) {  // an export: closed
    job.Abandon(p, std::move(s).error().set_path(path));
    return;
  }
  // An export: its size, and no mtime (it is written in place; the record
  // in the state folder says what was written, not that it is still there).
  auto stamp = p.output->in_place() ? Result<FileStamp>(FileStamp{p.export_bytes, 0})
                                    : StatFile(job.env, p.output->temp_path());
  if (!stamp.ok()) {
    job.Abandon(p, std::move(stamp).error().set_path(path));
    return;
  }
  ReplicaRecord record;
  record.sha512 = sha512_hex;
  record.virtual_size = job.result.virtual_size;
  record.format = job.result.format;
  record.file_bytes = stamp->size;
  record.file_mtime_ns = stamp->mtime_ns;
  record.source = RedactNbdUri(job.options.source_location);  // never its credentials
  record.source_format = job.options.source_format;
  record.created = formats::NowRfc3339();
  record.verified = out.verified;
  record.bitmaps = job.result.bitmaps;
  record.backing_file = job.result.backing_file;
  if (Status s = WriteReplicaRecord(job.env, record_base, record); !s.ok()) {
    job.Abandon(p, std::move(s).error().Wrap("checksum record"));
    return;
  }
  if (Status s = p.output->Commit(); !s.ok()) {
    // The record now describes no file: drop it (a failure to is harmless).
    Error e = std::move(s).error();
    if (p.output->in_place() || !FileMatchesRecord(job.env, job.destinations[p.index], record)) {
      e.Also(job.env.UnlinkIfExists(ReplicaRecordPath(record_base)));
    }
    job.DropJournal(p);
    job.Fail(p.index, std::move(e));
    return;
  }
  out.state = ReplicaState::kReady;
  out.file_bytes = stamp->size;
  job.DropJournal(p);
}

// Settles one pending copy after the pass: its destination's failure, reuse
// of the existing copy, --verify, then record and commit.
void FinishCopy(Job& job, Pending& p, const DestinationResult& dr, const CopyResult& copied) {
  if (!dr.status.ok()) {
    // An export whose connection failed for good keeps what it holds for
    // the next run (KeepStaged); a file's failed copy goes.
    if (p.output->in_place()) {
      KeepStaged(job, p, dr.status.error());
    } else {
      job.Abandon(p, dr.status.error());
    }
    return;
  }
  if (SettleExisting(job, p, copied.sha512_hex)) return;
  if (p.output->in_place()) {
    // Written: flushed and closed, so --verify's connection is not refused
    // by a server that takes one client (qemu-nbd's default).
    p.export_bytes = p.output->sink().size_bytes();
    if (Status s = p.output->CloseInPlace(); !s.ok()) {
      // The journal's checkpoints each followed a flush that worked: kept
      // for the next run, which checks them against the export.
      if (p.journal != nullptr && p.journal->checkpoints() > 0) {
        p.journal.reset();
      } else {
        job.DropJournal(p);
      }
      job.Fail(p.index, std::move(s).error().Wrap("flush"));
      return;
    }
  }
  if (job.options.verify && !VerifyNewCopy(job, p, copied)) return;
  RecordAndCommit(job, p, copied.sha512_hex);
}

}  // namespace

// The five steps of a copy job (docs/architecture.md): the source is opened
// by the caller; OpenDestinations opens each output and makes its
// destination, CopyPass runs the copy, FinishCopy commits each copy.
Result<ReplicateResult> RunReplicate(Env& env, formats::Image& source, std::span<const std::string> destinations,
                                     const ReplicateOptions& options) {
  auto start = std::chrono::steady_clock::now();
  BARGE_ASSIGN_OR_RETURN(std::string expected, CheckRequest(env, destinations, options));
  std::vector<std::unique_ptr<EnvLock>> spared = SpareStagedCopies(env, destinations);
  SweepDestinationFolders(env, destinations);
  Job job(env, source, destinations, options, std::move(expected));
  BARGE_RETURN_IF_ERROR(PlanFormat(job));
  BARGE_RETURN_IF_ERROR(ReadTopLayer(job));
  std::vector<Pending> pending = OpenDestinations(job, spared);
  if (pending.empty()) {
    job.result.sha512_hex = job.expected;
  } else {
    std::optional<CopyResult> copied = CopyPass(job, pending);
    if (!copied) {
      job.result.elapsed = std::chrono::steady_clock::now() - start;
      return std::move(job.result);
    }
    for (size_t k = 0; k < pending.size(); ++k) FinishCopy(job, pending[k], copied->destinations[k], *copied);
  }
  if (options.verify) {
    for (size_t i : job.reused_pre) VerifyReused(job, i, job.expected);
  }
  job.result.elapsed = std::chrono::steady_clock::now() - start;
  return std::move(job.result);
}

}  // namespace barge::pipeline
