// Chain folder scanning, point resolution and digest merging.
#include "pipeline/chain.h"

#include <algorithm>
#include <utility>

#include "blockio/leftovers.h"
#include "blockio/path.h"
#include "pipeline/chain_files.h"
#include "pipeline/disk_identity.h"
#include "pipeline/endpoints.h"
#include "pipeline/file_access.h"
#include "pipeline/merge_journal.h"
#include "pipeline/small_file.h"

namespace barge::pipeline {

Result<formats::DigestTable> LoadDigestTable(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, env.OpenSource(path, ChainFileOptions()));
  std::vector<std::byte> bytes(file->size_bytes());
  BARGE_RETURN_IF_ERROR(file->ReadAt(0, bytes));
  auto table = formats::DecodeDigestTable(bytes);
  if (!table.ok()) return Error(table.error()).set_path(path);
  return table;
}

Result<ChainLock> ChainLock::Acquire(Env& env, const std::string& dir, bool wait) {
  auto st = env.Stat(dir);
  if (!st.ok() || !st->is_directory()) {
    if (st.ok() || st.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("no such chain folder (nothing backed up under this name?)").set_path(dir);
    }
    return st.error();
  }
  // A folder another user controls could lead the writes below elsewhere.
  BARGE_RETURN_IF_ERROR(CheckFolderOwner(env, dir));
  LockOptions o;
  o.wait = wait;
  o.busy_message = "another barge job is writing this chain folder now";
  const std::string path = JoinPath(dir, ".lock");
  // Only a regular file is ever a lock file: anything else at the name (a
  // symbolic link planted to have us create a file elsewhere, a FIFO) is
  // removed, never followed (unlink(2) removes the link, not its target).
  BARGE_RETURN_IF_ERROR(RemovePlanted(env, path));
  // A new lock file is as private as the chain's other files.
  const FileAccess access = FileAccess::OfFolder(*st);
  o.create_mode = access.file_mode;
  auto lock = env.LockFile(path, o);
  if (!lock.ok()) {
    Error e = std::move(lock).error();
    if (e.code() == ErrorCode::kBusy) e.set_path(dir);
    return e;
  }
  IgnoreError(ApplyAccess(env, (*lock)->path(), access), "a lock file holds nothing; its mode is the umask's then");
  return ChainLock(env, std::move(lock).value());
}

ChainLock::~ChainLock() = default;

Status ChainLock::RemoveLockFile() {
  if (!lock_) return OkStatus();
  // Unlinked while held: a job that opened the file meanwhile finds, once
  // it gets the lock, that the name no longer leads to it, and retries.
  Status removed = env_->UnlinkIfExists(lock_->path());
  lock_.reset();
  return removed;
}

Result<ChainFolder> LoadChainFolder(Env& env, const std::string& dir, const ChainLock* held) {
  auto st = env.Stat(dir);
  if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
  if (!st.ok() || !st->is_directory()) {
    return Error::NotFound("no chain folder (no backup of this disk yet?)").set_path(dir);
  }
  // A merge switches files with several renames; its journal says how to
  // finish. Complete it before reading any manifest, so no caller ever sees
  // a half-switched folder (the lock keeps us off a merge still running).
  // (The Result's value, not its ok-ness: testing the Result itself made
  // every unlocked load wait for the chain lock, e.g. a policy run's scan
  // behind another worker's backup of the same chain; issue 21.)
  bool journal = false;
  if (held == nullptr) {
    BARGE_ASSIGN_OR_RETURN(journal, MergeJournalExists(env, dir));
  }
  if (held != nullptr) {
    BARGE_RETURN_IF_ERROR(RecoverMerge(env, dir));
  } else if (journal) {
    auto lock = ChainLock::Acquire(env, dir, /*wait=*/true);
    if (!lock.ok()) {
      return Error(lock.error()).Wrap("an interrupted merge must be completed first");
    }
    BARGE_RETURN_IF_ERROR(CompleteMergeJournal(env, dir));
  }
  ChainFolder chain;
  chain.dir = dir;
  std::optional<Error> misnamed;
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.' || Extension(name) != ".json") continue;
    const std::string path = chain.PathOf(name);
    // Never through a planted link, never waiting on a FIFO.
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, path));
    auto m = formats::DecodeManifest(text);
    if (!m.ok()) return Error(m.error()).set_path(path);
    // ID.json: one manifest per point, so that no two name the same files
    // (told after every manifest's own errors).
    if (name != m->id + ".json" && !misnamed) {
      misnamed = Error::Corruption("manifest of backup " + m->id + " is not named " + m->id + ".json").set_path(path);
    }
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
  if (misnamed) return *misnamed;
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

