// Opening what jobs read from: image files (raw or qcow2 with its chain),
// block devices, NBD exports and http(s):// URLs, all as a formats::Image
// guest view.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/http_client.h"
#include "blockio/nbd.h"
#include "pipeline/nbd_endpoint.h"
#include "formats/image.h"

namespace barge::pipeline {

struct SourceSpec {
  std::string location;  // path, block device, NBD URI, http(s):// URL or s3:// object
  // "" = detect for files (qcow2 magic, else raw). "raw" is never probed: a
  // raw disk whose first bytes look like qcow2 stays raw. NBD is always raw.
  std::string format;
  bool allow_any_path = false;          // backing/data files anywhere
  std::vector<std::string> allow_dirs;  // extra folders for backing/data files
  NbdAccess nbd;                        // connections and TLS of an NBD URI
  std::string nbd_dirty_context;        // e.g. "qemu:dirty-bitmap:backup-vda"
  NbdRetryPolicy nbd_retry;             // reconnecting after a drop
  // Read a qcow2 file at this internal snapshot (id or unique name) instead
  // of its active state (formats::OpenOptions::snapshot); "" = active.
  // Refused for NBD exports and raw images.
  std::string snapshot;
  // TLS authorities, credentials file, timeouts and retries of an http(s)
  // URL (HttpOptionsFor checks its files); ignored for other locations.
  HttpOptions http;
};

enum class SourceKind : uint8_t { kFile, kBlockDevice, kNbd, kHttp };
std::string_view SourceKindName(SourceKind kind);

struct OpenedSource {
  std::unique_ptr<formats::Image> image;  // the guest view
  SourceKind kind = SourceKind::kFile;
  NbdSource* nbd = nullptr;  // points into `image` when kind == kNbd
  // kHttp: the URL without credentials and the object's length, ETag and
  // Last-Modified, which pin what was read (a resumed copy must be of the
  // same version: ReplicateOptions::resume_identity).
  std::string remote_version;
  // "raw", "qcow2" or "nbd" (as recorded in manifests).
  std::string format_name() const;
};

// Files, block devices and backing chains are opened through `env`, which
// must outlive the opened source. An http(s) URL is one object read by
// ranged GETs (blockio/http_source.h), qcow2 or raw as probed; a qcow2
// behind a URL that names a backing or data file is refused
// (kInvalidArgument): barge follows no second object from a URL. An
// s3://BUCKET/KEY object is read the same way, signed, with http.s3's
// endpoint and keys (blockio/s3_source.h).
Result<OpenedSource> OpenSource(Env& env, const SourceSpec& spec);

// The folder rule of an image opened by path (--allow-any-path,
// --allow-dir): its backing and data files must lie under its own folder,
// and folders given beside it add to that folder rather than replace it.
// Sets `options` for the image at `path`: allow_any_path lifts the rule;
// without `extra_dirs`, allowed_dirs is left as it is (empty: formats'
// default, the image's own folder alone).
void ApplyFolderRule(formats::OpenOptions& options, const std::string& path, bool allow_any_path,
                     std::vector<std::string> extra_dirs);

// formats::OpenImage's view of the filesystem through `env` (which must
// outlive what is opened with them): the opener of every file of a chain,
// and the path facts of its folder policy (canonical names, identities).
formats::SourceOpener EnvSourceOpener(Env& env);
formats::PathInspector EnvPathInspector(Env& env);
// formats::OpenImage of `path` through `env` (opener and path facts set).
Result<std::unique_ptr<formats::Image>> OpenImageFile(Env& env, const std::string& path,
                                                      formats::OpenOptions options = {});

}  // namespace barge::pipeline
