// Structure-aware qcow2 mutator (see qcow2_mutator.h): a tolerant walk that
// lists the image's metadata fields, then a few edits of those fields, of
// whole clusters, of the extension area and names, or of compressed
// payloads; libFuzzer's byte mutations for the rest of the time.
#include "fuzz/qcow2_mutator.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace barge::fuzz {
namespace {

constexpr uint32_t kMagic = 0x514649fb;
constexpr uint64_t kOffsetMask = 0x00fffffffffffe00ull;  // L1/L2/bitmap-table offsets
constexpr size_t kMaxFieldsPerKind = 4096;
constexpr size_t kMaxTables = 64;     // L2 tables, refcount blocks, bitmap tables followed
constexpr uint32_t kMaxSnapshots = 64;
constexpr uint32_t kMaxBitmaps = 64;
constexpr uint32_t kExtBitmaps = 0x23852875;
constexpr uint32_t kExtDataFile = 0x44415441;
constexpr uint32_t kExtBackingFormat = 0xe2792aca;

uint64_t Load(std::span<const uint8_t> b, uint64_t off, uint32_t width) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < width; ++i) v = (v << 8) | b[off + i];
  return v;
}
void Store(uint8_t* b, uint64_t off, uint32_t width, uint64_t v) {
  for (uint32_t i = width; i-- > 0;) {
    b[off + i] = static_cast<uint8_t>(v);
    v >>= 8;
  }
}
uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

class Rng {
 public:
  explicit Rng(uint32_t seed) : g_(seed) {}
  uint64_t Next() { return g_(); }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : g_() % n; }
  bool OneIn(uint64_t n) { return Below(n) == 0; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[Below(v.size())]; }

 private:
  std::mt19937_64 g_;
};

// What the walk learned besides the fields: where structures start, for
// "point this offset at that structure" edits.
struct Layout {
  bool valid = false;
  uint32_t version = 0;
  uint32_t cluster_bits = 16;
  uint64_t cs = 1 << 16;
  uint32_t header_length = 72;
  uint64_t backing_off = 0;
  uint32_t backing_size = 0;
  uint8_t compression = 0;
  std::vector<Field> fields;
  std::vector<uint64_t> structures;  // offsets of tables and blocks
};

class Walker {
 public:
  explicit Walker(std::span<const uint8_t> b) : b_(b), size_(b.size()) {}

  Layout Run() {
    Layout& L = out_;
    if (size_ < 72 || Load(b_, 0, 4) != kMagic) return L;
    L.valid = true;
    L.version = static_cast<uint32_t>(Load(b_, 4, 4));
    const uint32_t cb = static_cast<uint32_t>(Load(b_, 20, 4));
    L.cluster_bits = (cb >= 9 && cb <= 21) ? cb : 16;
    L.cs = uint64_t{1} << L.cluster_bits;
    static constexpr std::array<std::pair<uint32_t, uint32_t>, 11> kV2 = {{
        {8, 8}, {16, 4}, {20, 4}, {24, 8}, {32, 4}, {36, 4}, {40, 8}, {48, 8}, {56, 4}, {60, 4}, {64, 8}}};
    for (auto [off, w] : kV2) Add(off, w, FieldKind::kHeader);
    bool extended_l2 = false;
    uint32_t refcount_order = 4;
    L.header_length = 72;
    if (L.version >= 3 && size_ >= 104) {
      static constexpr std::array<std::pair<uint32_t, uint32_t>, 5> kV3 = {
          {{72, 8}, {80, 8}, {88, 8}, {96, 4}, {100, 4}}};
      for (auto [off, w] : kV3) Add(off, w, FieldKind::kHeader);
      extended_l2 = Load(b_, 72, 8) & (1u << 4);
      refcount_order = static_cast<uint32_t>(Load(b_, 96, 4));
      if (refcount_order > 6) refcount_order = 4;
      L.header_length = static_cast<uint32_t>(Load(b_, 100, 4));
      if (L.header_length > 104 && size_ > 104) {
        Add(104, 1, FieldKind::kHeader);
        L.compression = b_[104];
      }
    }
    L.backing_off = Load(b_, 8, 8);
    L.backing_size = static_cast<uint32_t>(Load(b_, 16, 4));
    Structure(0);
    Extensions();

    const uint64_t l1_off = Load(b_, 40, 8);
    const uint64_t l1_size = Load(b_, 36, 4);
    L1(l1_off, l1_size, FieldKind::kL1, extended_l2);
    RefcountTable(Load(b_, 48, 8), Load(b_, 56, 4), refcount_order);
    Snapshots(Load(b_, 64, 8), static_cast<uint32_t>(Load(b_, 60, 4)), extended_l2);
    return std::move(out_);
  }

