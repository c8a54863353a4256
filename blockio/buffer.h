// The one aligned buffer type of the data plane. Alignment comes from the
// source or sink that will use it (O_DIRECT needs 512 or 4096).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace barge {

inline constexpr size_t kDefaultBufferAlignment = 4096;

// Owns `capacity` bytes aligned to `alignment`, with a logical size <= capacity.
// Move-only. Not thread-safe; hand it between threads, don't share it.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates; throws std::bad_alloc like any container when memory is out.
  explicit AlignedBuffer(size_t capacity, size_t alignment = kDefaultBufferAlignment);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t alignment() const { return alignment_; }
  // Sets the logical size; must not exceed capacity().
  void resize(size_t size);

  std::span<std::byte> span() { return {data_, size_}; }
  std::span<const std::byte> span() const { return {data_, size_}; }
  std::span<std::byte> subspan(size_t offset, size_t length) { return span().subspan(offset, length); }

  // Zero-fills [0, size()).
  void Zero();

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  size_t alignment_ = kDefaultBufferAlignment;
};

// True when every byte of `data` is zero. Fast path for 8-byte words.
bool IsAllZero(std::span<const std::byte> data);

}  // namespace barge
