#include "pipeline/chain_sync.h"

#include "formats/units.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "blockio/path.h"
#include "pipeline/chain.h"
#include "pipeline/chain_files.h"
#include "pipeline/chain_folder.h"
#include "pipeline/copy.h"
#include "pipeline/disk_identity.h"
#include "pipeline/point_reader.h"
#include "pipeline/restore.h"

namespace barge::pipeline {
namespace {

// The image is streamed in pieces of this size: a sync's memory is one
// piece whatever the image's size.
constexpr size_t kCopyPiece = 4 << 20;
// Digest tables are copied whole (as LoadDigestTable reads them): 24 bytes
// a cluster leaves a 1 TiB disk of 64 KiB clusters well under this.
constexpr uint64_t kMaxSmallFile = uint64_t{1} << 30;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "" when DST may receive SRC's points, else why not.
std::string DivergedReason(const ChainFolder& src, const ChainFolder& dst, bool newer_only) {
  std::map<std::string, const ChainPoint*> src_by_id;
  std::map<uint32_t, const ChainPoint*> src_by_sequence;
  for (const ChainPoint& p : src.points) {
    src_by_id[p.manifest.id] = &p;
    src_by_sequence[p.sequence] = &p;
  }
  std::map<std::string, const ChainPoint*> dst_by_id;
  for (const ChainPoint& d : dst.points) {
    dst_by_id[d.manifest.id] = &d;
    if (auto s = src_by_id.find(d.manifest.id); s != src_by_id.end()) {
      const formats::BackupManifest& sm = s->second->manifest;
      if (sm.image != d.manifest.image || sm.image_digest != d.manifest.image_digest) {
        return "point " + d.manifest.id + " differs between SRC and DST (image digest " +
               sm.image_digest.ToHex() + " in SRC, " + d.manifest.image_digest.ToHex() +
               " in DST: merged in one of them?)";
      }
    } else if (auto q = src_by_sequence.find(d.sequence); q != src_by_sequence.end()) {
      return "DST's point " + d.manifest.id + " and SRC's point " + q->second->manifest.id +
             " were both taken as backup number " + std::to_string(d.sequence);
    }
  }
  if (!dst.empty() && !newer_only) {
    for (const ChainPoint& p : src.points) {
      if (dst_by_id.count(p.manifest.id) == 0 && p.sequence < dst.latest().sequence) {
        return "SRC's point " + p.manifest.id + " is older than DST's latest point " + dst.latest().manifest.id +
               ", and DST lacks it";
      }
    }
  }
  return "";
}

// Refuses a DST chain of another disk than SRC's, or one that diverged.
Status CheckReceiver(const ChainFolder& src, const ChainFolder& dst, bool newer_only) {
  if (dst.empty() || src.empty()) return OkStatus();
  for (auto p = src.points.rbegin(); p != src.points.rend(); ++p) {
    if (!p->manifest.disk_identity) continue;
    BARGE_ASSIGN_OR_RETURN(std::string other, OtherDiskReason(dst, *p->manifest.disk_identity));
    if (!other.empty()) {
      return Error::InvalidArgument(other + ": the sync destination holds another disk's chain (one disk per "
                                    "chain): give another destination folder")
          .set_path(dst.dir);
    }
    break;
  }
  if (std::string why = DivergedReason(src, dst, newer_only); !why.empty()) {
    return Error::InvalidArgument("SRC and DST have diverged: " + why + "; nothing was copied").set_path(dst.dir);
  }
  return OkStatus();
}

// The point's check as `barge verify DIR --at ID` does it.
Status VerifyPoint(Env& env, const std::string& dir, const std::string& id) {
  VerifyRequest req;
  req.path = dir;
  req.at = id;
  BARGE_ASSIGN_OR_RETURN(VerifyReport report, RunVerify(env, req));
  if (report.failure) return *report.failure;
  return OkStatus();
}

// DST's copy of SRC's point `index` (SRC's verified by VerifyPoint), checked
// without reading the layers under it again (a sync of n points would read
// the disk n times, from a bucket by GETs): its manifest and digest tables
// are SRC's bytes, its qcow2 structure is sound, and every cluster its own
// image stores (compressed, zero or data) has the digest the point's digest
// tables give it. Every other cluster of the point reads from DST's older
// points, the same ids as SRC's (DivergedReason) and checked when they were
// copied; so the point reads as SRC's, and its image digest holds.
Status CheckCopiedPoint(Env& env, const ChainFolder& src, size_t index, const std::string& dst,
                        const ChainLock& lock, const std::atomic<bool>* cancel) {
  const ChainPoint& p = src.points[index];
  const formats::BackupManifest& m = p.manifest;
  std::vector<std::string> small = {BaseName(p.manifest_path), m.digest_table};
  if (!m.strong_digest_table.empty()) small.push_back(m.strong_digest_table);
  for (const std::string& name : small) {
    BARGE_ASSIGN_OR_RETURN(std::string want, ReadChainFile(env, src.PathOf(name), kMaxSmallFile));
    BARGE_ASSIGN_OR_RETURN(std::string got, ReadChainFile(env, JoinPath(dst, name), kMaxSmallFile));
    if (got != want) return Error::Corruption("the copy differs from SRC's file").set_path(JoinPath(dst, name));
  }
  BARGE_ASSIGN_OR_RETURN(ChainFolder chain, LoadChainFolder(env, dst, &lock));
  BARGE_ASSIGN_OR_RETURN(size_t at, chain.Resolve(m.id));
  const std::string image_path = chain.PathOf(m.image);
  BARGE_RETURN_IF_ERROR(CheckLayerStructure(env, image_path));
  BARGE_ASSIGN_OR_RETURN(OpenedPoint point, OpenPoint(env, chain, at));
  BARGE_ASSIGN_OR_RETURN(std::vector<formats::MappedExtent> map, point.image->Map(0, m.virtual_size));
  RangeList own;
  for (const formats::MappedExtent& e : map) {
    if (e.depth == 0) own.push_back({e.offset, e.length});
  }
  if (own.empty()) return OkStatus();
  CopyOptions copy;
  copy.cancel = cancel;
  copy.cluster_bytes = m.cluster_size;
  copy.chunk_bytes = ChunkBytesFor(copy.chunk_bytes, m.cluster_size);
  copy.compression = formats::Compression::kNone;
  copy.digest_algorithm = m.image_digest_algorithm;
  copy.verify = [&point](uint64_t c) { return point.Expected(c); };
  copy.verify_holder = [&image_path](uint64_t) { return image_path; };
  auto checked = RunCopy(*point.image, own, {}, copy);
  if (!checked.ok()) return Error(checked.error()).Wrap("check of the copy of " + m.id);
  return OkStatus();
}

// Streams `from` into `sink`, front to back. Returns the bytes copied.
Result<uint64_t> StreamFile(Env& env, const std::string& from, BlockSink& sink, const std::atomic<bool>* cancel) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> source, env.OpenSource(from, ChainFileOptions()));
  const uint64_t size = source->size_bytes();
  std::vector<std::byte> piece(std::min<uint64_t>(kCopyPiece, std::max<uint64_t>(size, 1)));
  for (uint64_t offset = 0; offset < size;) {
    BARGE_RETURN_IF_ERROR(CheckCancel(cancel, "sync", from));
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), size - offset));
    std::span<std::byte> chunk(piece.data(), n);
    BARGE_RETURN_IF_ERROR(source->ReadAt(offset, chunk));
    BARGE_RETURN_IF_ERROR(sink.WriteAt(offset, chunk));
    source->DontNeed(offset, n);
    offset += n;
  }
  return size;
}

