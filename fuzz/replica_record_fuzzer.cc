// Fuzzes the replica checksum record decoder (PATH.sha512.json sits beside
// each copy on a disk, where anyone with access to the disk can change it;
// the image catalog's rescan trusts what it decodes): any input gives a
// record or an Error, never an exception.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "pipeline/replicate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)barge::pipeline::DecodeReplicaRecord(text).ok();
  return 0;
}
