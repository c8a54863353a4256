// RunReplicate: decide per destination (reuse, write, refuse), one fan-out
// copy pass with SHA-512, then check, verify, rename and record each copy.
#include "pipeline/replicate.h"

#include <cctype>
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
#include "pipeline/overlay_destination.h"
#include "pipeline/output.h"

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

namespace {

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

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

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

// One destination being written in this pass.
struct Pending {
  size_t index = 0;
  std::unique_ptr<Output> output;
  std::unique_ptr<Destination> destination;
  // An existing copy with a readable record whose checksum is unknown until
  // the pass ends: reused (and the temporary dropped) when it matches.
  std::optional<ReplicaRecord> maybe_reuse;
  bool replaces_existing = false;
};

struct ReadBack {
  std::string sha512_hex;
  std::vector<ClusterDigest> cluster_digests;
  std::vector<formats::BitmapSpec> bitmaps;
};

// How a copy is opened to be read back.
struct CopyOpen {
  formats::ImageFormat format = formats::ImageFormat::kRaw;
  // --backing keep: open the chain the copy names (the logical content),
  // under the source's path policy; else the copy alone (it is flat).
  bool keep_backing = false;
  bool allow_any_path = false;
  std::vector<std::string> allow_dirs;
};

// Opens a copy (`path`; `final_path` is the name it has or will have, in
// the same folder) for reading back. A kept backing file that is not beside
// the copy is a kNotFound naming it.
Result<std::unique_ptr<formats::Image>> OpenCopy(Env& env, const std::string& path, const std::string& final_path,
                                                 const CopyOpen& how) {
  formats::OpenOptions open;
  open.format = how.format;
  open.open_backing = how.keep_backing;
  if (!how.keep_backing) return OpenImageFile(env, path, open);
  open.allow_any_path = how.allow_any_path;
  if (!how.allow_any_path && !how.allow_dirs.empty()) {
    // Extra folders add to, not replace, the copy's own folder.
    open.allowed_dirs = how.allow_dirs;
    open.allowed_dirs.push_back(DirName(AbsolutePath(path)));
  }
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
Result<ReadBack> ReadBackCopy(Env& env, const std::string& path, const std::string& final_path,
                              const CopyOpen& how, const CopyOptions& geometry, bool with_bitmaps, bool sha512) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<formats::Image> image, OpenCopy(env, path, final_path, how));
  CopyOptions o;
  o.cluster_bytes = geometry.cluster_bytes;
  o.chunk_bytes = geometry.chunk_bytes;
  o.memory_bytes = geometry.memory_bytes;
  o.threads = geometry.threads;
  o.compression = formats::Compression::kNone;
  o.sha512 = sha512;
  o.cancel = geometry.cancel;
  DigestCollector collector({image->size_bytes(), o.cluster_bytes, false, {}});
  Destination* dests[] = {&collector};
  BARGE_ASSIGN_OR_RETURN(CopyResult r, RunCopy(*image, WholeDisk(*image), dests, o));
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

Result<ReplicateResult> RunReplicate(Env& env, formats::Image& source, std::span<const std::string> destinations,
                                     const ReplicateOptions& options) {
  auto start = std::chrono::steady_clock::now();
  if (destinations.empty()) return Error::InvalidArgument("replicate: no destination");
  std::string expected = Lower(options.expected_sha512);
  if (!expected.empty() && !IsHex512(expected)) {
    return Error::InvalidArgument("expected SHA-512 must be 128 hex digits");
  }
  for (size_t i = 0; i < destinations.size(); ++i) {
    for (size_t k = 0; k < i; ++k) {
      if (CanonicalPath(env, destinations[i]) == CanonicalPath(env, destinations[k])) {
        return Error::InvalidArgument("destination given twice").set_path(destinations[i]);
      }
    }
  }
  // Leftovers of killed runs in the destinations' folders go first (a live
  // writer's temporary is locked and kept).
  {
    std::set<std::string> dirs;
    for (const auto& d : destinations) dirs.insert(DirName(d));
    for (const auto& dir : dirs) {
      IgnoreError(SweepStaleTemporaries(env, dir), "a leftover that cannot be removed now goes at a later run");
    }
  }
  const formats::ImageInfo& info = source.info();
  bool source_qcow2 = info.format == formats::ImageFormat::kQcow2;
  bool out_qcow2 = options.format == ReplicaFormat::kQcow2 ||
                   (options.format == ReplicaFormat::kKeep && source_qcow2);
  formats::ImageFormat out_format = out_qcow2 ? formats::ImageFormat::kQcow2 : formats::ImageFormat::kRaw;
  const bool keep = options.backing == BackingPolicy::kKeep;
  if (keep) {
    if (!source_qcow2 || info.backing_file.empty()) {
      return Error::InvalidArgument(
                 "--backing keep copies only the top layer of a qcow2 image with a backing file, but "
                 "this source " +
                 std::string(source_qcow2 ? "has no backing file" : "is not a qcow2 image") +
                 "; use --backing flatten (the default)")
          .set_path(info.path);
    }
    if (!out_qcow2) {
      return Error::InvalidArgument(
                 "--backing keep needs qcow2 copies (a raw file cannot name a backing file); use "
                 "--format keep or qcow2, or --backing flatten")
          .set_path(info.path);
    }
    if (source.backing() == nullptr || info.backing_format.empty()) {
      // OpenImage opens the chain by default; a source opened without it
      // cannot give the logical content the SHA-512 is about.
      return Error::InvalidArgument("--backing keep: the source's backing chain was not opened")
          .set_path(info.path);
    }
  }

  ReplicateResult result;
  result.virtual_size = source.size_bytes();
  result.format = std::string(formats::ImageFormatName(out_format));
  if (keep) {
    result.backing_file = info.backing_file;
    result.backing_format = info.backing_format;
  }
  CopyOpen copy_open;
  copy_open.format = out_format;
  copy_open.keep_backing = keep;
  copy_open.allow_any_path = options.allow_any_path;
  copy_open.allow_dirs = options.allow_dirs;
  // --backing keep: the clusters each copy stores (the source's top layer).
  RangeList top_allocation;
  if (keep) {
    auto allocated = TopLayerAllocation(source);
    if (!allocated.ok()) return std::move(allocated).error().Wrap("map the top layer");
    top_allocation = std::move(allocated).value();
  }

  // Persistent bitmaps of the top layer travel with a qcow2 copy (CBT
  // survives the move). A stale (in-use) bitmap stops the job: copying it
  // would hand out a bitmap that misses writes.
  std::vector<formats::BitmapSpec> bitmaps;
  if (source_qcow2) {
    for (const auto& b : info.bitmaps) {
      if (!out_qcow2) {
        result.bitmaps_dropped = true;
        continue;
      }
      // The copy's record (JSON) and result name each bitmap carried: a
      // name that is not UTF-8 is refused now, not after the copy.
      if (!formats::IsUtf8(b.name)) {
        return Error::InvalidArgument("a bitmap's name is not valid UTF-8, which the copy's record (JSON) cannot "
                                      "carry; remove it (qemu-img bitmap --remove) or copy to raw, which drops bitmaps")
            .set_path(info.path);
      }
      auto dirty = formats::ReadBitmapDirtyRanges(source, b.name);
      if (!dirty.ok()) return std::move(dirty).error().Wrap("bitmap " + b.name);
      bitmaps.push_back({b.name, b.granularity_bytes, b.enabled, std::move(dirty).value()});
      result.bitmaps.push_back(b.name);
    }
  }

  // Every copy's destination; qcow2 copies carry the bitmaps, and with
  // --backing keep store only the source's top layer.
  DestinationSpec dest_spec;
  dest_spec.format = out_qcow2 ? DestinationFormat::kQcow2 : DestinationFormat::kRaw;
  dest_spec.virtual_size = result.virtual_size;
  dest_spec.cluster_bytes = options.copy.cluster_bytes;
  dest_spec.compression = options.copy.compression;
  dest_spec.bitmaps = bitmaps;
  if (keep) {
    dest_spec.backing_file = result.backing_file;
    dest_spec.backing_format = result.backing_format;
    dest_spec.overlay_allocated = &top_allocation;
  }

  result.replicas.resize(destinations.size());
  std::vector<Pending> pending;
  std::vector<size_t> reused_pre;  // reused by expected checksum, never written
  auto fail = [&](size_t i, Error e) {
    result.replicas[i].state = ReplicaState::kFailed;
    result.replicas[i].error = std::move(e);
  };
  // Drops a pending copy's temporary; a failure to remove it is reported
  // with the reason the copy failed.
  auto abandon = [&](Pending& p, Error e) { fail(p.index, std::move(e.Also(p.output->Abandon()))); };
  for (size_t i = 0; i < destinations.size(); ++i) {
    const std::string& path = destinations[i];
    result.replicas[i].path = path;
    auto status = env.Stat(path);
    if (!status.ok() && status.error().code() != ErrorCode::kNotFound) {
      fail(i, status.error());
      continue;
    }
    bool exists = status.ok();
    if (exists && !status->is_regular()) {
      fail(i, Error::NotSupported("destination is not a regular file").set_path(path));
      continue;
    }
    Pending p;
    p.index = i;
    if (exists) {
      auto record = ReadReplicaRecord(env, path);
      bool usable = record.ok() && record->format == result.format &&
                    record->virtual_size == result.virtual_size &&
                    record->backing_file == result.backing_file && FileMatchesRecord(env, path, *record);
      if (usable && !expected.empty() && Lower(record->sha512) == expected) {
        result.replicas[i].state = ReplicaState::kReused;
        result.replicas[i].file_bytes = record->file_bytes;
        reused_pre.push_back(i);
        continue;
      }
      if (usable && expected.empty()) {
        p.maybe_reuse = *record;
      } else if (!options.force) {
        fail(i, Error::InvalidArgument("exists and is not a matching copy (use --force to replace it)")
                    .set_path(path));
        continue;
      }
      p.replaces_existing = true;
    }
    OutputSpec out_spec;
    out_spec.location = path;
    out_spec.replace = OutputReplace::kReplace;  // decided above
    out_spec.allow_nbd = false;
    out_spec.sweep = false;                      // swept above, once per folder
    auto output = OpenOutput(env, out_spec);
    if (!output.ok()) {
      fail(i, std::move(output).error());
      continue;
    }
    p.output = std::move(output).value();
    auto dest = MakeDestination(p.output->sink(), dest_spec);
    if (!dest.ok()) {
      abandon(p, std::move(dest).error());
      continue;
    }
    p.destination = std::make_unique<ProgressDestination>(std::move(dest).value(), i, result.virtual_size,
                                                          &options.progress);
    pending.push_back(std::move(p));
  }

  auto verify_reused = [&](size_t i, const std::string& want) {
    auto back = ReadBackCopy(env, destinations[i], destinations[i], copy_open, options.copy, false, true);
    if (!back.ok()) {
      fail(i, std::move(back).error().Wrap("verify"));
    } else if (back->sha512_hex != want) {
      fail(i, Error::Corruption("existing copy's SHA-512 " + back->sha512_hex +
                                " does not match its record " + want)
                  .set_path(destinations[i]));
    } else {
      result.replicas[i].verified = true;
    }
  };

  if (pending.empty()) {
    result.sha512_hex = expected;
    if (options.verify) {
      for (size_t i : reused_pre) verify_reused(i, expected);
    }
    result.elapsed = std::chrono::steady_clock::now() - start;
    return result;
  }

  CopyOptions copy = options.copy;
  copy.sha512 = true;
  copy.failure_policy = DestinationFailurePolicy::kIsolate;
  copy.progress = nullptr;
  if (!out_qcow2) copy.compression = formats::Compression::kNone;
  std::vector<Destination*> dests;
  for (auto& p : pending) dests.push_back(p.destination.get());
  auto copied = RunCopy(source, WholeDisk(source), dests, copy);
  if (!copied.ok()) {
    // The source or a shared stage failed (or every destination did): no
    // copy can be trusted.
    for (auto& p : pending) abandon(p, copied.error());
    result.elapsed = std::chrono::steady_clock::now() - start;
    return result;
  }
  result.sha512_hex = copied->sha512_hex;
  result.bytes_read = copied->bytes_read;
  if (!expected.empty() && copied->sha512_hex != expected) {
    result.checksum_mismatch = true;
    for (auto& p : pending) {
      abandon(p, Error::Corruption("checksum mismatch: expected SHA-512 " + expected + ", source has " +
                                   copied->sha512_hex));
    }
    result.elapsed = std::chrono::steady_clock::now() - start;
    return result;
  }

  for (size_t k = 0; k < pending.size(); ++k) {
    Pending& p = pending[k];
    const std::string& path = destinations[p.index];
    ReplicaResult& out = result.replicas[p.index];
    const DestinationResult& dr = copied->destinations[k];
    if (!dr.status.ok()) {
      abandon(p, dr.status.error());
      continue;
    }
    if (p.maybe_reuse && Lower(p.maybe_reuse->sha512) == copied->sha512_hex) {
      // The existing copy already holds this content: keep it untouched.
      if (Status dropped = p.output->Abandon(); !dropped.ok()) {
        fail(p.index, std::move(dropped).error());
        continue;
      }
      out.state = ReplicaState::kReused;
      out.file_bytes = p.maybe_reuse->file_bytes;
      if (options.verify) verify_reused(p.index, copied->sha512_hex);
      continue;
    }
    if (p.maybe_reuse && !options.force) {
      abandon(p, Error::InvalidArgument("exists with a different checksum (use --force to replace it)")
                     .set_path(path));
      continue;
    }
    if (options.verify) {
      auto back = ReadBackCopy(env, p.output->temp_path(), path, copy_open, options.copy, out_qcow2, false);
      if (!back.ok()) {
        // The copy is read back under its temporary name: an error names
        // the copy the user asked for (issue 13).
        Error e = std::move(back).error();
        if (e.path().empty() || e.path() == p.output->temp_path()) e.set_path(path);
        abandon(p, std::move(e).Wrap("verify"));
        continue;
      }
      std::string why;
      if (back->cluster_digests.size() != copied->cluster_digests.size()) why = "cluster count differs";
      else if (back->cluster_digests != copied->cluster_digests) why = "cluster digests differ";
      else if (out_qcow2 && !SameBitmaps(back->bitmaps, bitmaps)) why = "bitmaps differ";
      if (!why.empty()) {
        if (keep && why != "bitmaps differ") {
          why += " (is the backing file beside the copy the same as the source's?)";
        }
        abandon(p, Error::Corruption("verify: re-read copy: " + why).set_path(path));
        continue;
      }
      out.verified = true;
    }
    // A stale record must never describe the new bytes: drop it first.
    if (p.replaces_existing) {
      if (Status s = env.UnlinkIfExists(ReplicaRecordPath(path)); !s.ok()) {
        abandon(p, std::move(s).error());
        continue;
      }
    }
    // The record is written before the copy appears under its name, and
    // describes the temporary's size and mtime (the rename keeps them): a
    // crash before the rename leaves a record that matches no file (not
    // ready; the next run writes the copy again), one after it a ready
    // copy. Never a file of ours without its record, which a re-run would
    // refuse to replace without --force (issue 13).
    if (Status s = p.output->sink().Flush(); !s.ok()) {
      abandon(p, std::move(s).error().set_path(path));
      continue;
    }
    auto stamp = StatFile(env, p.output->temp_path());
    if (!stamp.ok()) {
      abandon(p, std::move(stamp).error().set_path(path));
      continue;
    }
    ReplicaRecord record;
    record.sha512 = copied->sha512_hex;
    record.virtual_size = result.virtual_size;
    record.format = result.format;
    record.file_bytes = stamp->size;
    record.file_mtime_ns = stamp->mtime_ns;
    record.source = options.source_location;
    record.source_format = options.source_format;
    record.created = formats::NowRfc3339();
    record.verified = out.verified;
    record.bitmaps = result.bitmaps;
    record.backing_file = result.backing_file;
    if (Status s = WriteReplicaRecord(env, path, record); !s.ok()) {
      abandon(p, std::move(s).error().Wrap("checksum record"));
      continue;
    }
    if (Status s = p.output->Commit(); !s.ok()) {
      // The record now describes no file: drop it (a failure to is harmless).
      Error e = std::move(s).error();
      if (!FileMatchesRecord(env, path, record)) e.Also(env.UnlinkIfExists(ReplicaRecordPath(path)));
      fail(p.index, std::move(e));
      continue;
    }
    out.state = ReplicaState::kReady;
    out.file_bytes = stamp->size;
  }
  if (options.verify) {
    for (size_t i : reused_pre) verify_reused(i, expected);
  }
  result.elapsed = std::chrono::steady_clock::now() - start;
  return result;
}

}  // namespace barge::pipeline
