// RunConvert: the five steps of a copy job, with an optional backing image
// to store differences against.
#include "pipeline/convert.h"

#include <optional>

#include "blockio/path.h"
#include "pipeline/output.h"

namespace barge::pipeline {

Result<ConvertResult> RunConvert(Env& env, const ConvertRequest& req) {
  const bool qcow2 = req.format == DestinationFormat::kQcow2;
  SourceSpec source = req.source;
  source.nbd_retry = req.copy.nbd_retry;
  BARGE_ASSIGN_OR_RETURN(OpenedSource src, OpenSource(env, source));
  formats::Image& image = *src.image;
  const uint64_t size = image.size_bytes();

  OutputSpec out_spec;
  out_spec.location = req.destination;
  out_spec.replace = OutputReplace::kForceIfFileExists;
  out_spec.force = req.force;
  out_spec.sync = req.sync;
  out_spec.access = req.access;
  out_spec.allow_nbd = false;
  out_spec.size_bytes = size;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Output> output, OpenOutput(env, out_spec));
  if (qcow2 && output->in_place()) {
    return Error::NotSupported("qcow2 output goes to a file, not a block device").set_path(req.destination);
  }

  // The backing image, opened to compare against: the output stores only
  // the clusters that read differently (as qemu-img convert -B does).
  std::optional<OpenedSource> backing;
  const std::string backing_format = req.backing_format.empty() ? "qcow2" : req.backing_format;
  if (!req.backing.empty()) {
    SourceSpec bspec;
    bspec.location = LexicallyNormal(JoinPath(DirName(req.destination), req.backing));
    bspec.format = backing_format;
    bspec.allow_any_path = req.source.allow_any_path;
    bspec.allow_dirs = req.source.allow_dirs;
    auto opened = OpenSource(env, bspec);
    if (!opened.ok()) {
      return Error(opened.error())
          .Wrap("cannot open the backing file '" + req.backing +
                "' (named relative to the output; convert stores only what differs from it)");
    }
    backing = std::move(opened).value();
  }

  DestinationSpec dest_spec;
  dest_spec.format = req.format;
  dest_spec.virtual_size = size;
  dest_spec.cluster_bytes = req.copy.cluster_bytes;
  dest_spec.compression = req.copy.compression;
  if (backing) {
    dest_spec.backing_file = req.backing;
    dest_spec.backing_format = backing_format;
    dest_spec.overlay_diff_against = backing->image.get();
  }
  // An existing device may hold old data: zero ranges must be written.
  dest_spec.skip_zeroes_if_zero_initialized = !output->in_place();
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<Destination> dest, MakeDestination(output->sink(), dest_spec));

  Destination* dests[] = {dest.get()};
  BARGE_ASSIGN_OR_RETURN(CopyResult copied, RunCopy(image, WholeDisk(image), dests, req.copy));
  BARGE_RETURN_IF_ERROR(output->Commit());

  ConvertResult r;
  r.virtual_size = size;
  r.bytes_read = copied.bytes_read;
  if (!output->in_place()) {
    if (auto st = env.Stat(req.destination); st.ok()) r.bytes_written = st->size_bytes;
  }
  r.clusters = copied.clusters;
  r.image_digest = copied.image_digest;
  r.seconds = std::chrono::duration<double>(copied.elapsed).count();
  return r;
}

Status CheckConvertOptions(DestinationFormat format, bool compressed, bool has_backing, bool has_backing_format,
                           bool cluster_size_given) {
  const bool qcow2 = format == DestinationFormat::kQcow2;
  if (!qcow2 && compressed) return Error::InvalidArgument("--compress needs -O qcow2");
  if (has_backing && !qcow2) return Error::InvalidArgument("--backing needs -O qcow2");
  if (has_backing_format && !has_backing) return Error::InvalidArgument("--backing-format needs --backing");
  if (!qcow2 && cluster_size_given) {
    return Error::InvalidArgument("--cluster-size needs -O qcow2 (a raw output has no clusters)");
  }
  return OkStatus();
}

}  // namespace barge::pipeline
