// libFuzzer target: the qcow2 structural checker over the input bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "blockio/memory.h"
#include "formats/qcow2_check.h"
#include "fuzz/qcow2_mutator.h"

// Structure-aware: edits header fields, L1/L2, refcount, bitmap and
// snapshot entries of the (valid) seed images; see qcow2_mutator.h.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return barge::fuzz::MutateQcow2(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::byte* p = reinterpret_cast<const std::byte*>(data);
  barge::MemorySource source(std::vector<std::byte>(p, p + size), "fuzz.qcow2");
  // The default scan budget (four times the file plus 256 MiB) is what
  // bounds the work; each table is read once.
  auto report = barge::formats::qcow2::CheckQcow2(source);
  (void)report.ok();
  return 0;
}