 private:
  bool In(uint64_t off, uint64_t len) const { return off <= size_ && len <= size_ - off; }
  void Add(uint64_t off, uint32_t width, FieldKind kind) {
    if (!In(off, width) || width == 0) return;
    if (counts_[static_cast<size_t>(kind)]++ >= kMaxFieldsPerKind) return;
    out_.fields.push_back({off, width, kind});
  }
  bool Structure(uint64_t off) {
    if (!seen_.insert(off).second) return false;
    out_.structures.push_back(off);
    return true;
  }

  void Extensions() {
    Layout& L = out_;
    uint64_t end = std::min<uint64_t>(L.cs, size_);
    if (L.backing_off != 0 && L.backing_off < end) end = L.backing_off;
    for (uint64_t off = L.header_length; off + 8 <= end;) {
      const uint32_t type = static_cast<uint32_t>(Load(b_, off, 4));
      const uint32_t len = static_cast<uint32_t>(Load(b_, off + 4, 4));
      Add(off, 4, FieldKind::kExtension);
      Add(off + 4, 4, FieldKind::kExtension);
      if (type == 0) break;
      if (type == kExtBitmaps && len == 24 && In(off + 8, 24)) {
        Add(off + 8, 4, FieldKind::kExtension);
        Add(off + 12, 4, FieldKind::kExtension);
        Add(off + 16, 8, FieldKind::kExtension);
        Add(off + 24, 8, FieldKind::kExtension);
        Bitmaps(Load(b_, off + 24, 8), Load(b_, off + 16, 8), static_cast<uint32_t>(Load(b_, off + 8, 4)));
      }
      off += 8 + Align8(len);
    }
  }

  void L1(uint64_t l1_off, uint64_t l1_size, FieldKind kind, bool extended_l2) {
    if (l1_size == 0 || !In(l1_off, 8)) return;
    Structure(l1_off);
    const uint64_t n = std::min<uint64_t>(l1_size, (size_ - l1_off) / 8);
    for (uint64_t i = 0; i < n && i < kMaxFieldsPerKind; ++i) {
      const uint64_t at = l1_off + 8 * i;
      Add(at, 8, kind);
      const uint64_t l2 = Load(b_, at, 8) & kOffsetMask;
      if (l2 != 0 && (l2 & (out_.cs - 1)) == 0 && In(l2, out_.cs) && l2_tables_ < kMaxTables &&
          Structure(l2)) {
        ++l2_tables_;
        L2(l2, extended_l2);
      }
    }
  }

  void L2(uint64_t l2, bool extended_l2) {
    const uint32_t eb = extended_l2 ? 16 : 8;
    const uint32_t cb = out_.cluster_bits;
    for (uint64_t i = 0; i < out_.cs / eb; ++i) {
      const uint64_t at = l2 + i * eb;
      const uint64_t e = Load(b_, at, 8);
      Add(at, 8, FieldKind::kL2);
      if (extended_l2) Add(at + 8, 8, FieldKind::kL2Bitmap);
      if (e & (uint64_t{1} << 62)) {
        const uint32_t x = 70 - cb;
        const uint64_t host = e & ((uint64_t{1} << x) - 1);
        const uint64_t sectors = ((e >> x) & ((uint64_t{1} << (cb - 8)) - 1)) + 1;
        const uint64_t bytes = sectors * 512 - (host & 511);
        if (host < size_) {
          // The width is the payload's length inside the file.
          Add(host, static_cast<uint32_t>(std::min<uint64_t>(bytes, size_ - host)),
              FieldKind::kCompressedPayload);
        }
      }
    }
  }

