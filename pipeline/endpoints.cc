// Source opening for every job.
#include "pipeline/endpoints.h"

#include "blockio/http_source.h"
#include "blockio/s3_client.h"
#include "blockio/s3_source.h"
#include "blockio/path.h"
#include "pipeline/http_endpoint.h"

namespace barge::pipeline {

std::string_view SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kFile: return "file";
    case SourceKind::kBlockDevice: return "block device";
    case SourceKind::kNbd: return "nbd";
    case SourceKind::kHttp: return "url";
  }
  return "unknown";
}

std::string OpenedSource::format_name() const {
  if (kind == SourceKind::kNbd) return "nbd";
  return std::string(formats::ImageFormatName(image->format()));
}

void ApplyFolderRule(formats::OpenOptions& options, const std::string& path, bool allow_any_path,
                     std::vector<std::string> extra_dirs) {
  options.allow_any_path = allow_any_path;
  if (allow_any_path || extra_dirs.empty()) return;
  options.allowed_dirs = std::move(extra_dirs);
  options.allowed_dirs.push_back(DirName(AbsolutePath(path)));
}

formats::SourceOpener EnvSourceOpener(Env& env) {
  return [&env](const std::string& path) { return env.OpenSource(path); };
}

formats::PathInspector EnvPathInspector(Env& env) {
  return [&env](const std::string& path) {
    formats::PathFacts facts;
    facts.canonical = CanonicalPath(env, path);
    if (auto st = env.Stat(path); st.ok()) facts.identity = std::pair{st->device, st->inode};
    return facts;
  };
}

Result<std::unique_ptr<formats::Image>> OpenImageFile(Env& env, const std::string& path,
                                                      formats::OpenOptions options) {
  options.inspect_path = EnvPathInspector(env);
  return formats::OpenImage(path, EnvSourceOpener(env), options);
}

namespace {

// The image behind an http(s) URL or an s3:// object: the object itself,
// and nothing it names.
Result<OpenedSource> OpenHttp(Env& env, const SourceSpec& spec, formats::OpenOptions options) {
  const bool s3 = IsS3Url(spec.location);
  const std::string name = s3 ? spec.location : RedactHttpUrl(spec.location);
  if (!spec.snapshot.empty() && spec.format == "raw") {
    return Error::InvalidArgument("a raw image has no internal snapshots").set_path(name);
  }
  BARGE_ASSIGN_OR_RETURN(HttpOptions http, HttpOptionsFor(env, spec.http));
  BARGE_ASSIGN_OR_RETURN(HttpSourceOpened opened,
                         s3 ? OpenS3Source(spec.location, http) : OpenHttpSource(env, spec.location, http));
  OpenedSource out;
  out.kind = SourceKind::kHttp;
  out.remote_version = name + " length " + std::to_string(opened.object.length_bytes) + " etag " +
                       opened.object.etag + " modified " + opened.object.last_modified;
  BARGE_ASSIGN_OR_RETURN(out.image, OpenObjectImage(std::move(opened.source), name, options));
  return out;
}

}  // namespace

Result<OpenedSource> OpenSource(Env& env, const SourceSpec& spec) {
  OpenedSource out;
  formats::OpenOptions options;
  options.allow_any_path = spec.allow_any_path;
  options.snapshot = spec.snapshot;
  if (!spec.format.empty()) {
    BARGE_ASSIGN_OR_RETURN(options.format, formats::ParseImageFormat(spec.format));
  }
  if (IsNbdUri(spec.location)) {
    // Messages and the image's name carry the URI without its secrets.
    const std::string name = RedactNbdUri(spec.location);
    if (spec.format == "qcow2") {
      return Error::InvalidArgument("an NBD export is read as raw guest data (the server decodes the format)")
          .set_path(name);
    }
    if (!spec.snapshot.empty()) {
      return Error::InvalidArgument("an NBD export has no internal snapshots; read the qcow2 file at the snapshot")
          .set_path(name);
    }
    BARGE_ASSIGN_OR_RETURN(NbdOptions nbd_options, NbdOptionsFor(env, spec.location, spec.nbd));
    nbd_options.dirty_bitmap_context = spec.nbd_dirty_context;
    nbd_options.retry = spec.nbd_retry;
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<NbdSource> nbd, OpenNbd(spec.location, nbd_options));
    out.nbd = nbd.get();
    out.kind = SourceKind::kNbd;
    options.format = formats::ImageFormat::kRaw;
    // The opener hands over the connection we already made.
    auto held = std::make_shared<std::unique_ptr<NbdSource>>(std::move(nbd));
    formats::SourceOpener opener = [held](const std::string&) -> Result<std::unique_ptr<BlockSource>> {
      if (!*held) return Error::InvalidArgument("NBD source opened twice");
      return std::unique_ptr<BlockSource>(std::move(*held));
    };
    BARGE_ASSIGN_OR_RETURN(out.image, formats::OpenImage(name, opener, options));
    return out;
  }
  if (IsHttpUrl(spec.location) || IsS3Url(spec.location)) return OpenHttp(env, spec, options);
  auto st = env.Stat(spec.location);
  out.kind = st.ok() && st->is_block_device() ? SourceKind::kBlockDevice : SourceKind::kFile;
  ApplyFolderRule(options, spec.location, spec.allow_any_path, spec.allow_dirs);
  BARGE_ASSIGN_OR_RETURN(out.image, OpenImageFile(env, spec.location, options));
  return out;
}

}  // namespace barge::pipeline
