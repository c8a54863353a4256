// Chain folder summaries and the search for chain folders below a target.
#include "pipeline/chain_summary.h"

#include <algorithm>

#include "blockio/path.h"

namespace barge::pipeline {

ChainSummary SummarizeChain(Env& env, const ChainFolder& chain) {
  ChainSummary s;
  s.points = chain.points.size();
  if (!chain.points.empty()) {
    s.latest = chain.latest().manifest.id;
    s.latest_started_at = chain.latest().manifest.started_at;
  }
  s.images.reserve(chain.points.size());
  for (const ChainPoint& p : chain.points) {
    Result<FileStat> st = env.Stat(chain.PathOf(p.manifest.image));
    if (st.ok()) s.image_bytes += st->size_bytes;
    s.images.push_back(std::move(st));
  }
  return s;
}

namespace {

void FindBelow(Env& env, const std::string& dir, const std::string& relative, int depth, int max_depth,
               std::vector<FoundChainFolder>& found) {
  auto names = env.ListDir(dir);
  if (!names.ok()) return;
  std::sort(names->begin(), names->end());
  for (const std::string& name : *names) {
    if (name.empty() || name[0] == '.') continue;
    const std::string path = JoinPath(dir, name);
    const std::string rel = relative.empty() ? name : relative + "/" + name;
    // LoadChainFolder stats `path` first: kNotFound naming it is no folder.
    auto chain = LoadChainFolder(env, path);
    if (!chain.ok() && chain.error().code() == ErrorCode::kNotFound && chain.error().path() == path) continue;
    if (!chain.ok()) {
      // Manifests that do not load make a broken chain folder, not a plain
      // one to search deeper: the caller reports it.
      found.push_back({path, rel, chain.error()});
    } else if (!chain->points.empty()) {
      found.push_back({path, rel, SummarizeChain(env, *chain)});
    } else if (depth < max_depth) {
      FindBelow(env, path, rel, depth + 1, max_depth, found);
    }
  }
}

}  // namespace

std::vector<FoundChainFolder> FindChainFolders(Env& env, const std::string& dir, int max_depth) {
  std::vector<FoundChainFolder> found;
  FindBelow(env, dir, "", 1, max_depth, found);
  return found;
}

}  // namespace barge::pipeline