  void RefcountTable(uint64_t rt_off, uint64_t clusters, uint32_t order) {
    if (!In(rt_off, 8) || (rt_off & (out_.cs - 1)) != 0) return;
    Structure(rt_off);
    const uint64_t bytes = std::min<uint64_t>(clusters * out_.cs, size_ - rt_off);
    const uint64_t bits = uint64_t{1} << order;
    const uint64_t per_block = out_.cs * 8 / bits;
    const uint64_t file_clusters = (size_ + out_.cs - 1) / out_.cs + 4;
    size_t blocks = 0;
    for (uint64_t i = 0; i < bytes / 8 && i < kMaxFieldsPerKind; ++i) {
      const uint64_t at = rt_off + 8 * i;
      const uint64_t block = Load(b_, at, 8) & ~uint64_t{511};
      // Entries past the file's clusters are empty and dull; keep a few.
      if (block == 0 && i > file_clusters / per_block + 2) continue;
      Add(at, 8, FieldKind::kRefcountTable);
      if (block == 0 || (block & (out_.cs - 1)) != 0 || !In(block, out_.cs) || blocks >= kMaxTables ||
          !Structure(block)) {
        continue;
      }
      ++blocks;
      const uint32_t width = bits >= 8 ? static_cast<uint32_t>(bits / 8) : 1;
      const uint64_t entries_here = std::min<uint64_t>(per_block, file_clusters - std::min(file_clusters, i * per_block));
      const uint64_t bytes_used = bits >= 8 ? entries_here * width : (entries_here * bits + 7) / 8;
      for (uint64_t off = 0; off < bytes_used; off += width) Add(block + off, width, FieldKind::kRefcountBlock);
    }
  }

  void Bitmaps(uint64_t dir_off, uint64_t dir_size, uint32_t nb) {
    if (!In(dir_off, 24)) return;
    Structure(dir_off);
    const uint64_t end = dir_off + std::min<uint64_t>(dir_size, size_ - dir_off);
    uint64_t pos = dir_off;
    for (uint32_t i = 0; i < std::min(nb, kMaxBitmaps) && pos + 24 <= end; ++i) {
      static constexpr std::array<std::pair<uint32_t, uint32_t>, 7> kEntry = {
          {{0, 8}, {8, 4}, {12, 4}, {16, 1}, {17, 1}, {18, 2}, {20, 4}}};
      for (auto [off, w] : kEntry) Add(pos + off, w, FieldKind::kBitmapDirectory);
      const uint64_t table = Load(b_, pos, 8);
      const uint64_t table_size = Load(b_, pos + 8, 4);
      const uint64_t name_size = Load(b_, pos + 18, 2);
      const uint64_t extra = Load(b_, pos + 20, 4);
      if ((table & (out_.cs - 1)) == 0 && table != 0 && In(table, 8) && Structure(table)) {
        const uint64_t n = std::min<uint64_t>(table_size, (size_ - table) / 8);
        for (uint64_t k = 0; k < n; ++k) Add(table + 8 * k, 8, FieldKind::kBitmapTable);
      }
      pos += Align8(24 + extra + name_size);
    }
  }

  void Snapshots(uint64_t off, uint32_t nb, bool extended_l2) {
    if (nb == 0 || !In(off, 40)) return;
    Structure(off);
    uint64_t pos = off;
    for (uint32_t i = 0; i < std::min(nb, kMaxSnapshots) && In(pos, 40); ++i) {
      static constexpr std::array<std::pair<uint32_t, uint32_t>, 9> kEntry = {
          {{0, 8}, {8, 4}, {12, 2}, {14, 2}, {16, 4}, {20, 4}, {24, 8}, {32, 4}, {36, 4}}};
      for (auto [o, w] : kEntry) Add(pos + o, w, FieldKind::kSnapshot);
      const uint64_t extra = Load(b_, pos + 36, 4);
      for (uint64_t o = 0; o + 8 <= std::min<uint64_t>(extra, 24); o += 8) Add(pos + 40 + o, 8, FieldKind::kSnapshot);
      const uint64_t l1 = Load(b_, pos, 8);
      const uint64_t l1_size = Load(b_, pos + 8, 4);
      L1(l1, l1_size, FieldKind::kSnapshotL1, extended_l2);
      pos += Align8(40 + extra + Load(b_, pos + 12, 2) + Load(b_, pos + 14, 2));
    }
  }

  std::span<const uint8_t> b_;
  uint64_t size_;
  Layout out_;
  std::set<uint64_t> seen_;
  std::array<size_t, static_cast<size_t>(FieldKind::kCount)> counts_{};
  size_t l2_tables_ = 0;
};

