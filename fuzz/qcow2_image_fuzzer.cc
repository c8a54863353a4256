// libFuzzer target: OpenImage over the input bytes (other files refused),
// then Map, bounded reads of the guest view, and every bitmap's dirty ranges.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "blockio/memory.h"
#include "formats/image.h"
#include "formats/qcow2_bitmap.h"
#include "fuzz/qcow2_mutator.h"

namespace {

constexpr uint64_t kMaxGuestBytes = 4ull << 20;  // work bound: huge virtual sizes are common
constexpr uint64_t kChunk = 256 * 1024;

}  // namespace

// Structure-aware: edits header fields, L1/L2, refcount, bitmap and
// snapshot entries of the (valid) seed images; see qcow2_mutator.h.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return barge::fuzz::MutateQcow2(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge;
  using namespace barge::formats;
  const std::byte* p = reinterpret_cast<const std::byte*>(data);
  const std::string top_path = "/fuzz/top.qcow2";
  std::vector<std::byte> bytes(p, p + size);
  // The input is the only file: backing files and data files are refused.
  SourceOpener opener = [&](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    if (path != top_path) return Error::NotFound("fuzz: no other files");
    return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(bytes, path));
  };
  OpenOptions options;
  options.format = ImageFormat::kQcow2;
  options.open_data_file = false;
  auto image = OpenImage(top_path, opener, options);
  if (!image.ok()) return 0;
  Image& img = **image;
  const uint64_t limit = std::min(img.size_bytes(), kMaxGuestBytes);
  auto map = img.Map(0, limit);
  (void)map.ok();
  std::vector<std::byte> buf(kChunk);
  for (uint64_t off = 0; off < limit; off += kChunk) {
    uint64_t n = std::min(kChunk, limit - off);
    if (!img.ReadAt(off, std::span(buf).first(n)).ok()) break;
  }
  // Unbounded: the library bounds the work by the file's size.
  for (const BitmapInfo& b : img.info().bitmaps) (void)ReadBitmapDirtyRanges(img, b.name).ok();
  return 0;
}
