// libFuzzer target: OpenImage over a backing chain held in one input. The
// input is several files joined by kFileMarker (qcow2_mutator.h): file 0 is
// /fuzz/top.qcow2, file i is /fuzz/layer<i>. Backing and data-file names
// stored in the images go through barge's path policy (json:/protocol
// names, folder confinement, cycles, depth), then the chain is mapped and
// read. Any name outside /fuzz is refused by the opener as well, so a name
// that slips through the policy shows as NotFound, never as a host file.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "blockio/memory.h"
#include "formats/image.h"
#include "fuzz/qcow2_mutator.h"

namespace {

constexpr uint64_t kMaxGuestBytes = 1ull << 20;  // work bound: huge virtual sizes are common
constexpr uint64_t kChunk = 64 * 1024;

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return barge::fuzz::MutateQcow2Files(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge;
  using namespace barge::formats;
  const auto parts = barge::fuzz::SplitFiles(std::span<const uint8_t>(data, size));
  std::vector<std::vector<std::byte>> files;
  for (auto p : parts) {
    const auto* b = reinterpret_cast<const std::byte*>(p.data());
    files.emplace_back(b, b + p.size());
  }
  auto name_of = [](size_t i) { return i == 0 ? std::string("/fuzz/top.qcow2") : "/fuzz/layer" + std::to_string(i); };
  SourceOpener opener = [&](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    if (path.rfind("/fuzz/", 0) != 0) std::abort();  // the policy let a name out of the folder
    for (size_t i = 0; i < files.size(); ++i) {
      if (path == name_of(i)) return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(files[i], path));
    }
    return Error::NotFound("fuzz: no such file").set_path(path);
  };
  OpenOptions options;
  options.format = ImageFormat::kQcow2;
  options.max_chain_depth = 8;
  auto image = OpenImage(name_of(0), opener, options);
  if (!image.ok()) return 0;
  Image& img = **image;
  const uint64_t limit = std::min(img.size_bytes(), kMaxGuestBytes);
  (void)img.Map(0, limit).ok();
  std::vector<std::byte> buf(kChunk);
  for (uint64_t off = 0; off < limit; off += kChunk) {
    uint64_t n = std::min(kChunk, limit - off);
    if (!img.ReadAt(off, std::span(buf).first(n)).ok()) break;
  }
  return 0;
}