// Copies SRC's point `index` into DST through `writer`: the image, the
// digest tables, the manifest last. Returns the bytes of its files.
Result<uint64_t> CopyPoint(Env& env, const ChainFolder& src, size_t index, ChainWriter& writer,
                           const std::atomic<bool>* cancel) {
  const ChainPoint& p = src.points[index];
  const formats::BackupManifest& m = p.manifest;
  BARGE_ASSIGN_OR_RETURN(BlockSink * sink, writer.StageImage(m.image));
  BARGE_ASSIGN_OR_RETURN(uint64_t bytes, StreamFile(env, src.PathOf(m.image), *sink, cancel));
  std::vector<std::string> small = {m.digest_table};
  if (!m.strong_digest_table.empty()) small.push_back(m.strong_digest_table);
  small.push_back(BaseName(p.manifest_path));
  for (const std::string& name : small) {
    BARGE_RETURN_IF_ERROR(CheckCancel(cancel, "sync", src.PathOf(name)));
    BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, src.PathOf(name), kMaxSmallFile));
    BARGE_RETURN_IF_ERROR(writer.StageSmallFile(name, std::as_bytes(std::span(text.data(), text.size()))));
    bytes += text.size();
  }
  BARGE_RETURN_IF_ERROR(writer.Commit());
  return bytes;
}