namespace {

bool AllDigits(std::string_view s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// "0003-20261122T151533Z": a sequence, '-', the compact UTC start time.
bool LooksLikeId(std::string_view s) {
  auto dash = s.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash > 9 || !AllDigits(s.substr(0, dash))) return false;
  std::string_view time = s.substr(dash + 1);
  return time.find_first_of("-:") == std::string_view::npos && formats::ParseRfc3339(time).ok();
}

}  // namespace

Result<PointSelector> ParsePointSelector(std::string_view text) {
  PointSelector sel;
  sel.text = std::string(text);
  if (text.empty() || text == "latest") return sel;
  if (AllDigits(text)) {
    if (text.size() > 9) {
      return Error::InvalidArgument("position " + std::string(text) + " is out of range");
    }
    sel.kind = PointSelector::Kind::kPosition;
    sel.position = static_cast<size_t>(std::stoul(std::string(text)));
    return sel;
  }
  if (LooksLikeId(text)) {
    sel.kind = PointSelector::Kind::kId;
    return sel;
  }
  auto time = formats::ParseRfc3339(text);
  if (!time.ok()) {
    // Text that starts like a date gets the parser's reason.
    bool datelike = text.size() >= 4 && AllDigits(text.substr(0, 4));
    return Error::InvalidArgument(
        "'" + std::string(text) + "' names no backup point: use 'latest', a position (0 = the oldest point), " +
        "a backup id (0003-20261122T151533Z) or an RFC 3339 time (2026-11-24T01:05:49-05:00)" +
        (datelike ? " (" + time.error().message() + ")" : std::string()));
  }
  sel.kind = PointSelector::Kind::kTime;
  sel.time = *time;
  return sel;
}

Result<formats::Timestamp> ChainFolder::StartedAt(size_t index) const {
  const formats::BackupManifest& m = points[index].manifest;
  if (!m.started_at.empty()) {
    auto t = formats::ParseRfc3339(m.started_at);
    if (!t.ok()) {
      return Error::Corruption("started_at is not an RFC 3339 time: " + t.error().message())
          .set_path(points[index].manifest_path);
    }
    return t;
  }
  auto dash = m.id.find('-');
  if (dash != std::string::npos) {
    if (auto t = formats::ParseRfc3339(std::string_view(m.id).substr(dash + 1)); t.ok()) return t;
  }
  return Error::Corruption("the manifest has no start time (started_at) and its id holds none")
      .set_path(points[index].manifest_path);
}

Result<size_t> ChainFolder::Resolve(std::string_view at) const {
  BARGE_ASSIGN_OR_RETURN(PointSelector sel, ParsePointSelector(at));
  return Resolve(sel);
}

Result<size_t> ChainFolder::Resolve(const PointSelector& at) const {
  if (points.empty()) return Error::NotFound("the chain folder holds no backups").set_path(dir);
  switch (at.kind) {
    case PointSelector::Kind::kLatest:
      return points.size() - 1;
    case PointSelector::Kind::kPosition:
      if (at.position < points.size()) return at.position;
      return Error::NotFound("no backup at position " + at.text + ": the folder holds " +
                             std::to_string(points.size()) + " point" + (points.size() == 1 ? "" : "s") +
                             " (positions 0 to " + std::to_string(points.size() - 1) + ", oldest first)")
          .set_path(dir);
    case PointSelector::Kind::kId:
      for (size_t i = 0; i < points.size(); ++i) {
        if (points[i].manifest.id == at.text) return i;
      }
      return Error::NotFound("no backup with id " + at.text + " in the folder").set_path(dir);
    case PointSelector::Kind::kTime: {
      // The newest start at or before the instant; sequence breaks ties.
      std::optional<size_t> best;
      formats::Timestamp best_time;
      size_t oldest = 0;
      formats::Timestamp oldest_time;
      for (size_t i = 0; i < points.size(); ++i) {
        BARGE_ASSIGN_OR_RETURN(formats::Timestamp t, StartedAt(i));
        if (i == 0 || t < oldest_time) {
          oldest = i;
          oldest_time = t;
        }
        if (t <= at.time && (!best || t >= best_time)) {
          best = i;
          best_time = t;
        }
      }
      if (best) return *best;
      const std::string utc = formats::FormatRfc3339(at.time);
      return Error::NotFound("no backup started at or before " + at.text + (at.text == utc ? "" : " (" + utc + ")") +
                             ": the oldest, " +
                             points[oldest].manifest.id + ", started at " +
                             formats::FormatRfc3339(oldest_time))
          .set_path(dir);
    }
  }
  return Error::InvalidArgument("unknown point selector");
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
  // A chain over a base: the base's effective digests lie under its layers.
  BARGE_ASSIGN_OR_RETURN(std::optional<BaseLink> base, LoadBaseOf(env, chain, index));
  if (base) {
    auto below = EffectiveDigests(env, base->chain, base->index);
    if (!below.ok()) return Error(below.error()).Wrap("base " + base->dir + "@" + base->manifest().id);
    tables.insert(tables.begin(), std::move(below).value());
  }
  std::vector<const formats::DigestTable*> ptrs;
  for (const auto& t : tables) ptrs.push_back(&t);
  BARGE_ASSIGN_OR_RETURN(formats::DigestTable merged, formats::MergeDigestTables(ptrs));
  const auto& top = chain.points[index].manifest;
  if (formats::ImageDigestOf(merged, top.image_digest_algorithm) != top.image_digest) {
    return Error::Corruption("the digest tables of backup " + top.id +
                             " do not add up to its recorded image digest")
        .set_path(chain.points[index].manifest_path);
  }
  return merged;
}

