#include "pipeline/disk_generator.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "formats/units.h"
#include "pipeline/copy.h"

namespace barge::pipeline {
namespace {

constexpr uint64_t kAlign = 4096;
constexpr uint64_t kPiece = 1 << 20;  // data is generated per piece, each from its own seed

// splitmix64: seeds and layout decisions. Defined by its arithmetic, so the
// same on every platform (std:: distributions are not).
uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// xoshiro256**: the random bytes.
struct Xoshiro {
  uint64_t s[4];
  explicit Xoshiro(uint64_t seed) {
    for (auto& w : s) w = SplitMix(seed);
  }
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t Next() {
    uint64_t result = Rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = Rotl(s[3], 45);
    return result;
  }
};

uint64_t PieceSeed(uint64_t seed, uint64_t extent, uint64_t piece) {
  uint64_t s = seed ^ (extent * 0xD1B54A32D192ED03ull) ^ (piece * 0xABC98388FB8FAC03ull);
  return SplitMix(s);
}

// A fixed vocabulary of pseudo-words per seed; words are drawn with a skew
// towards the first ones (as in real text), with numbers and line breaks,
// so zstd finds text-like redundancy (about 3x at level 3) but not runs.
class TextSource {
 public:
  explicit TextSource(uint64_t seed) {
    uint64_t s = seed ^ 0x7E47ull;
    words_.reserve(kWords);
    for (size_t i = 0; i < kWords; ++i) {
      uint64_t r = SplitMix(s);
      size_t len = 2 + r % 9;
      std::string w;
      for (size_t j = 0; j < len; ++j) {
        r = (j % 8 == 7) ? SplitMix(s) : r >> 5;
        w.push_back(static_cast<char>('a' + (r & 31) % 26));
      }
      words_.push_back(std::move(w));
    }
  }
  void Fill(std::byte* out, size_t n, uint64_t piece_seed) const {
    Xoshiro rng(piece_seed);
    size_t pos = 0;
    unsigned on_line = 0;
    while (pos < n) {
      uint64_t r = rng.Next();
      std::string_view piece;
      char number[24];
      if ((r & 15) == 0) {
        int len = std::snprintf(number, sizeof number, "%llu", static_cast<unsigned long long>((r >> 8) % 100000000));
        piece = std::string_view(number, static_cast<size_t>(len));
      } else {
        // Skewed index: the product of two uniforms favours small indices.
        uint64_t a = (r >> 8) % kWords, b = (r >> 24) % kWords;
        piece = words_[(a * b) / kWords];
      }
      for (char c : piece) {
        if (pos == n) return;
        out[pos++] = static_cast<std::byte>(c);
      }
      if (pos == n) return;
      if (++on_line >= 8 + ((r >> 40) & 7)) {
        out[pos++] = std::byte{'\n'};
        on_line = 0;
      } else {
        out[pos++] = std::byte{' '};
      }
    }
  }

