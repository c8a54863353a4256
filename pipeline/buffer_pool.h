// A fixed pool of chunks (each owning its aligned buffers): the tokens that
// bound the work in flight of a copy. The pool owns every chunk for its whole
// life, so a cancelled graph that drops messages leaks nothing.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "blockio/error.h"
#include "pipeline/chunk.h"

namespace barge::pipeline {

struct BufferPoolOptions {
  uint32_t chunk_bytes = 1 << 20;
  uint32_t cluster_bytes = 64 << 10;
  bool with_scratch = false;  // room for compressed payloads
  size_t count = 4;
};

// Bytes one chunk of the pool costs (data plus scratch).
uint64_t ChunkFootprintBytes(uint32_t chunk_bytes, bool with_scratch);

// Thread-safe. Acquire/Release are a short critical section on a free list
// (once per chunk, i.e. per MiB, never per cluster).
class BufferPool {
 public:
  // Allocates every chunk up front. kInvalidArgument for a bad geometry,
  // kIoError (errno ENOMEM) when memory is out.
  static Result<std::unique_ptr<BufferPool>> Create(const BufferPoolOptions& options);

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A free chunk, or nullptr when all are in use (never blocks).
  Chunk* TryAcquire();
  // Returns a chunk obtained from TryAcquire.
  void Release(Chunk* chunk);
  // After the graph is idle (wait_for_all returned): takes back every chunk
  // still out, e.g. held by messages a cancelled graph dropped. Returns how
  // many were reclaimed.
  size_t ReclaimAll();

  const BufferPoolOptions& options() const { return options_; }
  size_t capacity() const { return chunks_.size(); }
  // Chunks acquired and not yet released.
  size_t outstanding() const { return outstanding_.load(std::memory_order_relaxed); }
  // Highest outstanding() ever seen.
  size_t high_water() const { return high_water_.load(std::memory_order_relaxed); }
  // Total acquisitions so far.
  uint64_t acquired_total() const { return acquired_total_.load(std::memory_order_relaxed); }
  uint64_t footprint_bytes() const;

 private:
  explicit BufferPool(const BufferPoolOptions& options) : options_(options) {}

  BufferPoolOptions options_;
  std::vector<std::unique_ptr<Chunk>> chunks_;  // owned, fixed after Create
  std::mutex mu_;
  std::vector<Chunk*> free_;  // guarded by mu_
  std::vector<bool> in_use_;  // guarded by mu_; parallel to chunks_
  std::atomic<size_t> outstanding_{0};
  std::atomic<size_t> high_water_{0};
  std::atomic<uint64_t> acquired_total_{0};
};

}  // namespace barge::pipeline
