// Which sources of a policy a worker of a sharded run backs up (`barge run
// --policy P --shard I/N`; docs/policies.md, "Sharded runs"). The
// assignment is rendezvous (highest-random-weight) hashing over the
// source's name: a pure function of the name, the index and the count, so
// every worker computes the same split without talking to the others, and
// going from N to N+1 shards moves only the sources that the new shard
// wins (about 1/(N+1) of them); none moves between the old shards.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/error.h"
#include "orchestrate/policy/policy.h"

namespace barge::orchestrate {

// Shard `index` of `count` (0 <= index < count). count 0 = not sharded.
struct ShardSpec {
  uint32_t index = 0;
  uint32_t count = 0;

  bool sharded() const { return count > 0; }
  // "I/N", or "" when not sharded.
  std::string ToString() const;
  bool operator==(const ShardSpec&) const = default;
};

// The most shards a policy can be split into.
inline constexpr uint32_t kMaxShards = 100000;

// "I/N" with decimal I and N, 0 <= I < N <= kMaxShards. kInvalidArgument
// saying what is wrong otherwise ("auto" is the cli's business).
Result<ShardSpec> ParseShard(std::string_view text);

// The weight of `source_name` for shard `index`: XXH3-64 (seed 0) of the
// name's bytes, one NUL byte, and the index in decimal. Fixed: the
// assignment of every source follows from it (docs/policies.md).
uint64_t ShardWeight(std::string_view source_name, uint32_t index);

// The shard of `count` that backs up `source_name`: the index with the
// highest weight (the lower index on a tie). count must be > 0.
uint32_t ShardOfSource(std::string_view source_name, uint32_t count);

// Whether `shard` backs up `source_name` (always, when not sharded).
bool InShard(const ShardSpec& shard, std::string_view source_name);

// The names of the policy's sources that fall to `shard`, in file order.
std::vector<std::string> ShardSources(const Policy& policy, const ShardSpec& shard);

}  // namespace barge::orchestrate