 private:
  static constexpr size_t kWords = 4096;
  std::vector<std::string> words_;
};

struct PlannedExtent {
  uint64_t offset;
  uint64_t length;
  ExtentKind kind;
};

// Calls `fn` for each extent of the layout, in order.
void Layout(const DiskGeneratorOptions& o, const std::function<void(const PlannedExtent&)>& fn) {
  const uint64_t size = o.size_bytes / kAlign * kAlign;
  uint64_t state = o.seed ^ 0x1A70u;
  uint32_t total_weight = 0;
  for (uint32_t w : o.weights) total_weight += w;
  if (total_weight == 0) total_weight = 1;
  const double lo = std::log2(static_cast<double>(std::max(o.min_extent_bytes, kAlign)));
  // Extents of at most 1/16 of the disk, so a small disk is a mix too (a
  // 4 MiB disk used to be one hole); from 1 GiB up this is max_extent_bytes.
  const uint64_t max_extent = std::min(o.max_extent_bytes, std::max(size / 16, kAlign));
  const double hi = std::log2(static_cast<double>(std::max(max_extent, o.min_extent_bytes)));
  uint64_t pos = 0;
  while (pos < size) {
    uint64_t r = SplitMix(state);
    uint32_t pick = static_cast<uint32_t>(r % total_weight);
    size_t kind = 0;
    while (kind + 1 < o.weights.size() && pick >= o.weights[kind]) pick -= o.weights[kind++];
    // Log-uniform length from 53 random bits (exact double arithmetic).
    double u = static_cast<double>(SplitMix(state) >> 11) * 0x1.0p-53;
    uint64_t len = static_cast<uint64_t>(std::exp2(lo + u * (hi - lo)));
    len = std::max(kAlign, len / kAlign * kAlign);
    len = std::min(len, size - pos);
    fn({pos, len, static_cast<ExtentKind>(kind)});
    pos += len;
  }
}

}  // namespace

std::string_view ExtentKindName(ExtentKind kind) {
  switch (kind) {
    case ExtentKind::kHole: return "hole";
    case ExtentKind::kZero: return "zero";
    case ExtentKind::kText: return "text";
    case ExtentKind::kRandom: return "random";
    case ExtentKind::kCount: break;
  }
  return "?";
}

uint64_t DiskMix::extent_count() const {
  uint64_t n = 0;
  for (uint64_t e : extents) n += e;
  return n;
}

uint64_t DiskMix::allocated_bytes() const {
  return size_bytes - bytes[static_cast<size_t>(ExtentKind::kHole)];
}

double DiskMix::percent(ExtentKind kind) const {
  return size_bytes == 0 ? 0.0 : 100.0 * static_cast<double>(bytes[static_cast<size_t>(kind)]) / static_cast<double>(size_bytes);
}

Status CheckGeneratedDiskSize(uint64_t size_bytes) {
  if (size_bytes < kMinGeneratedDiskBytes) {
    return Error::InvalidArgument("the generated disk must be at least " + formats::HumanBytes(kMinGeneratedDiskBytes) +
                                  " (room for a mix of holes, zeros, text and random data), not " +
                                  formats::HumanBytesExact(size_bytes));
  }
  if (size_bytes % kGeneratedDiskUnitBytes != 0) {
    return Error::InvalidArgument("the generated disk's size must be a multiple of 4 KiB (its extent unit), not " +
                                  formats::HumanBytesExact(size_bytes) + "; e.g. " +
                                  formats::HumanBytesExact(size_bytes / kGeneratedDiskUnitBytes * kGeneratedDiskUnitBytes));
  }
  return OkStatus();
}

DiskMix PlanDisk(const DiskGeneratorOptions& options) {
  DiskMix mix;
  mix.size_bytes = options.size_bytes / kAlign * kAlign;
  mix.seed = options.seed;
  Layout(options, [&](const PlannedExtent& e) {
    mix.bytes[static_cast<size_t>(e.kind)] += e.length;
    mix.extents[static_cast<size_t>(e.kind)] += 1;
  });
  return mix;
}

Result<DiskMix> GenerateDisk(Env& env, const std::string& path, const DiskGeneratorOptions& options) {
  BARGE_RETURN_IF_ERROR(CheckGeneratedDiskSize(options.size_bytes));
  // Plain buffered writes: the disk stays in the page cache for whoever
  // reads it next (a warm bench run), as a shell's dd would leave it.
  FileOptions o;
  o.write_behind = false;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink, env.OpenSink(path, SinkMode::kTruncate, o));

  DiskMix mix;
  mix.size_bytes = options.size_bytes / kAlign * kAlign;
  mix.seed = options.seed;
  TextSource text(options.seed);
  std::vector<std::byte> buffer(kPiece);
  std::vector<std::byte> zeros(kPiece);
  Status failed;
  uint64_t index = 0;

  auto write_all = [&](const std::byte* data, uint64_t len, uint64_t offset) -> Status {
    return sink->WriteAt(offset, std::span(data, len));
  };

  Layout(options, [&](const PlannedExtent& e) {
    const uint64_t extent_index = index++;
    mix.bytes[static_cast<size_t>(e.kind)] += e.length;
    mix.extents[static_cast<size_t>(e.kind)] += 1;
    if (!failed.ok() || e.kind == ExtentKind::kHole) return;
    for (uint64_t done = 0, piece = 0; done < e.length && failed.ok(); done += kPiece, ++piece) {
      const uint64_t n = std::min(kPiece, e.length - done);
      const std::byte* src = zeros.data();
      if (e.kind == ExtentKind::kText) {
        text.Fill(buffer.data(), n, PieceSeed(options.seed, extent_index, piece));
        src = buffer.data();
      } else if (e.kind == ExtentKind::kRandom) {
        Xoshiro rng(PieceSeed(options.seed, extent_index, piece));
        for (uint64_t i = 0; i < n; i += 8) {
          uint64_t v = rng.Next();
          std::memcpy(buffer.data() + i, &v, std::min<uint64_t>(8, n - i));
        }
        src = buffer.data();
      }
      failed = CheckCancel(options.cancel, "generating the disk was interrupted", path);
      if (!failed.ok()) break;
      failed = write_all(src, n, e.offset + done);
    }
  });
  if (!failed.ok()) return std::move(failed).error();
  BARGE_RETURN_IF_ERROR(sink->Truncate(mix.size_bytes));
  BARGE_RETURN_IF_ERROR(sink->Flush());
  return mix;
}

}  // namespace barge::pipeline