// Removes a committed point's files, the manifest first (as a failed
// commit does), so that no manifest ever names a removed file.
Status RemovePoint(Env& env, const std::string& dst, const ChainPoint& p) {
  const formats::BackupManifest& m = p.manifest;
  Status s = env.UnlinkIfExists(JoinPath(dst, BaseName(p.manifest_path)));
  for (const std::string& name : {m.image, m.digest_table, m.strong_digest_table, m.id + ".verified"}) {
    if (name.empty()) continue;
    Status r = env.UnlinkIfExists(JoinPath(dst, name));
    if (s.ok() && !r.ok()) s = r;
  }
  return s;
}

}  // namespace

Result<SyncChainResult> SyncChain(Env& env, const std::string& src, const std::string& dst,
                                  const SyncOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SyncChainResult result;
  result.src = src;
  result.dst = dst;
  BARGE_ASSIGN_OR_RETURN(ChainFolder src_chain, LoadChainFolder(env, src));
  if (src_chain.empty()) return Error::NotFound("no backup point to sync").set_path(src);

  // DST's lock for the whole sync once its folder exists; a DST made here
  // is locked by its first point's writer, then by this lock.
  std::optional<ChainLock> lock;
  ChainFolder dst_chain;
  dst_chain.dir = dst;
  if (env.Exists(dst)) {
    BARGE_ASSIGN_OR_RETURN(ChainLock held, ChainLock::Acquire(env, dst));
    lock.emplace(std::move(held));
    BARGE_ASSIGN_OR_RETURN(dst_chain, LoadChainFolder(env, dst, &*lock));
  }
  BARGE_RETURN_IF_ERROR(CheckReceiver(src_chain, dst_chain, options.newer_only));

  std::map<std::string, bool> have;
  for (const ChainPoint& d : dst_chain.points) have[d.manifest.id] = true;
  for (size_t i = 0; i < src_chain.points.size(); ++i) {
    const ChainPoint& p = src_chain.points[i];
    const auto point_start = std::chrono::steady_clock::now();
    SyncedPoint& out = result.points.emplace_back();
    out.id = p.manifest.id;
    const bool forgotten = options.newer_only && !dst_chain.empty() && p.sequence < dst_chain.latest().sequence;
    if (have.count(p.manifest.id) != 0 || forgotten) {
      ++result.skipped;
      if (options.on_point) options.on_point(result, out);
      continue;
    }
    BARGE_RETURN_IF_ERROR(CheckCancel(options.cancel, "sync", src));
    // A point over a base verifies in DST only with the base there.
    if (p.manifest.base) {
      ChainFolder as_in_dst = src_chain;
      as_in_dst.dir = dst;
      if (auto base = LoadBaseOf(env, as_in_dst, i); !base.ok()) {
        return Error(base.error()).Wrap("sync: " + p.manifest.id + " not copied (sync its base chain first)");
      }
    }
    // Damaged data in SRC is never copied: DST stays without the point.
    if (Status ok = VerifyPoint(env, src, p.manifest.id); !ok.ok()) {
      return Error(ok.error()).Wrap("sync: SRC's point " + p.manifest.id + " does not verify; not copied");
    }
    ChainWriterOptions wo;
    wo.job = "sync";
    wo.held = lock ? &*lock : nullptr;
    wo.create = !lock;
    wo.parent_dir = lock ? "" : DirName(dst);
    wo.remove_leftovers = true;  // what a killed sync staged or published without its manifest
    {
      BARGE_ASSIGN_OR_RETURN(std::unique_ptr<ChainWriter> writer, ChainWriter::Open(env, dst, wo));
      BARGE_ASSIGN_OR_RETURN(out.bytes, CopyPoint(env, src_chain, i, *writer, options.cancel));
    }
    if (!lock) {
      BARGE_ASSIGN_OR_RETURN(ChainLock held, ChainLock::Acquire(env, dst));
      lock.emplace(std::move(held));
    }
    if (Status ok = CheckCopiedPoint(env, src_chain, i, dst, *lock, options.cancel); !ok.ok()) {
      Error e = Error(ok.error()).Wrap("sync: DST's copy of " + p.manifest.id + " does not verify; removed");
      e.Also(RemovePoint(env, dst, p));
      return e;
    }
    out.copied = true;
    out.verified = true;
    out.seconds = SecondsSince(point_start);
    ++result.copied;
    result.bytes_copied += out.bytes;
    if (options.on_point) options.on_point(result, out);
  }
  result.seconds = SecondsSince(start);
  return result;
}

