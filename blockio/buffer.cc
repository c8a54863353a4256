// AlignedBuffer and zero detection.
#include "blockio/buffer.h"

#include <cassert>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace barge {

AlignedBuffer::AlignedBuffer(size_t capacity, size_t alignment)
    : size_(capacity), capacity_(capacity), alignment_(alignment) {
  assert(alignment != 0 && (alignment & (alignment - 1)) == 0);
  if (capacity == 0) return;
  size_t rounded = (capacity + alignment - 1) / alignment * alignment;
  data_ = static_cast<std::byte*>(std::aligned_alloc(alignment, rounded));
  if (data_ == nullptr) throw std::bad_alloc();
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      alignment_(other.alignment_) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    alignment_ = other.alignment_;
  }
  return *this;
}

void AlignedBuffer::resize(size_t size) {
  assert(size <= capacity_);
  size_ = size;
}

void AlignedBuffer::Zero() {
  if (size_ != 0) std::memset(data_, 0, size_);
}

bool IsAllZero(std::span<const std::byte> data) {
  const std::byte* p = data.data();
  size_t n = data.size();
  // Head up to 8-byte alignment, then words, then tail.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    if (*p != std::byte{0}) return false;
    ++p;
    --n;
  }
  const uint64_t* w = reinterpret_cast<const uint64_t*>(p);
  size_t words = n / 8;
  // Check four words per step so the compiler can vectorize the OR.
  size_t i = 0;
  for (; i + 4 <= words; i += 4) {
    if ((w[i] | w[i + 1] | w[i + 2] | w[i + 3]) != 0) return false;
  }
  for (; i < words; ++i) {
    if (w[i] != 0) return false;
  }
  p += words * 8;
  n -= words * 8;
  for (size_t j = 0; j < n; ++j) {
    if (p[j] != std::byte{0}) return false;
  }
  return true;
}

}  // namespace barge