// Compression bombs: streams that inflate far beyond any cluster (1 MiB of
// zeros), in raw deflate and in zstd, and a zstd frame that asks for a
// 1 GiB window. Built once.
struct Bombs {
  std::vector<uint8_t> deflate, zstd, zstd_window;
  Bombs() {
    std::vector<uint8_t> zeros(1 << 20);
    z_stream s{};
    if (deflateInit2(&s, 9, Z_DEFLATED, -15, 9, Z_DEFAULT_STRATEGY) == Z_OK) {
      deflate.resize(8192);
      s.next_in = zeros.data();
      s.avail_in = static_cast<uInt>(zeros.size());
      s.next_out = deflate.data();
      s.avail_out = static_cast<uInt>(deflate.size());
      ::deflate(&s, Z_FINISH);
      deflate.resize(deflate.size() - s.avail_out);
      deflateEnd(&s);
    }
    zstd.resize(ZSTD_compressBound(zeros.size()));
    size_t n = ZSTD_compress(zstd.data(), zstd.size(), zeros.data(), zeros.size(), 3);
    zstd.resize(ZSTD_isError(n) ? 0 : n);
    // Frame header: magic, descriptor with no content size and no single
    // segment, window descriptor 0xA8 (exponent 21+10 = 2^31), then one
    // raw block of 8 bytes.
    zstd_window = {0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xa8, 0x41, 0x00, 0x00, 1, 2, 3, 4, 5, 6, 7, 8};
  }
};

const Bombs& GetBombs() {
  static const Bombs bombs;
  return bombs;
}

const std::vector<std::string>& Names() {
  static const std::vector<std::string> names = {
      "/etc/shadow", "../../../../etc/passwd", "json:{\"driver\":\"raw\",\"file\":{\"filename\":\"/etc/passwd\"}}",
      "nbd:unix:/tmp/barge-fuzz.sock", "file:layer1", "http://169.254.169.254/", "layer1", "layer2", "layer3",
      "top.qcow2", "./top.qcow2", "sub/../layer1", "/fuzz/layer1", "/fuzz/top.qcow2", "layer1/", ".", "..",
      "a:b", "/", "raw", "qcow2", "vmdk", std::string(1023, 'a'), std::string("layer1\0x", 8)};
  return names;
}

// Interesting values for a field of `width` bytes.
uint64_t InterestingValue(Rng& r, uint32_t width, uint64_t cs) {
  static constexpr std::array<uint64_t, 20> kSmall = {0, 1, 2, 7, 8, 9, 16, 21, 22, 23, 63, 64, 65, 104, 112, 255, 256, 1023, 1024, 65535};
  static constexpr std::array<uint64_t, 12> kLarge = {
      0x7fffffffull, 0x80000000ull, 0xffffffffull, 0x100000000ull, 1ull << 40, 1ull << 55, (1ull << 56) - 512,
      1ull << 62, 1ull << 63, 0x7ffffffffffffe00ull, 0xfffffffffffffe00ull, 0xffffffffffffffffull};
  switch (r.Below(4)) {
    case 0: return kSmall[r.Below(kSmall.size())];
    case 1: return width >= 4 ? kLarge[r.Below(width == 8 ? kLarge.size() : 3)] : kSmall[r.Below(kSmall.size())];
    case 2: return cs * (1 + r.Below(64));
    default: return (uint64_t{1} << r.Below(width * 8)) + (r.OneIn(2) ? 0 : -1ull);
  }
}

class Mutator {
 public:
  Mutator(uint8_t* data, size_t size, size_t max_size, Rng& r)
      : d_(data), size_(size), max_(max_size), r_(r) {}

  size_t Run() {
    Layout L = Walker(std::span<const uint8_t>(d_, size_)).Run();
    if (!L.valid || L.fields.empty() || r_.OneIn(6)) return Bytes();
    L_ = &L;
    const int edits = 1 + static_cast<int>(r_.Below(3)) + (r_.OneIn(4) ? 3 : 0);
    for (int i = 0; i < edits; ++i) {
      switch (r_.Below(16)) {
        case 0: Cluster(); break;
        case 1: Resize(); break;
        case 2: Names(); break;
        case 3: Payload(); break;
        default: FieldEdit(); break;
      }
    }
    if (r_.OneIn(8)) return Bytes();
    return size_;
  }

 private:
  size_t Bytes() { return LLVMFuzzerMutate(d_, size_, max_); }

