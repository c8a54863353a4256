// `barge backup --base image:NAME`: a catalog image as a base point.
#include "orchestrate/catalog/image_base.h"

#include <chrono>
#include <thread>

#include "blockio/path.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/catalog/catalog_path.h"
#include "pipeline/base_refs.h"
#include "pipeline/file_access.h"
#include "pipeline/replicate.h"
#include "pipeline/small_file.h"

namespace barge::orchestrate {

namespace {

std::string MarkerPath(const std::string& chain_dir) { return JoinPath(chain_dir, pipeline::kCatalogImageMarker); }

// The point of `chain_dir` that holds image `name` with `sha512`, when the
// folder's marker says so and that point's manifest is still there; "" when
// the folder has no marker or it names other content (a changed image).
// kInvalidArgument when the folder holds points but no marker: someone's
// chain of that name, not the image's.
Result<std::string> MarkedPoint(Env& env, const std::string& chain_dir, const std::string& name,
                                const std::string& sha512) {
  auto text = pipeline::ReadSmallFile(env, MarkerPath(chain_dir), 64 << 10);
  if (!text.ok()) {
    if (text.error().code() != ErrorCode::kNotFound) return text.error();
    auto names = env.ListDir(chain_dir);
    if (!names.ok()) {
      if (names.error().code() == ErrorCode::kNotFound) return std::string();
      return names.error();
    }
    for (const std::string& n : *names) {
      if (!n.empty() && n[0] != '.' && n.size() > 5 && n.ends_with(".json")) {
        return Error::InvalidArgument("--base image:" + name + " backs the image up as chain '" + name +
                                      "' of the target, but that folder holds a chain not made from the catalog's "
                                      "image (no " + std::string(pipeline::kCatalogImageMarker) +
                                      "); back the clone up into another --target, or rename that chain")
            .set_path(chain_dir);
      }
    }
    return std::string();
  }
  auto marker = pipeline::DecodeCatalogImageMarker(*text);
  if (!marker.ok()) return Error(marker.error()).set_path(MarkerPath(chain_dir));
  if (marker->image != name) {
    return Error::InvalidArgument("chain folder holds catalog image '" + marker->image + "', not '" + name + "'")
        .set_path(chain_dir);
  }
  if (marker->sha512 != sha512) return std::string();  // the image changed: a new full
  if (!env.Exists(JoinPath(chain_dir, marker->point + ".json"))) return std::string();  // forgotten
  return marker->point;
}

// A ready copy of `image` whose file still matches its checksum record with
// the image's SHA-512, and that record.
Result<std::pair<ImageCopyRecord, pipeline::ReplicaRecord>> ReadyCopy(Env& env, ImageCatalog& catalog,
                                                                       const ImageRecord& image) {
  BARGE_ASSIGN_OR_RETURN(auto copies, catalog.Copies(image.name));
  std::string looked;
  for (const ImageCopyRecord& c : copies) {
    if (c.state != "ready") continue;
    looked += (looked.empty() ? "" : ", ") + c.path;
    auto rec = pipeline::ReadReplicaRecord(env, c.path);
    if (rec.ok() && rec->sha512 == image.sha512 && pipeline::FileMatchesRecord(env, c.path, *rec)) {
      return std::make_pair(c, *rec);
    }
  }
  return Error::NotFound("image " + image.name + " has no ready copy whose file matches its checksum record" +
                         (looked.empty() ? std::string(" (none is ready)") : " (looked at " + looked + ")") +
                         ": 'barge image rescan' or 'barge image sync " + image.name + "' first");
}

}  // namespace

Result<ImageBase> PrepareImageBase(Env& env, ImageCatalog& catalog, const std::string& name,
                                   const pipeline::BackupRequest& clone) {
  BARGE_ASSIGN_OR_RETURN(auto images, catalog.Images(name));
  if (images.empty() || images[0].name != name) {
    return Error::NotFound("no image '" + name + "' in the catalog");
  }
  const ImageRecord& image = images[0];
  if (image.sha512.empty()) return Error::NotFound("image " + name + " has no ready copy yet");
  ImageBase out;
  out.sha512 = image.sha512;
  out.chain_dir = LexicallyNormal(AbsolutePath(JoinPath(clone.target_dir, name)));
  const std::string clone_name =
      clone.disk_name.empty() ? pipeline::DefaultDiskName(clone.source.location) : clone.disk_name;
  if (clone_name == name) {
    return Error::InvalidArgument("the image is kept as chain '" + name +
                                  "' of the target: give the clone another --name")
        .set_path(out.chain_dir);
  }
  BARGE_ASSIGN_OR_RETURN(out.point, MarkedPoint(env, out.chain_dir, name, image.sha512));
  if (out.point.empty()) {
    // Import under the image's lock: cleanup does not remove the copy being
    // read, and two clones importing at once write one point (the second
    // finds the first's marker). A sync or cleanup running: a few waits.
    auto lock = TryLockFile(env, catalog.LockPath(name), "image " + name + " is busy (an add, sync or cleanup)");
    for (int attempt = 0; attempt < 600 && !lock.ok() && lock.error().code() == ErrorCode::kBusy; ++attempt) {
      if (clone.copy.cancel && clone.copy.cancel->load()) {
        return Error::Cancelled("backup interrupted while waiting for image " + name);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      lock = TryLockFile(env, catalog.LockPath(name), "image " + name + " is busy (an add, sync or cleanup)");
    }
    if (!lock.ok()) return lock.error();
    BARGE_ASSIGN_OR_RETURN(out.point, MarkedPoint(env, out.chain_dir, name, image.sha512));
    if (out.point.empty()) {
      BARGE_ASSIGN_OR_RETURN(auto ready, ReadyCopy(env, catalog, image));
      out.copy = ready.first.path;
      pipeline::BackupRequest imp;
      imp.source.location = out.copy;
      imp.source.format = ready.second.format;
      imp.target_dir = clone.target_dir;
      imp.disk_name = name;
      imp.access = clone.access;  // the base is read by whoever reads its clones
      imp.compression = clone.compression;
      imp.compression_level = clone.compression_level;
      imp.copy = clone.copy;
      imp.copy.progress = nullptr;
      // Keeps its SHA-256 table: each clone compares with it without
      // reading the base again (DiffFromBase).
      imp.changed_by = pipeline::ChangedBy::kDigests;
      imp.allow_resize = true;  // a changed image is a new full of the image's chain
      imp.reason = "catalog image " + name + " (sha512 " + image.sha512.substr(0, 16) + "...)";
      BARGE_ASSIGN_OR_RETURN(pipeline::BackupResult r, pipeline::RunBackup(env, imp));
      // The copy must still be the file its record describes: a copy
      // changed while it was read is no copy of the image.
      if (!pipeline::FileMatchesRecord(env, out.copy, ready.second)) {
        return Error::Corruption("copy of image " + name + " changed while it was backed up (point " +
                                 r.manifest.id + " is not marked as the image)")
            .set_path(out.copy);
      }
      pipeline::CatalogImageMarker marker{name, image.sha512, r.manifest.id, out.copy};
      BARGE_ASSIGN_OR_RETURN(std::string text, pipeline::EncodeCatalogImageMarker(marker));
      BARGE_RETURN_IF_ERROR(pipeline::WriteFileLikeFolder(env, MarkerPath(out.chain_dir), text));
      out.point = r.manifest.id;
      out.imported = true;
    }
  }
  out.base = out.chain_dir + "@" + out.point;
  return out;
}

Result<std::optional<std::string>> ImageBaseName(const std::string& base) {
  if (!base.starts_with(kImageBasePrefix)) return std::optional<std::string>();
  std::string name = base.substr(kImageBasePrefix.size());
  if (name.empty() || name.find('@') != std::string::npos) {
    return Error::InvalidArgument("--base image:NAME names an image of the catalog (its point is the one holding the "
                                  "image)");
  }
  return std::optional<std::string>(std::move(name));
}

Result<ImageBase> UseImageBase(Env& env, const std::string& catalog_flag, const std::string& name,
                               pipeline::BackupRequest& req) {
  const std::string flag = "--base " + std::string(kImageBasePrefix) + name;
  BARGE_ASSIGN_OR_RETURN(std::string catalog_path, ExistingCatalogPath(env, catalog_flag));
  if (catalog_path.empty()) {
    return Error::NotFound(flag + ": no image catalog (--catalog, $BARGE_CATALOG)")
        .set_path(ResolveCatalogPath(catalog_flag));
  }
  BARGE_ASSIGN_OR_RETURN(auto catalog, ImageCatalog::Open(env, catalog_path));
  auto prepared = PrepareImageBase(env, *catalog, name, req);
  if (!prepared.ok()) return Error(prepared.error()).Wrap(flag);
  req.base = prepared->base;
  return prepared;
}

}  // namespace barge::orchestrate
