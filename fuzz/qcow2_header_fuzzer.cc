// libFuzzer target: qcow2 header and header-extension parsing.
#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/qcow2_header.h"
#include "fuzz/qcow2_mutator.h"

// Structure-aware: edits header fields, L1/L2, refcount, bitmap and
// snapshot entries of the (valid) seed images; see qcow2_mutator.h.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return barge::fuzz::MutateQcow2(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  // Pretend the file is the input or much larger (offsets past the input).
  auto small = barge::formats::qcow2::ParseHeader(bytes, size);
  auto large = barge::formats::qcow2::ParseHeader(bytes, uint64_t{1} << 40);
  (void)small.ok();
  (void)large.ok();
  return 0;
}
