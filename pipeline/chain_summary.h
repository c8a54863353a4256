// Chain folders at a glance (barge list): one folder's summary, and the
// chain folders found below a backup or policy target.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "pipeline/chain.h"

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

}  // namespace barge::pipeline
