// Per-cluster compression for qcow2: one zstd frame or one raw deflate stream
// per cluster, and the matching decoders that tolerate trailing bytes (QCOW2.md §4).
#include "formats/qcow2_compress.h"

#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <climits>
#include <string>

#include "formats/sector.h"

namespace barge::formats {
namespace {

// qemu writes raw deflate with a 4 KiB window and memLevel 9; readers built
// with any windowBits between 12 and 15 can then decode it.
constexpr int kDeflateWriteWindowBits = -12;
// Reading with the largest window accepts streams from any writer.
constexpr int kDeflateReadWindowBits = -15;
constexpr int kDeflateMemLevel = 9;

struct ZstdCCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct ZstdDCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

// Owns a z_stream set up with deflateInit2 or inflateInit2.
class ZStream {
 public:
  ZStream() = default;
  ~ZStream() {
    if (!initialized_) return;
    if (deflating_) deflateEnd(&s_); else inflateEnd(&s_);
  }
  ZStream(const ZStream&) = delete;
  ZStream& operator=(const ZStream&) = delete;

  bool InitDeflate(int level) {
    initialized_ = deflateInit2(&s_, level, Z_DEFLATED, kDeflateWriteWindowBits, kDeflateMemLevel,
                                Z_DEFAULT_STRATEGY) == Z_OK;
    deflating_ = true;
    return initialized_;
  }
  bool InitInflate() {
    initialized_ = inflateInit2(&s_, kDeflateReadWindowBits) == Z_OK;
    deflating_ = false;
    return initialized_;
  }
  bool initialized() const { return initialized_; }
  z_stream* get() { return &s_; }

 private:
  z_stream s_{};
  bool initialized_ = false;
  bool deflating_ = false;
};

// The largest window a payload may ask the decoder for: 8 MiB, four times
// the largest cluster (2 MiB). A frame only needs a window as big as its
// content, but one from an untrusted image may declare up to zstd's default
// limit of 128 MiB, allocated per decoding thread. Such a frame is refused.
constexpr int kZstdWindowLogMax = 23;

ZSTD_DCtx* NewZstdDCtx() {
  ZSTD_DCtx* d = ZSTD_createDCtx();
  if (d != nullptr && ZSTD_isError(ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, kZstdWindowLogMax))) {
    ZSTD_freeDCtx(d);
    return nullptr;
  }
  return d;
}

Status DecompressZstd(std::span<const std::byte> payload, std::span<std::byte> out) {
  // One decoder context per thread: DecompressCluster is called from many
  // reader threads and a context is too costly to build per cluster.
  thread_local std::unique_ptr<ZSTD_DCtx, ZstdDCtxDeleter> dctx(NewZstdDCtx());
  if (!dctx) return Error::IoError("zstd: cannot allocate a decompression context");
  ZSTD_DCtx_reset(dctx.get(), ZSTD_reset_session_only);

  ZSTD_inBuffer in{payload.data(), payload.size(), 0};
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  // Stop as soon as the cluster is full: the rest of the input range may be
  // the start of the next payload.
  while (o.pos < o.size) {
    size_t in_before = in.pos;
    size_t out_before = o.pos;
    size_t ret = ZSTD_decompressStream(dctx.get(), &o, &in);
    if (ZSTD_isError(ret)) {
      return Error::Corruption(std::string("zstd: bad compressed cluster: ") +
                               ZSTD_getErrorName(ret));
    }
    if (in.pos == in_before && o.pos == out_before) {
      return Error::Corruption("zstd: compressed cluster ends after " + std::to_string(o.pos) +
                               " of " + std::to_string(o.size) + " bytes");
    }
  }
  return OkStatus();
}

Status DecompressDeflate(std::span<const std::byte> payload, std::span<std::byte> out) {
  if (payload.size() > UINT_MAX || out.size() > UINT_MAX) {
    return Error::InvalidArgument("deflate: compressed cluster too large");
  }
  ZStream zs;
  if (!zs.InitInflate()) return Error::IoError("deflate: inflateInit2 failed");
  z_stream* s = zs.get();
  s->next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(payload.data()));
  s->avail_in = static_cast<uInt>(payload.size());
  s->next_out = reinterpret_cast<Bytef*>(out.data());
  s->avail_out = static_cast<uInt>(out.size());
  int ret = inflate(s, Z_FINISH);
  // Z_BUF_ERROR with a full output means the cluster is complete but the
  // stream's end marker lies beyond what we asked for; qemu accepts it too.
  if ((ret == Z_STREAM_END || ret == Z_BUF_ERROR) && s->avail_out == 0) return OkStatus();
  if (ret == Z_STREAM_END || ret == Z_BUF_ERROR) {
    return Error::Corruption("deflate: compressed cluster yields " +
                             std::to_string(out.size() - s->avail_out) + " of " +
                             std::to_string(out.size()) + " bytes");
  }
  return Error::Corruption(std::string("deflate: bad compressed cluster: ") +
                           (s->msg ? s->msg : "error " + std::to_string(ret)));
}

}  // namespace

