// Chain folder scanning, point resolution and digest merging.
#include "pipeline/chain.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "blockio/file.h"
#include "pipeline/merge_journal.h"

namespace barge::pipeline {

namespace fs = std::filesystem;

Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  uint64_t size = fs::file_size(path, ec);
  if (ec) return Error::FromErrno(ec.value(), "stat", path);
  if (size > max_bytes) {
    return Error::Corruption("file is too large (" + std::to_string(size) + " bytes)").set_path(path);
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error::FromErrno(errno ? errno : EIO, "open", path);
  std::string s(size, '\0');
  f.read(s.data(), static_cast<std::streamsize>(size));
  if (static_cast<uint64_t>(f.gcount()) != size) return Error::IoError("short read").set_path(path);
  return s;
}

Result<formats::DigestTable> LoadDigestTable(const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, OpenFileSource(path));
  std::vector<std::byte> bytes(file->size_bytes());
  BARGE_RETURN_IF_ERROR(file->ReadAt(0, bytes));
  auto table = formats::DecodeDigestTable(bytes);
  if (!table.ok()) return Error(table.error()).set_path(path);
  return table;
}

Result<ChainLock> ChainLock::Acquire(const std::string& dir, bool wait) {
  std::string path = dir + "/.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Error::FromErrno(errno, "open lock", path);
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return Error::InvalidArgument("another barge job is writing this chain folder now")
          .set_path(dir)
          .set_retryable(true);
    }
    return Error::FromErrno(err, "flock", path);
  }
  return ChainLock(fd);
}

ChainLock::ChainLock(ChainLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}

ChainLock::~ChainLock() {
  if (fd_ >= 0) ::close(fd_);
}

Result<ChainFolder> LoadChainFolder(const std::string& dir, const ChainLock* held) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return Error::NotFound("no chain folder (no backup of this disk yet?)").set_path(dir);
  }
  // A merge switches files with several renames; its journal says how to
  // finish. Complete it before reading any manifest, so no caller ever sees
  // a half-switched folder (the lock keeps us off a merge still running).
  if (held != nullptr) {
    BARGE_RETURN_IF_ERROR(RecoverMerge(dir));
  } else if (MergeJournalExists(dir)) {
    auto lock = ChainLock::Acquire(dir, /*wait=*/true);
    if (!lock.ok()) {
      return Error(lock.error()).Wrap("an interrupted merge must be completed first");
    }
    BARGE_RETURN_IF_ERROR(CompleteMergeJournal(dir));
  }
  ChainFolder chain;
  chain.dir = dir;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || entry.path().extension() != ".json") continue;
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(entry.path().string()));
    auto m = formats::DecodeManifest(text);
    if (!m.ok()) return Error(m.error()).set_path(entry.path().string());
    ChainPoint p;
    p.manifest = std::move(m).value();
    p.manifest_path = entry.path().string();
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
  if (ec) return Error::FromErrno(ec.value(), "list folder", dir);
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

Result<formats::DigestTable> EffectiveDigests(const ChainFolder& chain, size_t index) {
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  std::vector<formats::DigestTable> tables;
  tables.reserve(layers.size());
  for (size_t i : layers) {
    const auto& m = chain.points[i].manifest;
    BARGE_ASSIGN_OR_RETURN(formats::DigestTable t, LoadDigestTable(chain.PathOf(m.digest_table)));
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

Result<OpenedPoint> OpenPoint(const ChainFolder& chain, size_t index) {
  OpenedPoint out;
  out.index = index;
  out.point = &chain.points[index];
  BARGE_ASSIGN_OR_RETURN(out.digests, EffectiveDigests(chain, index));
  BARGE_ASSIGN_OR_RETURN(std::vector<size_t> layers, chain.LayersOf(index));
  formats::OpenOptions options;
  options.format = formats::ImageFormat::kQcow2;
  options.allowed_dirs = {chain.dir};
  formats::SourceOpener opener = [](const std::string& p) { return OpenFileSource(p); };
  const auto& m = out.point->manifest;
  auto image = formats::OpenImage(chain.PathOf(m.image), opener, options);
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
    if (fs::path(layer->info().path).filename() != lm.image) {
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

Result<PointLocation> LocatePoint(const std::string& path, const std::string& at) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return PointLocation{path, at};
  if (!fs::exists(path, ec)) return Error::NotFound("no such backup, image or chain folder").set_path(path);
  fs::path p(path);
  std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  fs::path manifest = p;
  if (p.extension() != ".json") manifest.replace_extension(".json");
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(manifest.string()));
  BARGE_ASSIGN_OR_RETURN(formats::BackupManifest m, formats::DecodeManifest(text));
  if (!at.empty() && at != "latest" && at != m.id) {
    return Error::InvalidArgument("--at conflicts with the backup the path names (" + m.id + ")");
  }
  return PointLocation{dir, m.id};
}

}  // namespace barge::pipeline
