// BufferPool: chunks allocated once, handed out from a free list.
#include "pipeline/buffer_pool.h"

#include <cerrno>
#include <new>

namespace barge::pipeline {

uint64_t ChunkFootprintBytes(uint32_t chunk_bytes, bool with_scratch) {
  return uint64_t{chunk_bytes} * (with_scratch ? 2 : 1);
}

Result<std::unique_ptr<BufferPool>> BufferPool::Create(const BufferPoolOptions& options) {
  if (options.cluster_bytes < 512 || (options.cluster_bytes & (options.cluster_bytes - 1)) != 0) {
    return Error::InvalidArgument("cluster size must be a power of two >= 512");
  }
  if (options.chunk_bytes < options.cluster_bytes || options.chunk_bytes % options.cluster_bytes != 0) {
    return Error::InvalidArgument("chunk size must be a multiple of the cluster size");
  }
  if (options.count == 0) return Error::InvalidArgument("buffer pool needs at least one chunk");
  std::unique_ptr<BufferPool> pool(new BufferPool(options));
  try {
    pool->chunks_.reserve(options.count);
    pool->free_.reserve(options.count);
    for (size_t i = 0; i < options.count; ++i) {
      auto chunk = std::make_unique<Chunk>(options.chunk_bytes, options.cluster_bytes, options.with_scratch);
      chunk->pool_slot = i;
      pool->chunks_.push_back(std::move(chunk));
    }
  } catch (const std::bad_alloc&) {
    return Error::IoError("out of memory allocating the buffer pool (" + std::to_string(options.count) +
                          " chunks of " + std::to_string(options.chunk_bytes) + " bytes)")
        .set_errno(ENOMEM);
  }
  // Hand out low slots first (reverse order on a LIFO free list).
  for (size_t i = options.count; i-- > 0;) pool->free_.push_back(pool->chunks_[i].get());
  pool->in_use_.assign(options.count, false);
  return pool;
}

Chunk* BufferPool::TryAcquire() {
  Chunk* chunk;
  {
    std::lock_guard lock(mu_);
    if (free_.empty()) return nullptr;
    chunk = free_.back();
    free_.pop_back();
    in_use_[chunk->pool_slot] = true;
  }
  size_t now = outstanding_.fetch_add(1, std::memory_order_relaxed) + 1;
  size_t high = high_water_.load(std::memory_order_relaxed);
  while (now > high && !high_water_.compare_exchange_weak(high, now, std::memory_order_relaxed)) {
  }
  acquired_total_.fetch_add(1, std::memory_order_relaxed);
  return chunk;
}

void BufferPool::Release(Chunk* chunk) {
  {
    std::lock_guard lock(mu_);
    if (!in_use_[chunk->pool_slot]) return;  // already reclaimed
    in_use_[chunk->pool_slot] = false;
    free_.push_back(chunk);
  }
  outstanding_.fetch_sub(1, std::memory_order_relaxed);
}

size_t BufferPool::ReclaimAll() {
  size_t reclaimed = 0;
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < chunks_.size(); ++i) {
    if (!in_use_[i]) continue;
    in_use_[i] = false;
    free_.push_back(chunks_[i].get());
    ++reclaimed;
  }
  outstanding_.fetch_sub(reclaimed, std::memory_order_relaxed);
  return reclaimed;
}

uint64_t BufferPool::footprint_bytes() const {
  return ChunkFootprintBytes(options_.chunk_bytes, options_.with_scratch) * chunks_.size();
}

}  // namespace barge::pipeline
