// Opening qcow2 images: header, L1 table, bitmaps and snapshot listing, and
// the backing chain and data file under barge's path policy (never probe,
// no json:/protocol names, stay inside the allowed folders, no cycles).
#include <set>
#include <utility>

#include "blockio/path.h"
#include "formats/qcow2_bitmap.h"
#include "formats/qcow2_image.h"
#include "formats/qcow2_open.h"
#include "formats/qcow2_snapshot.h"
#include "formats/sector.h"

namespace barge::formats {

using qcow2::Header;
using qcow2::Qcow2Image;

namespace {

// What every layer of one OpenImage call shares.
struct ChainState {
  std::vector<std::string> allowed_dirs;  // canonical
  std::set<std::pair<uint64_t, uint64_t>> seen_inodes;
  std::set<std::string> seen_paths;  // canonical
};

PathFacts Inspect(const std::string& path, const OpenOptions& options) {
  PathFacts facts;
  if (options.inspect_path) facts = options.inspect_path(path);
  if (facts.canonical.empty()) facts.canonical = AbsolutePath(path);
  return facts;
}

// "nbd:", "http:", "file:", "json:" ... anything like ^[a-zA-Z0-9+.-]+:
bool HasProtocolPrefix(std::string_view name) {
  size_t i = 0;
  while (i < name.size() && (std::isalnum(static_cast<unsigned char>(name[i])) || name[i] == '+' ||
                             name[i] == '.' || name[i] == '-')) {
    ++i;
  }
  return i > 0 && i < name.size() && name[i] == ':';
}

// Resolves a backing or data file name stored in `image_path` and applies the
// folder policy. `what` is "backing file" or "data file".
Result<std::string> ResolveName(const std::string& image_path, const std::string& stored,
                                const char* what, const OpenOptions& options,
                                const ChainState& state) {
  if (HasProtocolPrefix(stored)) {
    return Error::InvalidArgument(std::string(what) + " name '" + stored +
                                  "' uses a json: or protocol prefix; barge opens plain files only")
        .set_path(image_path);
  }
  std::string result = LexicallyNormal(JoinPath(DirName(image_path), stored));
  if (options.allow_any_path) return result;
  const std::string canon = Inspect(result, options).canonical;
  for (const std::string& dir : state.allowed_dirs) {
    if (!IsInsidePath(canon, dir)) continue;
    // The folder itself is inside it, but is no file (found by fuzzing:
    // a backing name "." or "x/..").
    if (canon == LexicallyNormal(dir)) {
      return Error::InvalidArgument(std::string(what) + " '" + stored + "' names the folder " + canon +
                                    ", not a file")
          .set_path(image_path);
    }
    return result;
  }
  return Error::InvalidArgument(std::string(what) + " '" + stored + "' resolves to " + canon +
                                ", outside the allowed folders; pass --allow-dir FOLDER or --allow-any-path to permit it")
      .set_path(image_path);
}

// Records `path` as a chain member; kCorruption if it was seen already.
Status EnterChain(const std::string& path, const OpenOptions& options, ChainState& state) {
  const PathFacts facts = Inspect(path, options);
  const std::string& canon = facts.canonical;
  bool repeat = !state.seen_paths.insert(canon).second;
  if (facts.identity) repeat |= !state.seen_inodes.insert(*facts.identity).second;
  if (repeat) {
    return Error::Corruption("backing chain loops back to " + canon).set_path(path);
  }
  return OkStatus();
}

Result<std::unique_ptr<Image>> OpenLayer(std::unique_ptr<BlockSource> file, const std::string& path,
                                         const SourceOpener& opener, const OpenOptions& options,
                                         ChainState& state, int depth);

Result<std::unique_ptr<Image>> OpenBacking(const Header& h, const std::string& path,
                                           const SourceOpener& opener, const OpenOptions& options,
                                           ChainState& state, int depth) {
  if (h.backing_format.empty()) {
    return Error::InvalidArgument("backing file '" + h.backing_file +
                                  "' has no recorded format and barge never probes formats; "
                                  "record it with `qemu-img rebase -u -F <raw|qcow2> -b '" +
                                  h.backing_file + "' IMAGE`")
        .set_path(path);
  }
  BARGE_ASSIGN_OR_RETURN(ImageFormat format, ParseImageFormat(h.backing_format));
  if (depth + 1 > options.max_chain_depth) {
    return Error::InvalidArgument("backing chain is deeper than " +
                                  std::to_string(options.max_chain_depth) + " layers")
        .set_path(path);
  }
  BARGE_ASSIGN_OR_RETURN(std::string backing_path,
                         ResolveName(path, h.backing_file, "backing file", options, state));
  BARGE_RETURN_IF_ERROR(EnterChain(backing_path, options, state));
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, opener(backing_path));
  if (format == ImageFormat::kRaw) return WrapRaw(std::move(file), backing_path);
  return OpenLayer(std::move(file), backing_path, opener, options, state, depth + 1);
}

Result<std::unique_ptr<Image>> OpenLayer(std::unique_ptr<BlockSource> file, const std::string& path,
                                         const SourceOpener& opener, const OpenOptions& options,
                                         ChainState& state, int depth) {
  auto with_path = [&path](Error e) { return std::move(e.set_path(path)); };
  auto header_or = qcow2::ReadHeader(*file);
  if (!header_or.ok()) return with_path(std::move(header_or).error());
  Header h = std::move(header_or).value();


  ImageInfo info;
  info.path = path;
  info.format = ImageFormat::kQcow2;
  info.virtual_size = h.size;
  info.file_size = file->size_bytes();
  info.version = h.version;
  info.cluster_bits = h.cluster_bits;
  info.refcount_bits = 1u << h.refcount_order;
  info.compression = h.compression_type == qcow2::kCompressionZstd ? Compression::kZstd
                                                                   : Compression::kDeflate;
  info.extended_l2 = h.extended_l2();
  info.lazy_refcounts = h.compatible_features & qcow2::kCompatLazyRefcounts;
  info.dirty = h.incompatible_features & qcow2::kIncompatDirty;
  info.corrupt = h.incompatible_features & qcow2::kIncompatCorrupt;
  info.backing_file = h.backing_file;
  info.backing_format = h.backing_format;
  info.data_file = h.data_file;
  info.data_file_raw = h.data_file_raw();
  auto bitmaps = qcow2::ReadBitmapDirectory(*file, h);
  if (!bitmaps.ok()) return with_path(std::move(bitmaps).error());
  for (auto& e : *bitmaps) info.bitmaps.push_back(std::move(e.info));
  auto snapshots = qcow2::ReadSnapshotTable(*file, h);
  if (!snapshots.ok()) return with_path(std::move(snapshots).error());
  info.snapshots = std::move(snapshots->snapshots);
  if (depth == 0 && !options.snapshot.empty()) {
    // The snapshot's L1 table stands in for the active one (qemu's
    // qcow2_snapshot_load_tmp); the table parser checked it lies inside
    // the file and is at most 32 MiB.
    auto index = qcow2::FindSnapshot(info.snapshots, options.snapshot);
    if (!index.ok()) return with_path(std::move(index).error().Wrap("open at snapshot"));
    const SnapshotInfo& sn = info.snapshots[*index];
    h.l1_table_offset = sn.l1_table_offset;
    h.l1_size = sn.l1_size;
    h.size = sn.virtual_size & ~uint64_t{kSectorBytes - 1};
    info.virtual_size = h.size;
    info.opened_snapshot = sn;
    info.bitmaps.clear();
  }

  std::vector<uint64_t> l1(h.l1_size);
  {
    std::vector<std::byte> raw(uint64_t{h.l1_size} * 8);  // inside the file, <= 32 MiB
    if (!raw.empty()) BARGE_RETURN_IF_ERROR(file->ReadAt(h.l1_table_offset, raw));
    for (size_t i = 0; i < l1.size(); ++i) l1[i] = qcow2::LoadBe64(raw.data() + 8 * i);
  }

  std::unique_ptr<Image> backing;
  const bool unrecorded = h.backing_format.empty() && options.stop_at_unrecorded_backing_format;
  if (!h.backing_file.empty() && options.open_backing && !unrecorded) {
    BARGE_ASSIGN_OR_RETURN(backing, OpenBacking(h, path, opener, options, state, depth));
    info.backing_path = backing->info().path;
  }
  std::unique_ptr<BlockSource> data_file;
  if (h.has_data_file() && options.open_data_file) {
    BARGE_ASSIGN_OR_RETURN(std::string data_path,
                           ResolveName(path, h.data_file, "data file", options, state));
    BARGE_ASSIGN_OR_RETURN(data_file, opener(data_path));
    info.data_file_path = std::move(data_path);
  }
  auto image = std::make_unique<Qcow2Image>(std::move(file), std::move(h), std::move(l1),
                                            std::move(info));
  image->set_backing(std::move(backing));
  image->set_data_file(std::move(data_file));
  return std::unique_ptr<Image>(std::move(image));
}

}  // namespace

Result<std::unique_ptr<Image>> OpenQcow2(std::unique_ptr<BlockSource> file,
                                         const std::string& path, const SourceOpener& opener,
                                         const OpenOptions& options) {
  ChainState state;
  if (options.allowed_dirs.empty()) {
    state.allowed_dirs.push_back(DirName(Inspect(path, options).canonical));
  } else {
    for (const std::string& dir : options.allowed_dirs) state.allowed_dirs.push_back(Inspect(dir, options).canonical);
  }
  BARGE_RETURN_IF_ERROR(EnterChain(path, options, state));
  return OpenLayer(std::move(file), path, opener, options, state, 0);
}

}  // namespace barge::formats
