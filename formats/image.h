// Opening disk images (raw, qcow2 with its backing chain and data file) as a
// BlockSource of their guest view. docs/formats/qcow2.md has the byte layout.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "blockio/extent.h"
#include "blockio/source.h"

namespace barge::formats {

enum class ImageFormat : uint8_t { kRaw, kQcow2 };
std::string_view ImageFormatName(ImageFormat format);
// "raw" or "qcow2"; anything else is kInvalidArgument.
Result<ImageFormat> ParseImageFormat(std::string_view name);

enum class Compression : uint8_t { kNone, kZstd, kDeflate };
std::string_view CompressionName(Compression c);  // "none", "zstd", "zlib"

// barge's zstd level when none is given. Each 64 KiB cluster is its own
// frame; at that size level 1 takes ~18% less CPU than level 2 for ~3%
// more bytes, within 5% of qemu-img's level 3 output (docs/benchmarks.md,
// "compression level"). Points written at level 2 (the default before)
// read, extend and merge as before: the level is each point's own.
inline constexpr int kDefaultZstdLevel = 1;
inline constexpr int kDefaultDeflateLevel = 6;
inline constexpr int kMaxZstdLevel = 19;
inline constexpr int kMaxDeflateLevel = 9;

// Highest level `c` takes (19 zstd, 9 deflate); 0 for kNone. Levels start at 1.
int MaxCompressionLevel(Compression c);
// The level used when none is given: kDefaultZstdLevel, kDefaultDeflateLevel, 0.
int DefaultCompressionLevel(Compression c);

// Compression with its level, one spelling everywhere: --compress, a
// policy's `compression`, a manifest's "compression" and `policy show`.
// The rule (docs/policies.md, docs/formats/manifest.md):
//   none | zstd[:1-19] | zlib[:1-9] | deflate[:1-9]
// A level is plain decimal digits; a missing level is the type's default
// (zstd 1, zlib 6); "none" takes none; "zstd:" (empty level), "zstd:0",
// " 5", "+5" are refused. Printing gives "none", "zstd:N" or "zlib:N",
// which parses back to the same spec.
struct CompressionSpec {
  Compression type = Compression::kZstd;
  int level = kDefaultZstdLevel;  // 0 for kNone

  // What backups compress with unless told: zstd at kDefaultZstdLevel.
  static CompressionSpec Default() { return {}; }
  static CompressionSpec None() { return {Compression::kNone, 0}; }
  std::string ToString() const;  // "none", "zstd:1", "zlib:6"
  friend bool operator==(const CompressionSpec&, const CompressionSpec&) = default;
};

// Parses the rule above; kInvalidArgument naming the text and the allowed
// spellings or level range otherwise. Callers reading a file (a manifest)
// wrap the error as Corruption with the file's path.
Result<CompressionSpec> ParseCompressionSpec(std::string_view text);

struct BitmapInfo {
  std::string name;
  uint32_t granularity_bytes = 0;
  uint32_t flags = 0;     // raw directory flags
  bool in_use = false;    // bit 0: on-disk copy stale (crash); unusable
  bool enabled = false;   // bit 1 ("auto"): tracking writes
  uint64_t table_offset = 0;
  uint32_t table_size = 0;
};

struct SnapshotInfo {
  std::string id;
  std::string name;
  uint64_t virtual_size = 0;
  uint64_t vm_state_size = 0;
  uint32_t date_sec = 0;
  uint32_t date_nsec = 0;
  uint64_t vm_clock_nsec = 0;
  // Instruction count of record/replay; UINT64_MAX when the entry has none
  // (extra data shorter than 24 bytes), as qemu reads it.
  uint64_t icount = UINT64_MAX;
  uint32_t l1_size = 0;
  uint64_t l1_table_offset = 0;
};

struct ImageInfo {
  std::string path;
  ImageFormat format = ImageFormat::kRaw;
  uint64_t virtual_size = 0;
  uint64_t file_size = 0;  // bytes of the image file itself
  // qcow2 only.
  uint32_t version = 0;
  uint32_t cluster_bits = 0;
  uint32_t refcount_bits = 0;
  Compression compression = Compression::kNone;  // header compression type
  bool extended_l2 = false;
  bool lazy_refcounts = false;
  bool dirty = false;
  bool corrupt = false;
  std::string backing_file;    // as stored in the header
  std::string backing_format;  // from the extension ("" if absent)
  std::string backing_path;    // resolved path of the opened backing image
  std::string data_file;       // as stored
  // Resolved path of the opened data file, as the backing file's: "" when
  // it was not opened (OpenOptions::open_data_file false).
  std::string data_file_path;
  bool data_file_raw = false;
  std::vector<BitmapInfo> bitmaps;
  std::vector<SnapshotInfo> snapshots;
  // Set when the image was opened at an internal snapshot
  // (OpenOptions::snapshot): the guest view is that snapshot's, and
  // virtual_size is its disk size.
  std::optional<SnapshotInfo> opened_snapshot;

