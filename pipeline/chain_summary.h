// Chain folders at a glance (barge list): one folder's summary, the chain
// folders found below a backup or policy target, and the whole view `list`
// prints of a folder or target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "pipeline/chain.h"
#include "pipeline/verification_record.h"

namespace barge::pipeline {

struct ChainSummary {
  size_t points = 0;
  std::string latest;             // id of the newest point ("" without points)
  std::string latest_started_at;  // its manifest's started_at
  // In step with ChainFolder::points: the stat of each point's image file,
  // or why it cannot be had (kNotFound: the image is missing).
  std::vector<Result<FileStat>> images;
  uint64_t image_bytes = 0;       // sizes of the image files present
};

// Stats each point's image file once (through `env`).
ChainSummary SummarizeChain(Env& env, const ChainFolder& chain);

// A chain folder found below a target.
struct FoundChainFolder {
  std::string path;
  std::string relative;  // below the folder searched, '/'-separated
  // Its summary, or why its manifests could not be loaded (a broken chain
  // folder: LoadChainFolder's error).
  Result<ChainSummary> summary;
};

// The chain folders below `dir`, up to `max_depth` levels down (a target's
// TARGET/<policy>/<domain>/<disk>/ is three: docs/policies.md), sorted by
// path. A folder with points is a chain folder and is not searched
// further; nor is one that fails to load (LoadChainFolder: a manifest that
// does not decode, an unreadable folder): it is returned with the error.
// Hidden entries, files and a `dir` that cannot be listed are passed
// over. Reads through `env`.
std::vector<FoundChainFolder> FindChainFolders(Env& env, const std::string& dir, int max_depth = 3);

// One point as `list` shows it.
struct PointView {
  size_t position = 0;
  formats::BackupManifest manifest;
  std::optional<FileStat> image;  // nullopt: the image file is missing
  std::string chain;              // id of the point's full; "" if a link is broken
  std::string broken;             // why the layers cannot be followed
  // The position of the point its manifest names as parent (nullopt: no
  // parent, or none of the folder's points has that id).
  std::optional<size_t> parent_position;
  // The manifest's own measure, else from its start and finish times
  // (older manifests have only those; nullopt when they do not parse or
  // run backwards).
  std::optional<double> duration_seconds;
  std::optional<LastVerification> verification;
  // The chain folders of the chains that stand on this point (`backup
  // --base`; its live base references, pipeline/base_refs.h).
  std::vector<std::string> dependents;
};

// What `list` says of a path: the chain folder it names (or that holds the
// manifest or image it names), its points, and, when it has none, the
// chain folders below it (a backup or policy target).
struct ChainListing {
  std::string chain_dir;
  std::vector<PointView> points;
  std::vector<std::string> chain_order;  // ids of the fulls, as they appear
  uint64_t image_bytes = 0;              // sizes of the image files present
  uint64_t virtual_size = 0;             // the newest point's (0 without points)
  // Without points: FindChainFolders of the folder.
  std::vector<FoundChainFolder> below;
  // What the caller should warn about, in the order found: a missing
  // image, a point whose layers cannot be followed, an unreadable
  // verification record, a chain folder below that does not load.
  struct Warning {
    std::string message;
    std::string path;
  };
  std::vector<Warning> warnings;
};

// Locates `path` (LocatePoint), loads its chain folder and builds the view,
// reading through `env`: one stat per image file. Fails only when the path
// or its chain folder cannot be loaded; what is wrong with single points is
// in `warnings`.
Result<ChainListing> ListChain(Env& env, const std::string& path);

}  // namespace barge::pipeline
