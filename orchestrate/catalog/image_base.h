// `barge backup --base image:NAME`: a backing image of the image catalog
// (docs/replication.md) as the base of a new chain. The image becomes a
// point of the chain TARGET/NAME, backed up once from a ready copy and
// found again by its SHA-512 (TARGET/NAME/.catalog-image.json); the new
// chain stands on that point as on any base (docs/formats/backup.md, "A
// catalog image as the base").
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/catalog/image_catalog.h"
#include "pipeline/backup.h"

namespace barge::orchestrate {

// The --base prefix that names a catalog image instead of a chain.
inline constexpr std::string_view kImageBasePrefix = "image:";

struct ImageBase {
  std::string base;       // for BackupRequest::base: "<chain folder>@<point id>"
  std::string chain_dir;  // TARGET/NAME
  std::string point;      // the point that holds the image
  std::string copy;       // the copy the point was read from
  std::string sha512;     // the image's
  bool imported = false;  // this call wrote the point (else it was there)
};

// Finds or makes the base point of catalog image `name` for a backup like
// `clone` (its target, compression, geometry, threads, memory, cancel).
// The point is TARGET/NAME's whose marker names `name` with the catalog's
// SHA-512 for it; without one, a ready copy whose file still matches its
// checksum record is backed up (a full) into TARGET/NAME and the marker
// written after it. Holds the image's catalog lock (the one image add,
// sync and cleanup take) while it reads a copy, so `image cleanup` never
// removes the copy under it.
// Returns:
//   the base;
//   kNotFound: no such image in the catalog, or no ready copy of it whose
//     file matches its record (naming the image and the copies looked at);
//   kInvalidArgument: TARGET/NAME is the clone's own chain, or holds a
//     chain not made from this image (no marker);
//   kBusy (retryable): another add, sync or cleanup of the image runs;
//   the import's errors (RunBackup's).
Result<ImageBase> PrepareImageBase(Env& env, ImageCatalog& catalog, const std::string& name,
                                   const pipeline::BackupRequest& clone);

// The image a --base value names: nullopt for a chain (no "image:"
// prefix), else NAME. kInvalidArgument: an empty NAME, or one with '@' (an
// image's point is the one holding it).
Result<std::optional<std::string>> ImageBaseName(const std::string& base);

// `--base image:NAME --catalog FLAG`: opens the image catalog FLAG names
// (ExistingCatalogPath: $BARGE_CATALOG, the default), prepares the image's
// base point for `req` (PrepareImageBase) and sets req.base to it.
// Returns the base, or kNotFound (no catalog there, naming its path) or
// PrepareImageBase's errors, wrapped with "--base image:NAME".
Result<ImageBase> UseImageBase(Env& env, const std::string& catalog_flag, const std::string& name,
                               pipeline::BackupRequest& req);

}  // namespace barge::orchestrate
