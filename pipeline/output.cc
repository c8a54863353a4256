// OpenOutput: the checks every job makes before it writes (force, sweep,
// size), and the staged file or in-place sink behind the output.
#include "pipeline/output.h"

#include <unistd.h>

#include <algorithm>

#include "blockio/nbd.h"
#include "blockio/path.h"
#include "formats/units.h"
#include "pipeline/nbd_endpoint.h"

namespace barge::pipeline {

namespace {

// True if any byte of the source is reported as data (allocated).
Result<bool> HoldsData(BlockSource& source) {
  constexpr uint64_t kWindow = 1ull << 30;
  for (uint64_t off = 0; off < source.size_bytes(); off += kWindow) {
    BARGE_ASSIGN_OR_RETURN(ExtentList e, source.Extents(off, std::min(kWindow, source.size_bytes() - off)));
    for (const Extent& x : e) {
      if (x.kind == ExtentKind::kData) return true;
    }
  }
  return false;
}

Result<std::unique_ptr<BlockSink>> OpenInPlace(Env& env, const OutputSpec& spec, OutputKind kind) {
  const std::string& dst = spec.location;
  NbdOptions nbd_options;
  if (kind == OutputKind::kNbd) {
    BARGE_ASSIGN_OR_RETURN(nbd_options, NbdOptionsFor(env, dst, spec.nbd));
    nbd_options.retry = spec.nbd_retry;
  }
  if (spec.replace == OutputReplace::kForceIfHoldsData && !spec.force) {
    // An export or device that reports data needs --force; devices report
    // everything as data, so they always do.
    std::unique_ptr<BlockSource> probe;
    if (kind == OutputKind::kNbd) {
      BARGE_ASSIGN_OR_RETURN(probe, OpenNbdSource(dst, nbd_options));
    } else {
      BARGE_ASSIGN_OR_RETURN(probe, env.OpenSource(dst));
    }
    BARGE_ASSIGN_OR_RETURN(bool has_data, HoldsData(*probe));
    if (has_data) {
      return Error::InvalidArgument("the destination is not empty; use --force to overwrite it")
          .set_path(RedactNbdUri(dst));
    }
  }
  std::unique_ptr<BlockSink> sink;
  if (kind == OutputKind::kNbd) {
    BARGE_ASSIGN_OR_RETURN(sink, OpenNbdSink(dst, nbd_options));
  } else {
    FileOptions options;
    options.sync = spec.sync;
    BARGE_ASSIGN_OR_RETURN(sink, env.OpenSink(dst, SinkMode::kExisting, options));
  }
  if (sink->size_bytes() < spec.size_bytes) {
    return Error::NoSpace("the destination holds " + formats::HumanBytesExact(sink->size_bytes()) +
                          ", the disk needs " + formats::HumanBytesExact(spec.size_bytes))
        .set_path(RedactNbdUri(dst));
  }
  return sink;
}

// The access a staged output gets: spec.access for a new file; an existing
// one's own mode (and group, when we may give it: as root) for a file
// replaced, so that a disk a VM uses stays usable.
std::optional<FileAccess> OutputAccess(Env& env, const OutputSpec& spec) {
  if (!spec.access) return std::nullopt;
  auto st = env.Stat(spec.location);
  if (!st.ok() || !st->is_regular()) return spec.access;
  FileAccess kept;
  kept.file_mode = st->mode & 07777;
  if (::geteuid() == 0) kept.gid = st->gid;
  return kept;
}

Result<std::unique_ptr<StagedFile>> OpenStaged(Env& env, const OutputSpec& spec) {
  const std::string& dst = spec.location;
  const std::optional<FileAccess> access = OutputAccess(env, spec);
  const FileAccess* a = access ? &*access : nullptr;
  // Not a place for a file at all (/dev/null, a folder): said as such, not
  // as "use --force".
  BARGE_RETURN_IF_ERROR(CheckOutputPath(env, dst));
  if (spec.adopt) {
    return StagedFile::Adopt(env, dst, spec.sync, /*overwrite=*/spec.replace == OutputReplace::kReplace);
  }
  if (spec.sweep) {
    // Leftovers of killed runs in the output's folder go first (a live
    // writer's temporary is locked and kept).
    IgnoreError(SweepStaleTemporaries(env, DirName(dst)), "a leftover that cannot be removed now goes at a later run");
  }
  switch (spec.replace) {
    case OutputReplace::kForceIfHoldsData: {
      auto st = env.Stat(dst);
      if (st.ok() && !spec.force && st->size_bytes > 0) {
        return Error::InvalidArgument("the destination file exists and is not empty; use --force to replace it")
            .set_path(dst);
      }
      return StagedFile::Create(env, dst, /*overwrite=*/true, spec.sync, a);
    }
    case OutputReplace::kForceIfFileExists: {
      auto staged = StagedFile::Create(env, dst, /*overwrite=*/spec.force, spec.sync, a);
      if (!staged.ok() && staged.error().code() == ErrorCode::kInvalidArgument) {
        return std::move(staged).error().Wrap("use --force to replace it");
      }
      return staged;
    }
    case OutputReplace::kReplace:
      return StagedFile::Create(env, dst, /*overwrite=*/true, spec.sync, a);
  }
  return Error::InvalidArgument("unknown replace policy").set_path(dst);
}

}  // namespace

Result<OutputKind> OutputKindOf(Env& env, const std::string& location, bool allow_nbd) {
  if (allow_nbd && IsNbdUri(location)) return OutputKind::kNbd;
  auto st = env.Stat(location);
  if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
  return st.ok() && st->is_block_device() ? OutputKind::kBlockDevice : OutputKind::kFile;
}

Result<std::unique_ptr<Output>> OpenOutput(Env& env, const OutputSpec& spec) {
  BARGE_ASSIGN_OR_RETURN(OutputKind kind, OutputKindOf(env, spec.location, spec.allow_nbd));
  std::unique_ptr<Output> out(new Output(kind, spec.location));
  if (kind == OutputKind::kFile) {
    BARGE_ASSIGN_OR_RETURN(out->staged_, OpenStaged(env, spec));
  } else {
    BARGE_ASSIGN_OR_RETURN(out->in_place_, OpenInPlace(env, spec, kind));
  }
  return out;
}

Status Output::Commit() {
  if (staged_) return staged_->Commit();
  return in_place_ ? in_place_->Flush() : OkStatus();  // closed: flushed then
}

Status Output::CloseInPlace() {
  if (!in_place_) return OkStatus();
  Status flushed = in_place_->Flush();
  in_place_.reset();
  return flushed;
}

Status Output::Abandon() {
  if (staged_) return staged_->Abandon();
  return OkStatus();
}

Status Output::Keep() {
  if (staged_) return staged_->Keep();
  return OkStatus();
}

}  // namespace barge::pipeline
