// Chains over a base (`barge backup --base`, docs/formats/backup.md
// "Chains over a base"): the reference files by which a base chain knows
// who stands on it (BASE/.bases/<chain id>.json), without any shared
// database, and the marker of a chain made from a catalog image. Which
// clusters differ from a base: DiffFromBase (pipeline/digest_changes.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::pipeline {

// The folder of reference files in a base chain's folder.
inline constexpr std::string_view kBaseRefsDir = ".bases";

// One dependent chain standing on a point of this folder.
struct BaseRef {
  std::string dependent;  // the dependent chain's folder, relative to the
                          // base chain's folder ("../clone1")
  std::string chain_id;   // the dependent chain's id (the file's stem)
  std::string base_id;    // the point of this folder it stands on
};

// JSON of a reference file, and its parser (untrusted bytes: kCorruption
// on anything but a well-formed reference with safe names).
std::string EncodeBaseRef(const BaseRef& ref);
Result<BaseRef> DecodeBaseRef(std::string_view text);

// A chain folder made from an image of the image catalog (`barge backup
// --base image:NAME`, docs/formats/backup.md "A catalog image as the
// base") holds CHAIN/.catalog-image.json: which point of the folder holds
// which catalog image, so that later clones stand on the same point.
inline constexpr std::string_view kCatalogImageMarker = ".catalog-image.json";

struct CatalogImageMarker {
  std::string image;   // the catalog's image name
  std::string sha512;  // the image's SHA-512 (128 lowercase hex digits)
  std::string point;   // the point of this folder that holds it
  std::string copy;    // the copy it was read from (informative)
};

// JSON of the marker, and its parser (untrusted bytes: kCorruption on
// anything but a well-formed marker with a safe point id).
// Encoding fails (kInvalidArgument) only on text that is not UTF-8.
Result<std::string> EncodeCatalogImageMarker(const CatalogImageMarker& marker);
Result<CatalogImageMarker> DecodeCatalogImageMarker(std::string_view text);

// The relative path from folder `from` to folder `to` (both made absolute
// and normalized first): "../golden".
std::string RelativeFolderPath(const std::string& from, const std::string& to);

// Writes BASE_DIR/.bases/<ref.chain_id>.json atomically (temporary name,
// fsync, rename, folder fsync) through `env`, making the folder if needed.
Status WriteBaseRef(Env& env, const std::string& base_dir, const BaseRef& ref);

// The live dependents of each point of `base_dir`: point id -> the
// dependent chain folders (normalized paths), one entry per chain. A
// reference is live when its dependent folder holds a manifest of its chain
// id whose base is this folder's point; a reference whose dependent is gone
// (folder missing, or no such manifest any more: forgotten, or a killed
// backup that never committed) is stale: ignored, and removed when
// `sweep`. A dependent folder that cannot be read counts as live.
Result<std::map<std::string, std::vector<std::string>>> LiveDependents(Env& env, const std::string& base_dir,
                                                                      bool sweep);

// Removes the reference of chain `chain_id` from `base_dir` (a dependent
// chain forgotten entirely). A missing file is fine.
Status RemoveBaseRef(Env& env, const std::string& base_dir, const std::string& chain_id);

}  // namespace barge::pipeline
