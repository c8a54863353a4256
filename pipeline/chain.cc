// Chain folder scanning, point resolution and digest merging.
#include "pipeline/chain.h"

#include <algorithm>
#include <utility>

#include "blockio/path.h"
#include "pipeline/endpoints.h"
#include "pipeline/merge_journal.h"

namespace barge::pipeline {

Result<std::string> ReadSmallFile(Env& env, const std::string& path, uint64_t max_bytes) {
  BARGE_ASSIGN_OR_RETURN(FileStat st, env.Stat(path));
  if (st.size_bytes > max_bytes) {
    return Error::Corruption("file is too large (" + std::to_string(st.size_bytes) + " bytes)").set_path(path);
  }
  return env.ReadFile(path, max_bytes);
}

Result<formats::DigestTable> LoadDigestTable(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, env.OpenSource(path));
  std::vector<std::byte> bytes(file->size_bytes());
  BARGE_RETURN_IF_ERROR(file->ReadAt(0, bytes));
  auto table = formats::DecodeDigestTable(bytes);
  if (!table.ok()) return Error(table.error()).set_path(path);
  return table;
}

Result<std::unique_ptr<EnvLock>> LockChainFolder(Env& env, const std::string& dir, bool wait) {
  LockOptions o;
  o.wait = wait;
  o.busy_message = "another barge job is writing this chain folder now";
  return env.LockFile(dir + "/.lock", o);
}

Result<ChainFolder> LoadChainFolder(Env& env, const std::string& dir, const EnvLock* held) {
  auto st = env.Stat(dir);
  if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
  if (!st.ok() || !st->is_directory()) {
    return Error::NotFound("no chain folder (no backup of this disk yet?)").set_path(dir);
  }
  // A merge switches files with several renames; its journal says how to
  // finish. Complete it before reading any manifest, so no caller ever sees
  // a half-switched folder (the lock keeps us off a merge still running).
  if (held != nullptr) {
    BARGE_RETURN_IF_ERROR(RecoverMerge(env, dir));
  } else if (MergeJournalExists(env, dir)) {
    auto lock = LockChainFolder(env, dir, /*wait=*/true);
    if (!lock.ok()) {
      return Error(lock.error()).Wrap("an interrupted merge must be completed first");
    }
    BARGE_RETURN_IF_ERROR(CompleteMergeJournal(env, dir));
  }
  ChainFolder chain;
  chain.dir = dir;
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.' || Extension(name) != ".json") continue;
    const std::string path = chain.PathOf(name);
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(env, path));
    auto m = formats::DecodeManifest(text);
    if (!m.ok()) return Error(m.error()).set_path(path);
    ChainPoint p;
    p.manifest = std::move(m).value();
    p.manifest_path = path;
    // The id starts with the 4+ digit sequence.
    const std::string& id = p.manifest.id;
    size_t digits = 0;
    while (digits < id.size() && std::isdigit(static_cast<unsigned char>(id[digits]))) ++digits;
    if (digits == 0 || digits > 9) {
      return Error::Corruption("backup id does not start with a sequence number: " + id)
          .set_path(p.manifest_path);
    }
    p.sequence = static_cast<uint32_t>(std::stoul(id.substr(0, digits)));
    chain.points.push_back(std::move(p));
  }
  std::sort(chain.points.begin(), chain.points.end(),
            [](const ChainPoint& a, const ChainPoint& b) { return a.sequence < b.sequence; });
  for (size_t i = 1; i < chain.points.size(); ++i) {
    if (chain.points[i].sequence == chain.points[i - 1].sequence) {
      return Error::Corruption("two backups with sequence " +
                               std::to_string(chain.points[i].sequence))
          .set_path(dir);
    }
  }
  return chain;
}

Result<size_t> ChainFolder::Resolve(std::string_view at) const {
  if (points.empty()) return Error::NotFound("the chain folder holds no backups").set_path(dir);
  if (at.empty() || at == "latest") return points.size() - 1;
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].manifest.id == at) return i;
  }
  if (std::all_of(at.begin(), at.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) &&
      at.size() <= 9) {
    uint32_t seq = static_cast<uint32_t>(std::stoul(std::string(at)));
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].sequence == seq) return i;
    }
    return Error::NotFound("no backup at position " + std::string(at)).set_path(dir);
  }
  // A time: compare compact forms (20261122T150102Z), which sort as text.
  std::string wanted = formats::CompactTimestamp(at);
  if (wanted.size() >= 8 && std::isdigit(static_cast<unsigned char>(wanted[0]))) {
    std::optional<size_t> best;
    for (size_t i = 0; i < points.size(); ++i) {
      std::string started = formats::CompactTimestamp(points[i].manifest.started_at);
      if (!started.empty() && started <= wanted) best = i;
    }
    if (best) return *best;
    return Error::NotFound("no backup started at or before " + std::string(at)).set_path(dir);
  }
  return Error::NotFound("no backup '" + std::string(at) +
                         "' (use an id, a position, a time or 'latest')")
      .set_path(dir);
}