  // Where an offset may point: another structure, the end of the file, or
  // far beyond it; sometimes misaligned.
  uint64_t Target() {
    const uint64_t cs = L_->cs;
    uint64_t t;
    switch (r_.Below(6)) {
      case 0: t = 0; break;
      case 1: t = size_; break;
      case 2: t = (size_ + cs - 1) & ~(cs - 1); break;
      case 3: t = InterestingValue(r_, 8, cs); break;
      case 4: t = r_.Below(size_ + 1) & ~(cs - 1); break;
      default: t = r_.Pick(L_->structures); break;
    }
    if (r_.OneIn(8)) t += r_.OneIn(2) ? 1 : 512;
    return t;
  }

  void FieldEdit() {
    // Pick a kind first, so the many L2/refcount entries do not drown the
    // few header and snapshot fields.
    std::vector<const Field*> of_kind;
    for (int tries = 0; tries < 4 && of_kind.empty(); ++tries) {
      const auto kind = static_cast<FieldKind>(r_.Below(static_cast<uint64_t>(FieldKind::kCount)));
      for (const Field& f : L_->fields) {
        if (f.kind == kind && f.offset + f.width <= size_) of_kind.push_back(&f);
      }
    }
    if (of_kind.empty()) return;
    const Field& f = *of_kind[r_.Below(of_kind.size())];
    if (f.kind == FieldKind::kCompressedPayload) return PayloadAt(f);
    const uint32_t w = f.width;
    const uint64_t mask = w == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * w)) - 1;
    const uint64_t old = Load(std::span<const uint8_t>(d_, size_), f.offset, w);
    uint64_t v = old;
    switch (r_.Below(9)) {
      case 0: v = 0; break;
      case 1: v = mask; break;
      case 2: v = r_.Next(); break;
      case 3: {
        static constexpr std::array<int64_t, 8> kDelta = {1, -1, 8, -8, 512, -512, 16, -16};
        int64_t delta = r_.OneIn(3) ? static_cast<int64_t>(L_->cs) * (r_.OneIn(2) ? 1 : -1) : kDelta[r_.Below(8)];
        v = old + static_cast<uint64_t>(delta);
        break;
      }
      case 4: v = old ^ (uint64_t{1} << r_.Below(8 * w)); break;
      case 5: v = InterestingValue(r_, w, L_->cs); break;
      case 6: {
        // Point at something, keeping the entry's flag bits.
        uint64_t t = Target();
        bool entry = f.kind == FieldKind::kL1 || f.kind == FieldKind::kL2 || f.kind == FieldKind::kSnapshotL1 ||
                     f.kind == FieldKind::kBitmapTable || f.kind == FieldKind::kRefcountTable;
        v = entry && !r_.OneIn(4) ? (old & ~kOffsetMask) | (t & kOffsetMask) : t;
        break;
      }
      case 7: v = KindFlip(f, old); break;
      default: {
        // Copy another field of the same kind and width: aliasing.
        const Field& g = L_->fields[r_.Below(L_->fields.size())];
        if (g.kind == f.kind && g.width == w && g.offset + w <= size_) {
          v = Load(std::span<const uint8_t>(d_, size_), g.offset, w);
        }
        break;
      }
    }
    Store(d_, f.offset, w, v & mask);
  }

  uint64_t KindFlip(const Field& f, uint64_t old) {
    switch (f.kind) {
      case FieldKind::kL1:
      case FieldKind::kSnapshotL1: {
        static constexpr std::array<uint32_t, 4> kBits = {63, 62, 0, 56};
        return old ^ (uint64_t{1} << kBits[r_.Below(kBits.size())]);
      }
      case FieldKind::kL2: {
        if (old & (uint64_t{1} << 62) && r_.OneIn(2)) {
          // Compressed: a new host byte offset and sector count.
          const uint32_t x = 70 - L_->cluster_bits;
          uint64_t host = r_.OneIn(2) ? r_.Below(size_ + 1024) : Target();
          uint64_t sectors = r_.OneIn(2) ? r_.Next() : 0;
          return (uint64_t{1} << 62) | ((sectors << x) & ((uint64_t{1} << 62) - 1)) | (host & ((uint64_t{1} << x) - 1));
        }
        static constexpr std::array<uint32_t, 6> kBits = {63, 62, 0, 1, 56, 61};
        return old ^ (uint64_t{1} << kBits[r_.Below(kBits.size())]);
      }
      case FieldKind::kL2Bitmap: {
        uint32_t sc = static_cast<uint32_t>(r_.Below(32));
        return r_.OneIn(2) ? old | (uint64_t{1} << sc) | (uint64_t{1} << (sc + 32)) : old ^ (uint64_t{1} << (sc + 32 * r_.Below(2)));
      }
      case FieldKind::kHeader:
        if (f.offset == 72 || f.offset == 80 || f.offset == 88) return old ^ (uint64_t{1} << (r_.OneIn(8) ? r_.Below(64) : r_.Below(6)));
        if (f.offset == 20) return 8 + r_.Below(16);  // cluster_bits around the valid range
        if (f.offset == 4) return r_.Below(5);
        return old ^ 1;
      case FieldKind::kBitmapDirectory:
        return old ^ (uint64_t{1} << r_.Below(4));
      case FieldKind::kBitmapTable:
        return old ^ (r_.OneIn(2) ? 1 : uint64_t{1} << 63);
      default:
        return old ^ (uint64_t{1} << r_.Below(8));
    }
  }

  void Payload() {
    std::vector<const Field*> payloads;
    for (const Field& f : L_->fields) {
      if (f.kind == FieldKind::kCompressedPayload && f.offset + f.width <= size_) payloads.push_back(&f);
    }
    if (!payloads.empty()) PayloadAt(*payloads[r_.Below(payloads.size())]);
  }

  // Damages a compressed payload, or replaces it with a bomb.
  void PayloadAt(const Field& f) {
    const Bombs& bombs = GetBombs();
    switch (r_.Below(4)) {
      case 0: {
        const std::vector<uint8_t>& bomb = r_.OneIn(3)                 ? bombs.zstd_window
                                           : L_->compression == 1      ? bombs.zstd
                                                                       : bombs.deflate;
        std::memcpy(d_ + f.offset, bomb.data(), std::min<size_t>(bomb.size(), f.width));
        break;
      }
      case 1: std::memset(d_ + f.offset, 0, f.width); break;
      case 2:
        for (int i = 0; i < 4; ++i) d_[f.offset + r_.Below(f.width)] ^= static_cast<uint8_t>(1u << r_.Below(8));
        break;
      default: std::memset(d_ + f.offset + f.width / 2, 0xff, f.width - f.width / 2); break;
    }
  }

  // Copies one cluster over another (aliasing, a table where data was).
  void Cluster() {
    const uint64_t cs = L_->cs;
    const uint64_t clusters = size_ / cs;
    if (clusters < 2) return;
    const uint64_t from = r_.Below(clusters) * cs;
    const uint64_t to = r_.OneIn(2) ? r_.Pick(L_->structures) & ~(cs - 1) : r_.Below(clusters) * cs;
    if (to + cs > size_ || from == to) return;
    std::memmove(d_ + to, d_ + from, cs);
  }

  // Truncates (the tables' tail past the end) or grows the file.
  void Resize() {
    const uint64_t cs = L_->cs;
    if (r_.OneIn(2) && size_ > 4096) {
      size_t n = r_.OneIn(2) ? size_ - 1 - r_.Below(std::min<uint64_t>(size_ - 4096, 4 * cs)) : (size_ - 1) & ~(cs - 1);
      if (n >= 512) size_ = n;
      return;
    }
    size_t grow = std::min<size_t>(max_ - size_, 1 + r_.Below(2 * cs));
    std::memset(d_ + size_, r_.OneIn(2) ? 0 : 0xff, grow);
    size_ += grow;
  }

  // Rewrites the backing name, the data file name or the backing format.
  void Names() {
    const std::string& name = r_.Pick(barge::fuzz::Names());
    const uint64_t limit = std::min<uint64_t>(L_->cs, size_);
    if (r_.OneIn(2) && L_->backing_off != 0) {
      const uint64_t at = L_->backing_off;
      if (at >= limit) return;
      const size_t n = std::min<uint64_t>(name.size(), limit - at);
      std::memcpy(d_ + at, name.data(), n);
      Store(d_, 16, 4, n);
      return;
    }
    // Rebuild the extension area with one record replaced, dropped or
    // duplicated.
    struct Record {
      uint32_t type;
      std::string data;
    };
    std::vector<Record> records;
    uint64_t end = limit;
    if (L_->backing_off != 0 && L_->backing_off < end) end = L_->backing_off;
    for (uint64_t off = L_->header_length; off + 8 <= end;) {
      const uint32_t type = static_cast<uint32_t>(Load(std::span<const uint8_t>(d_, size_), off, 4));
      const uint32_t len = static_cast<uint32_t>(Load(std::span<const uint8_t>(d_, size_), off + 4, 4));
      if (type == 0 || len > end - off - 8) break;
      records.push_back({type, std::string(reinterpret_cast<const char*>(d_ + off + 8), len)});
      off += 8 + Align8(len);
    }
    switch (r_.Below(4)) {
      case 0: records.push_back({r_.OneIn(2) ? kExtDataFile : kExtBackingFormat, name}); break;
      case 1:
        if (!records.empty()) records.erase(records.begin() + static_cast<long>(r_.Below(records.size())));
        break;
      case 2:
        if (!records.empty()) records.push_back(records[r_.Below(records.size())]);
        break;
      default:
        for (Record& rec : records) {
          if (rec.type == kExtDataFile || rec.type == kExtBackingFormat) rec.data = name;
        }
        break;
    }
    std::vector<uint8_t> area;
    for (const Record& rec : records) {
      size_t at = area.size();
      area.resize(at + 8 + Align8(rec.data.size()));
      Store(area.data(), at, 4, rec.type);
      Store(area.data(), at + 4, 4, rec.data.size());
      std::memcpy(area.data() + at + 8, rec.data.data(), rec.data.size());
    }
    area.resize(area.size() + 8);  // end marker
    if (L_->header_length + area.size() > end) return;  // does not fit: leave it
    std::memcpy(d_ + L_->header_length, area.data(), area.size());
  }

  uint8_t* d_;
  size_t size_;
  size_t max_;
  Rng& r_;
  const Layout* L_ = nullptr;
};

}  // namespace