namespace {
// Bases stand on bases at most this deep (a loop of bases is refused).
constexpr int kMaxBaseDepth = 16;
}  // namespace

Result<std::optional<BaseLink>> LoadBaseOf(Env& env, const ChainFolder& chain, size_t index) {
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  const ChainPoint& first = chain.points[layers.front()];
  if (!first.manifest.base) return std::optional<BaseLink>();
  const formats::ManifestBase& b = *first.manifest.base;
  BaseLink link;
  link.dir = LexicallyNormal(JoinPath(chain.dir, b.chain));
  auto st = env.Stat(link.dir);
  if (!st.ok() || !st->is_directory()) {
    if (st.ok() || st.error().code() == ErrorCode::kNotFound) {
      return Error::NotFound("base chain " + b.chain + " (point " + b.id + ") that backup " + first.manifest.id +
                             " stands on is missing: expected at " + link.dir +
                             "; move it back (chains over a base keep their relative place)")
          .set_path(link.dir);
    }
    return st.error();
  }
  auto loaded = LoadChainFolder(env, link.dir);
  if (!loaded.ok()) return Error(loaded.error()).Wrap("base chain of backup " + first.manifest.id);
  link.chain = std::move(loaded).value();
  auto it = std::find_if(link.chain.points.begin(), link.chain.points.end(),
                         [&](const ChainPoint& p) { return p.manifest.id == b.id; });
  if (it == link.chain.points.end()) {
    return Error::NotFound("base point " + b.id + " that backup " + first.manifest.id +
                           " stands on is missing from its base chain: expected " + JoinPath(link.dir, b.id + ".json"))
        .set_path(link.dir);
  }
  link.index = static_cast<size_t>(it - link.chain.points.begin());
  const formats::BackupManifest& bm = it->manifest;
  const formats::BackupManifest& top = chain.points[index].manifest;
  if (bm.image != b.image || bm.image_digest != b.image_digest) {
    return Error::Corruption("base point " + b.id + " in " + link.dir +
                             " is not the one backup " + first.manifest.id + " recorded (image or image digest differ)")
        .set_path(first.manifest_path);
  }
  if (bm.virtual_size != top.virtual_size || bm.cluster_size != top.cluster_size) {
    return Error::Corruption("base point " + b.id + " is of another disk size or cluster size")
        .set_path(first.manifest_path);
  }
  return std::optional<BaseLink>(std::move(link));
}

Result<std::vector<std::string>> LayerImagePaths(Env& env, const ChainFolder& chain, size_t index) {
  std::vector<std::string> out;
  const ChainFolder* cur = &chain;
  size_t at = index;
  std::optional<BaseLink> link;
  for (int depth = 0;; ++depth) {
    if (depth > kMaxBaseDepth) {
      return Error::Corruption("bases stand on bases too deep (a loop?)").set_path(chain.dir);
    }
    BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, cur->LayersOf(at));
    std::vector<std::string> mine;
    for (size_t l : layers) mine.push_back(cur->PathOf(cur->points[l].manifest.image));
    out.insert(out.begin(), mine.begin(), mine.end());
    BARGE_ASSIGN_OR_RETURN(std::optional<BaseLink> next, LoadBaseOf(env, *cur, at));
    if (!next) break;
    link = std::move(next);
    cur = &link->chain;
    at = link->index;
  }
  return out;
}

namespace {
// The first entry of `table` (sorted by cluster) at or after `cluster_index`.
std::vector<formats::DigestEntry>::const_iterator FirstEntryFrom(const formats::DigestTable& table,
                                                                 uint64_t cluster_index) {
  return std::lower_bound(table.entries.begin(), table.entries.end(), cluster_index,
                          [](const formats::DigestEntry& e, uint64_t c) { return e.cluster_index < c; });
}
}  // namespace

