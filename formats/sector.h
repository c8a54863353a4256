// The 512-byte sector: the unit a disk's size comes in (qemu gives a raw
// file whole sectors, and a qcow2 header's size is kept to them) and the
// unit a compressed qcow2 cluster's stored length is counted in.
#pragma once

#include <cstdint>

namespace barge::formats {

inline constexpr uint32_t kSectorBytes = 512;

// `bytes` rounded up to whole sectors (a raw file's disk size, as qemu
// gives it). The caller keeps `bytes` at most UINT64_MAX - 511.
inline constexpr uint64_t RoundUpToSector(uint64_t bytes) {
  return (bytes + kSectorBytes - 1) & ~uint64_t{kSectorBytes - 1};
}
static_assert(RoundUpToSector(0) == 0 && RoundUpToSector(24) == 512 && RoundUpToSector(512) == 512);

}  // namespace barge::formats