std::vector<Field> FindQcow2Fields(std::span<const uint8_t> image) { return Walker(image).Run().fields; }

size_t MutateQcow2(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  // For A/B runs: BARGE_FUZZ_BYTES_ONLY=1 gives libFuzzer's own mutations.
  static const bool bytes_only = std::getenv("BARGE_FUZZ_BYTES_ONLY") != nullptr;
  if (bytes_only) return LLVMFuzzerMutate(data, size, max_size);
  Rng r(seed);
  if (size > max_size) size = max_size;
  return Mutator(data, size, max_size, r).Run();
}

std::vector<std::span<const uint8_t>> SplitFiles(std::span<const uint8_t> input) {
  std::vector<std::span<const uint8_t>> out;
  const auto* m = reinterpret_cast<const uint8_t*>(kFileMarker.data());
  size_t start = 0;
  for (size_t i = 0; i + kFileMarker.size() <= input.size();) {
    if (std::memcmp(input.data() + i, m, kFileMarker.size()) == 0) {
      out.push_back(input.subspan(start, i - start));
      i += kFileMarker.size();
      start = i;
    } else {
      ++i;
    }
  }
  out.push_back(input.subspan(start));
  return out;
}

size_t MutateQcow2Files(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  Rng r(seed);
  std::vector<std::vector<uint8_t>> files;
  for (auto f : SplitFiles(std::span<const uint8_t>(data, size))) files.emplace_back(f.begin(), f.end());
  if (r.OneIn(16) && files.size() < 5) {
    files.push_back(files[r.Below(files.size())]);  // one more layer, a copy
  } else if (r.OneIn(16) && files.size() > 1) {
    files.erase(files.begin() + static_cast<long>(1 + r.Below(files.size() - 1)));
  } else {
    std::vector<uint8_t>& f = files[r.Below(files.size())];
    size_t others = size - f.size();
    if (others >= max_size) return size;
    size_t room = max_size - others;
    size_t old = f.size();
    f.resize(std::max(room, old));
    size_t n = MutateQcow2(f.data(), old, room, static_cast<unsigned int>(r.Next()));
    f.resize(n);
  }
  std::vector<uint8_t> joined;
  for (size_t i = 0; i < files.size(); ++i) {
    if (i) joined.insert(joined.end(), kFileMarker.begin(), kFileMarker.end());
    joined.insert(joined.end(), files[i].begin(), files[i].end());
  }
  if (joined.size() > max_size) return size;
  if (!joined.empty()) std::memcpy(data, joined.data(), joined.size());  // empty: data() may be null
  return joined.size();
}

}  // namespace barge::fuzz