struct ClusterCompressor::Impl {
  Compression type = Compression::kNone;
  int level = 0;
  std::unique_ptr<ZSTD_CCtx, ZstdCCtxDeleter> cctx;
  std::unique_ptr<ZStream> deflater;  // reset, not rebuilt, per cluster
  std::vector<std::byte> out;
};

ClusterCompressor::ClusterCompressor(Compression type, int level) : impl_(std::make_unique<Impl>()) {
  impl_->type = type;
  if (type == Compression::kZstd) {
    impl_->level = (level >= 1 && level <= ZSTD_maxCLevel()) ? level : kDefaultZstdLevel;
  } else if (type == Compression::kDeflate) {
    impl_->level = (level >= 1 && level <= 9) ? level : kDefaultDeflateLevel;
  }
}

ClusterCompressor::~ClusterCompressor() = default;

Result<std::optional<std::span<const std::byte>>> ClusterCompressor::Compress(
    std::span<const std::byte> cluster) {
  using Payload = std::optional<std::span<const std::byte>>;
  Impl& im = *impl_;
  if (cluster.size() <= kSectorBytes) return Payload{};
  if (im.out.size() < cluster.size() - kSectorBytes) im.out.resize(cluster.size() - kSectorBytes);
  BARGE_ASSIGN_OR_RETURN(size_t n, CompressInto(cluster, im.out));
  if (n == 0) return Payload{};
  return Payload{std::span<const std::byte>(im.out.data(), n)};
}

Result<size_t> ClusterCompressor::CompressInto(std::span<const std::byte> cluster, std::span<std::byte> out) {
  Impl& im = *impl_;
  // Worth storing only if at least one 512-byte sector is saved, so the
  // output is capped at that size: overflowing it means "store raw".
  if (im.type == Compression::kNone || cluster.size() <= kSectorBytes) return size_t{0};
  const size_t limit = std::min(cluster.size() - kSectorBytes, out.size());
  if (limit == 0) return size_t{0};

  if (im.type == Compression::kZstd) {
    if (!im.cctx) {
      // Parameters are set once: a frame ends with a session reset, which
      // keeps them (and the context's tables) for the next cluster.
      im.cctx.reset(ZSTD_createCCtx());
      if (!im.cctx) return Error::IoError("zstd: cannot allocate a compression context");
      ZSTD_CCtx* c = im.cctx.get();
      ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, im.level);
      ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
      ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 0);
    }
    ZSTD_CCtx* c = im.cctx.get();
    ZSTD_CCtx_reset(c, ZSTD_reset_session_only);
    size_t n = ZSTD_compress2(c, out.data(), limit, cluster.data(), cluster.size());
    if (ZSTD_isError(n)) {
      if (ZSTD_getErrorCode(n) == ZSTD_error_dstSize_tooSmall) return size_t{0};
      return Error::IoError(std::string("zstd: compress failed: ") + ZSTD_getErrorName(n));
    }
    return n;
  }

  if (cluster.size() > UINT_MAX) return Error::InvalidArgument("deflate: cluster too large");
  if (!im.deflater) {
    auto zs = std::make_unique<ZStream>();
    if (!zs->InitDeflate(im.level)) return Error::IoError("deflate: deflateInit2 failed");
    im.deflater = std::move(zs);
  } else if (deflateReset(im.deflater->get()) != Z_OK) {
    return Error::IoError("deflate: deflateReset failed");
  }
  z_stream* s = im.deflater->get();
  s->next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(cluster.data()));
  s->avail_in = static_cast<uInt>(cluster.size());
  s->next_out = reinterpret_cast<Bytef*>(out.data());
  s->avail_out = static_cast<uInt>(limit);
  int ret = deflate(s, Z_FINISH);
  if (ret == Z_STREAM_END) return limit - s->avail_out;
  // Z_OK or Z_BUF_ERROR: the output did not fit into `limit` bytes.
  if (ret == Z_OK || ret == Z_BUF_ERROR) return size_t{0};
  return Error::IoError("deflate: compress failed with error " + std::to_string(ret));
}

Status DecompressCluster(Compression type, std::span<const std::byte> payload,
                         std::span<std::byte> out) {
  switch (type) {
    case Compression::kZstd: return DecompressZstd(payload, out);
    case Compression::kDeflate: return DecompressDeflate(payload, out);
    case Compression::kNone: break;
  }
  return Error::InvalidArgument("DecompressCluster: no compression type");
}

}  // namespace barge::formats