Result<bool> IsChainFolder(Env& env, const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  return std::any_of(names.begin(), names.end(),
                     [](const std::string& n) { return !n.empty() && n[0] != '.' && Extension(n) == ".json"; });
}

Result<std::vector<std::pair<std::string, std::string>>> SyncPairs(Env& env, const std::string& src,
                                                                   const std::string& dst) {
  auto st = env.Stat(src);
  if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
  if (!st.ok() || !st->is_directory()) return Error::NotFound("no chain folder or target folder").set_path(src);
  std::vector<std::pair<std::string, std::string>> pairs;
  BARGE_ASSIGN_OR_RETURN(bool chain, IsChainFolder(env, src));
  if (chain) {
    pairs.emplace_back(src, dst);
    return pairs;
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(src));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name.empty() || name[0] == '.') continue;
    const std::string dir = JoinPath(src, name);
    auto s = env.StatNoFollow(dir);
    if (!s.ok() || !s->is_directory()) continue;
    BARGE_ASSIGN_OR_RETURN(bool is_chain, IsChainFolder(env, dir));
    if (is_chain) pairs.emplace_back(dir, JoinPath(dst, name));
  }
  // A chain other chains stand on (`backup --base`) goes before them: a
  // clone's copy verifies only once its base is in DST.
  std::vector<bool> over_base;
  for (const auto& [from, to] : pairs) {
    BARGE_ASSIGN_OR_RETURN(ChainFolder c, LoadChainFolder(env, from));
    over_base.push_back(std::any_of(c.points.begin(), c.points.end(),
                                    [](const ChainPoint& p) { return p.manifest.base.has_value(); }));
  }
  std::vector<std::pair<std::string, std::string>> ordered;
  for (bool second : {false, true}) {
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (over_base[i] == second) ordered.push_back(pairs[i]);
    }
  }
  pairs = std::move(ordered);
  if (pairs.empty()) return Error::NotFound("no backup point to sync: neither a chain folder nor a target folder holding one").set_path(src);
  return pairs;
}

}  // namespace barge::pipeline

namespace barge::pipeline {

std::string SyncPointText(const SyncedPoint& point) {
  if (!point.copied) return "  skipped " + point.id + " (DST has it)";
  return "  copied " + point.id + " (" + formats::HumanBytes(point.bytes) + ")" +
         (point.verified ? ", verified" : "");
}

std::string SyncChainText(const SyncChainResult& chain) {
  if (chain.copied == 0) {
    return chain.src + " -> " + chain.dst + ": nothing to copy (DST has all " + std::to_string(chain.skipped) +
           (chain.skipped == 1 ? " point" : " points") + "), in " + formats::HumanSeconds(chain.seconds);
  }
  return chain.src + " -> " + chain.dst + ": " + std::to_string(chain.copied) +
         (chain.copied == 1 ? " point" : " points") + " copied (" + formats::HumanBytes(chain.bytes_copied) +
         ", each verified" + "), " + std::to_string(chain.skipped) + " skipped, in " +
         formats::HumanSeconds(chain.seconds);
}

}  // namespace barge::pipeline
