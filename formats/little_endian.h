// Little-endian fields of barge's own binary files (digest tables): the
// low byte first, `bytes` of them (1 to 8).
#pragma once

#include <cstddef>
#include <cstdint>

namespace barge::formats {

inline void PutLe(std::byte* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = std::byte(v >> (8 * i));
}

inline uint64_t GetLe(const std::byte* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | uint64_t(p[i]);
  return v;
}

}  // namespace barge::formats