std::optional<formats::Digest128> FindDigest(const formats::DigestTable& table,
                                             uint64_t cluster_index) {
  auto it = FirstEntryFrom(table, cluster_index);
  if (it == table.entries.end() || it->cluster_index != cluster_index) return std::nullopt;
  return it->digest;
}

uint64_t NextListed(const formats::DigestTable& table, uint64_t cluster_index) {
  auto it = FirstEntryFrom(table, cluster_index);
  return it == table.entries.end() ? UINT64_MAX : it->cluster_index;
}

std::optional<uint64_t> FirstListedData(const formats::DigestTable& table, uint64_t begin_cluster,
                                        uint64_t end_cluster) {
  const formats::Digest128 zero = formats::ZeroClusterDigest(table.cluster_bytes);
  auto it = FirstEntryFrom(table, begin_cluster);
  // Listed zero clusters (an incremental's) are skipped: the scan costs the
  // entries in the range, never the range's length.
  for (; it != table.entries.end() && it->cluster_index < end_cluster; ++it) {
    if (it->digest != zero) return it->cluster_index;
  }
  return std::nullopt;
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
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  // Layers of two disks add up to neither: damage, however well each
  // layer's own digests check out.
  BARGE_RETURN_IF_ERROR(CheckOneDisk(chain, layers));
  // A file a manifest names and the folder lacks breaks the chain from that
  // point on: damage to the backup (exit 2), not a missing input.
  for (size_t l : layers) {
    const auto& lm = chain.points[l].manifest;
    for (const std::string& name : {lm.image, lm.digest_table}) {
      auto st = env.Stat(chain.PathOf(name));
      if (!st.ok() && st.error().code() == ErrorCode::kNotFound) {
        return Error::Corruption("missing: backup " + lm.id + " names this file; the chain is broken from " +
                                 lm.id + " on")
            .set_path(chain.PathOf(name));
      }
    }
  }
  BARGE_ASSIGN_OR_RETURN(out.digests, EffectiveDigests(env, chain, index));
  formats::OpenOptions options;
  options.format = formats::ImageFormat::kQcow2;
  options.allowed_dirs = {chain.dir};
  // A chain over a base reads on into the base chain's images.
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> all_images, LayerImagePaths(env, chain, index));
  all_images.resize(all_images.size() - layers.size());
  out.base_images = all_images;
  for (const std::string& p : out.base_images) {
    auto st = env.Stat(p);
    if (!st.ok() && st.error().code() == ErrorCode::kNotFound) {
      return Error::Corruption("missing: the base image backup " + out.point->manifest.id + " stands on")
          .set_path(p);
    }
    options.allowed_dirs.push_back(DirName(p));
  }
  const auto& m = out.point->manifest;
  auto image = OpenImageFile(env, chain.PathOf(m.image), options);
  if (!image.ok()) {
    Error e = std::move(image).error();
    // The layers are the chain's own files: one whose backing file is
    // refused (outside the chain's folders, a protocol prefix), or that is
    // no image at all, is damage to this point (so verify --all goes on to
    // the next point), not a bad argument.
    if (e.code() == ErrorCode::kInvalidArgument) {
      Error damaged = Error::Corruption(e.message());
      if (!e.path().empty()) damaged.set_path(e.path());
      e = std::move(damaged);
    }
    return e.Wrap("backup " + m.id);
  }
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
  // Then the bases' layers, newest first.
  for (size_t k = out.base_images.size(); k-- > 0;) {
    if (layer == nullptr) {
      return Error::Corruption("the image chain ends before its base layer " + out.base_images[k])
          .set_path(chain.PathOf(m.image));
    }
    if (LexicallyNormal(AbsolutePath(layer->info().path)) != LexicallyNormal(AbsolutePath(out.base_images[k]))) {
      return Error::Corruption("image chain layer " + layer->info().path + " is not the base layer the manifests name (" +
                               out.base_images[k] + ")")
          .set_path(chain.PathOf(m.image));
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
  if (auto ms = env.Stat(manifest); !ms.ok()) {
    if (ms.error().code() != ErrorCode::kNotFound) return ms.error();
    // The user named a file that is not a backup (or its manifest is gone).
    return Error::NotFound("no backup manifest beside it (" + BaseName(manifest) +
                           "): not a barge backup; name a chain folder, or a backup's manifest or image "
                           "(for the structure of any qcow2 file use barge check)")
        .set_path(path);
  }
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, manifest));
  auto decoded = formats::DecodeManifest(text);
  if (!decoded.ok()) return Error(decoded.error()).set_path(manifest);
  formats::BackupManifest m = std::move(decoded).value();
  if (!at.empty() && at != "latest" && at != m.id) {
    return Error::InvalidArgument("--at conflicts with the backup the path names (" + m.id + ")");
  }
  return PointLocation{dir, m.id};
}

}  // namespace barge::pipeline
