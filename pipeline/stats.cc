// JobStats.
#include "pipeline/stats.h"

namespace barge::pipeline {

std::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kExtents: return "extents";
    case Stage::kRead: return "read";
    case Stage::kZeroDetect: return "zero-detect";
    case Stage::kHash: return "hash";
    case Stage::kCompress: return "compress";
    case Stage::kWrite: return "write";
    case Stage::kVerify: return "verify";
    case Stage::kSha512: return "sha512";
    case Stage::kCount: break;
  }
  return "unknown";
}

StageSnapshot JobStats::Get(Stage stage) const {
  const StageCounters& c = counters_[static_cast<size_t>(stage)];
  return {c.bytes.load(std::memory_order_relaxed), c.items.load(std::memory_order_relaxed),
          c.busy_ns.load(std::memory_order_relaxed)};
}

}  // namespace barge::pipeline