Result<std::vector<size_t>> ChainFolder::LayersOf(size_t index) const {
  std::vector<size_t> layers;
  size_t cur = index;
  while (true) {
    layers.push_back(cur);
    if (layers.size() > points.size()) {
      return Error::Corruption("parent links form a loop").set_path(points[index].manifest_path);
    }
    const auto& m = points[cur].manifest;
    if (!m.parent) break;
    auto it = std::find_if(points.begin(), points.end(),
                           [&](const ChainPoint& p) { return p.manifest.id == m.parent->id; });
    if (it == points.end()) {
      return Error::Corruption("parent backup " + m.parent->id + " is missing from the chain folder")
          .set_path(points[cur].manifest_path);
    }
    if (it->manifest.image_digest != m.parent->image_digest) {
      return Error::Corruption("parent backup " + m.parent->id +
                               " does not match the digest recorded by its child")
          .set_path(points[cur].manifest_path);
    }
    if (it->manifest.image != m.parent->image) {
      return Error::Corruption("parent image name differs from the parent's manifest")
          .set_path(points[cur].manifest_path);
    }
    cur = static_cast<size_t>(it - points.begin());
  }
  std::reverse(layers.begin(), layers.end());
  return layers;
}

Result<formats::DigestTable> EffectiveDigests(Env& env, const ChainFolder& chain, size_t index) {
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  std::vector<formats::DigestTable> tables;
  tables.reserve(layers.size());
  for (size_t i : layers) {
    const auto& m = chain.points[i].manifest;
    BARGE_ASSIGN_OR_RETURN(formats::DigestTable t, LoadDigestTable(env, chain.PathOf(m.digest_table)));
    if (t.cluster_bytes != m.cluster_size || t.virtual_size != m.virtual_size) {
      return Error::Corruption("digest table does not match its manifest (cluster or disk size)")
          .set_path(chain.PathOf(m.digest_table));
    }
    tables.push_back(std::move(t));
  }
  std::vector<const formats::DigestTable*> ptrs;
  for (const auto& t : tables) ptrs.push_back(&t);
  BARGE_ASSIGN_OR_RETURN(formats::DigestTable merged, formats::MergeDigestTables(ptrs));
  const auto& top = chain.points[index].manifest;
  if (formats::ImageDigestOf(merged) != top.image_digest) {
    return Error::Corruption("the digest tables of backup " + top.id +
                             " do not add up to its recorded image digest")
        .set_path(chain.points[index].manifest_path);
  }
  return merged;
}

std::optional<formats::Digest128> FindDigest(const formats::DigestTable& table,
                                             uint64_t cluster_index) {
  auto it = std::lower_bound(table.entries.begin(), table.entries.end(), cluster_index,
                             [](const formats::DigestEntry& e, uint64_t c) {
                               return e.cluster_index < c;
                             });
  if (it == table.entries.end() || it->cluster_index != cluster_index) return std::nullopt;
  return it->digest;
}

}  // namespace barge::pipeline

namespace barge::pipeline {

std::optional<formats::Digest128> OpenedPoint::Expected(uint64_t cluster_index) const {
  if (auto d = FindDigest(digests, cluster_index)) return d;
  return formats::ZeroClusterDigest(digests.cluster_bytes);
}

Result<OpenedPoint> OpenPoint(Env& env, const ChainFolder& chain, size_t index) {
  OpenedPoint out;
  out.index = index;
  out.point = &chain.points[index];
  BARGE_ASSIGN_OR_RETURN(out.digests, EffectiveDigests(env, chain, index));
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  formats::OpenOptions options;
  options.format = formats::ImageFormat::kQcow2;
  options.allowed_dirs = {chain.dir};
  const auto& m = out.point->manifest;
  auto image = OpenImageFile(env, chain.PathOf(m.image), options);
  if (!image.ok()) return Error(image.error()).Wrap("backup " + m.id);
  out.image = std::move(image).value();
  // Walk the qcow2 chain top down and the manifests' layers newest first.
  const formats::Image* layer = out.image.get();
  for (size_t k = layers.size(); k-- > 0;) {
    const auto& lm = chain.points[layers[k]].manifest;
    if (layer == nullptr) {
      return Error::Corruption("the image chain ends before layer " + lm.id)
          .set_path(chain.PathOf(m.image));
    }
    if (BaseName(layer->info().path) != lm.image) {
      return Error::Corruption("image chain layer " + layer->info().path +
                               " is not the layer the manifests name (" + lm.image + ")")
          .set_path(chain.PathOf(m.image));
    }
    if (layer->size_bytes() < lm.virtual_size) {
      return Error::Corruption("layer image is smaller than its manifest says")
          .set_path(layer->info().path);
    }
    layer = layer->backing();
  }
  if (layer != nullptr) {
    return Error::Corruption("the full backup's image has a backing file: " + layer->info().path)
        .set_path(chain.PathOf(m.image));
  }
  return out;
}

Result<PointLocation> LocatePoint(Env& env, const std::string& path, const std::string& at) {
  auto st = env.Stat(path);
  if (st.ok() && st->is_directory()) return PointLocation{path, at};
  if (!st.ok()) {
    if (st.error().code() != ErrorCode::kNotFound) return st.error();
    return Error::NotFound("no such backup, image or chain folder").set_path(path);
  }
  std::string dir = DirName(path);
  std::string manifest = path;
  if (std::string ext = Extension(path); ext != ".json") {
    manifest = path.substr(0, path.size() - ext.size()) + ".json";
  }
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(env, manifest));
  BARGE_ASSIGN_OR_RETURN(formats::BackupManifest m, formats::DecodeManifest(text));
  if (!at.empty() && at != "latest" && at != m.id) {
    return Error::InvalidArgument("--at conflicts with the backup the path names (" + m.id + ")");
  }
  return PointLocation{dir, m.id};
}

}  // namespace barge::pipeline
