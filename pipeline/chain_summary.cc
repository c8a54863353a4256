// Chain folder summaries, the search for chain folders below a target, and
// the view `list` prints.
#include "pipeline/chain_summary.h"

#include <algorithm>

#include "blockio/path.h"
#include "formats/units.h"
#include "pipeline/base_refs.h"

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

namespace {

std::optional<double> SecondsBetween(const std::string& from, const std::string& to) {
  auto a = formats::ParseRfc3339(from);
  auto b = formats::ParseRfc3339(to);
  if (!a.ok() || !b.ok()) return std::nullopt;
  return static_cast<double>(b->seconds - a->seconds) + (b->nanos - a->nanos) / 1e9;
}

}  // namespace

Result<ChainListing> ListChain(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(PointLocation where, LocatePoint(env, path, ""));
  BARGE_ASSIGN_OR_RETURN(ChainFolder chain, LoadChainFolder(env, where.chain_dir));
  ChainListing out;
  out.chain_dir = chain.dir;
  const ChainSummary summary = SummarizeChain(env, chain);
  out.image_bytes = summary.image_bytes;
  for (size_t i = 0; i < chain.points.size(); ++i) {
    PointView p;
    p.position = i;
    p.manifest = chain.points[i].manifest;
    const formats::BackupManifest& m = p.manifest;
    const Result<FileStat>& st = summary.images[i];
    if (st.ok()) {
      p.image = *st;
    } else {
      out.warnings.push_back({"the image of backup " + m.id + " is missing: " + st.error().ToString(),
                              chain.PathOf(m.image)});
    }
    auto layers = chain.LayersOf(i);
    if (layers.ok()) {
      p.chain = chain.points[layers->front()].manifest.id;
      if (std::find(out.chain_order.begin(), out.chain_order.end(), p.chain) == out.chain_order.end()) {
        out.chain_order.push_back(p.chain);
      }
    } else {
      p.broken = layers.error().message();
      out.warnings.push_back({"backup " + m.id + " cannot be restored: " + p.broken, chain.points[i].manifest_path});
    }
    // A clone's base (`backup --base`) lives in another folder: gone or
    // changed, this point and those over it cannot be restored.
    if (m.base) {
      if (auto base = LoadBaseOf(env, chain, i); !base.ok()) {
        // LoadBaseOf's sentence names the base, the point and where.
        out.warnings.push_back({base.error().message() + " (until then this point and those over it cannot be "
                                    "restored)",
                                chain.points[i].manifest_path});
      }
    }
    // The newest layer modification time, from the stats above (0: a layer
    // is missing or cannot be followed).
    int64_t newest_layer_mtime_ns = 0;
    for (size_t l : layers.ok() ? *layers : std::vector<size_t>{}) {
      const std::optional<FileStat>& layer = l == i ? p.image : out.points[l].image;
      if (!layer) {
        newest_layer_mtime_ns = 0;
        break;
      }
      newest_layer_mtime_ns = std::max(newest_layer_mtime_ns, layer->mtime_ns);
    }
    auto v = ReadLastVerification(env, chain, i, p.image ? *p.image : FileStat{}, newest_layer_mtime_ns);
    if (v.ok()) {
      p.verification = *v;
    } else {
      out.warnings.push_back(
          {"unreadable verification record (shown as never verified): " + v.error().message(), v.error().path()});
    }
    if (m.duration_seconds) {
      p.duration_seconds = *m.duration_seconds;
    } else if (auto d = SecondsBetween(m.started_at, m.finished_at); d && *d >= 0) {
      p.duration_seconds = *d;
    }
    out.points.push_back(std::move(p));
  }
  if (!chain.points.empty()) {
    auto live = LiveDependents(env, chain.dir, /*sweep=*/false);
    if (!live.ok()) {
      out.warnings.push_back({"cannot read the base references: " + live.error().message(), live.error().path()});
    } else {
      for (PointView& p : out.points) {
        if (auto it = live->find(p.manifest.id); it != live->end()) p.dependents = it->second;
      }
    }
  }
  for (PointView& p : out.points) {
    if (!p.manifest.parent) continue;
    for (const PointView& q : out.points) {
      if (q.manifest.id == p.manifest.parent->id) p.parent_position = q.position;
    }
  }
  if (!out.points.empty()) out.virtual_size = out.points.back().manifest.virtual_size;
  // A backup or policy target (`backup --target`, a policy's targets) holds
  // chain folders, not points: list them. One that fails to load is a
  // warning, never a folder silently searched past.
  if (out.points.empty()) out.below = FindChainFolders(env, chain.dir);
  for (const FoundChainFolder& f : out.below) {
    if (!f.summary.ok()) {
      out.warnings.push_back({"chain folder " + f.relative + " cannot be loaded: " + f.summary.error().ToString(),
                              f.path});
    }
  }
  return out;
}

}  // namespace barge::pipeline
