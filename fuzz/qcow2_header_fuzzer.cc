// libFuzzer target: qcow2 header and header-extension parsing.
#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/qcow2_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  // Pretend the file is the input or much larger (offsets past the input).
  auto small = barge::formats::qcow2::ParseHeader(bytes, size);
  auto large = barge::formats::qcow2::ParseHeader(bytes, uint64_t{1} << 40);
  (void)small.ok();
  (void)large.ok();
  return 0;
}