  uint32_t cluster_size() const { return cluster_bits ? 1u << cluster_bits : 0; }
};

// One run of guest bytes and where its contents come from.
struct MappedExtent {
  uint64_t offset = 0;
  uint64_t length = 0;
  ExtentKind kind = ExtentKind::kData;  // kHole: unallocated in every layer
  int depth = -1;                       // chain layer holding it (0 = top), -1 = none
  bool compressed = false;
  // Where the bytes lie in the layer's file (its data file when it has one):
  // uncompressed data, and (as qemu-img map reports) zero or unallocated
  // runs of a cluster that keeps its host cluster.
  std::optional<uint64_t> host_offset;
  friend bool operator==(const MappedExtent&, const MappedExtent&) = default;
};

// Opens a file named by path as a BlockSource. The formats layer cannot open
// files itself; the caller passes the backend (e.g. blockio::OpenFileSource).
using SourceOpener = std::function<Result<std::unique_ptr<BlockSource>>(const std::string& path)>;

// What the path policy learns about a file name from the caller's view of
// the filesystem (formats/ has none): its canonical path, symbolic links
// and ".." resolved (for the allowed-folder check), and the file's identity
// (device, inode) when it exists (for loop detection). An empty canonical
// path means "unknown": the name is then compared as written.
struct PathFacts {
  std::string canonical;
  std::optional<std::pair<uint64_t, uint64_t>> identity;
};
using PathInspector = std::function<PathFacts(const std::string& path)>;

struct OpenOptions {
  // nullopt: detect (qcow2 magic, else raw). Given: used as is, never probed.
  std::optional<ImageFormat> format;
  // Backing and data files must resolve inside one of these folders. Empty:
  // the top image's folder (and below).
  std::vector<std::string> allowed_dirs;
  // Lifts the folder restriction (the CLI's --allow-any-path).
  bool allow_any_path = false;
  // false: ignore the backing file (unallocated reads as zeros).
  bool open_backing = true;
  // Do not open the external data file (info/map/check still work).
  bool open_data_file = true;
  // A layer whose backing file has no recorded format (barge never probes)
  // is opened without its backing file instead of refused: the chain stops
  // there, with ImageInfo::backing_format and backing_path empty. For
  // `info`, which shows the image and says what is missing; the guest view
  // of such an image is wrong (backing data is missing), never read it.
  bool stop_at_unrecorded_backing_format = false;
  // Longest chain accepted; deeper chains (or cycles) are refused.
  int max_chain_depth = 256;
  // Non-empty: read the top qcow2 layer at this internal snapshot (an id,
  // else a unique name, as qemu-img convert -l snapshot.name= finds it)
  // instead of its active state: reads go through the snapshot's L1 table,
  // the size is the snapshot's disk size, the backing chain is the image's,
  // and the image's persistent bitmaps are not listed (they track the
  // active state). kNotFound when there is no such snapshot,
  // kInvalidArgument for a raw image or a name several snapshots share.
  std::string snapshot;
  // Unset: names are compared as written (lexically), which a symbolic
  // link can fool. Callers that open real files pass one built on their
  // Env (pipeline::ImageOpenOptions does).
  PathInspector inspect_path;
};

// A disk image seen as the guest sees it. Reads are thread-safe.
class Image : public BlockSource {
 public:
  virtual const ImageInfo& info() const = 0;
  ImageFormat format() const { return info().format; }
  // The next layer down, or nullptr.
  virtual const Image* backing() const = 0;
  // Extents of [offset, offset+length) with the layer that holds each.
  virtual Result<std::vector<MappedExtent>> Map(uint64_t offset, uint64_t length) = 0;
};

// Opens `path` through `opener`, then its backing chain and data file.
// Errors: kCorruption for malformed images (naming field and offset),
// kNotSupported for features we refuse (encryption, unknown incompatible
// bits), kInvalidArgument for a backing/data file outside the allowed folders
// or with a json:/protocol name, kNotFound for a missing file.
Result<std::unique_ptr<Image>> OpenImage(const std::string& path, const SourceOpener& opener,
                                         const OpenOptions& options = {});

// What the first bytes of `file` say it is, as qemu-img's probes would:
// "qcow2" (also version 1), "qed", "vmdk", "vhdx", "vpc", "vdi", "luks",
// "parallels", "bochs", "cloop", or "raw" when no image magic matches. Only
// a read error fails. For refusing mix-ups (an image given where a raw disk
// is wanted, a ".qcow2" that is not one); OpenImage itself detects only
// qcow2.
Result<std::string> ProbeFormatName(BlockSource& file);

// The header view of one qcow2 layer, for callers that look at the names it
// stores (backing file, data file) without following them: nullopt when
// `path` cannot be opened or does not start with the qcow2 magic; an error
// when it does but the header or tables are bad.
Result<std::optional<ImageInfo>> ProbeQcow2Layer(const std::string& path, const SourceOpener& opener);

}  // namespace barge::formats
