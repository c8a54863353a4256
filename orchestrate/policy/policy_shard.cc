// Rendezvous hashing of a policy's sources over shards
// (orchestrate/policy/policy_shard.h).
#include "orchestrate/policy/policy_shard.h"

#include <xxhash.h>

#include <charconv>

namespace barge::orchestrate {

namespace {

// A decimal number without sign, spaces or leading '+'; nullopt otherwise.
std::optional<uint64_t> Decimal(std::string_view text) {
  if (text.empty() || text.size() > 10) return std::nullopt;
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

std::string ShardSpec::ToString() const {
  if (!sharded()) return "";
  return std::to_string(index) + "/" + std::to_string(count);
}

Result<ShardSpec> ParseShard(std::string_view text) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) {
    return Error::InvalidArgument("'" + std::string(text) + "' is not I/N (shard I of N, 0-based, e.g. 0/4)");
  }
  auto index = Decimal(text.substr(0, slash));
  auto count = Decimal(text.substr(slash + 1));
  if (!index || !count) {
    return Error::InvalidArgument("'" + std::string(text) + "' is not I/N (two decimal numbers, e.g. 0/4)");
  }
  if (*count == 0 || *count > kMaxShards) {
    return Error::InvalidArgument("'" + std::string(text) + "': the shard count must be 1.." +
                                  std::to_string(kMaxShards));
  }
  if (*index >= *count) {
    return Error::InvalidArgument("'" + std::string(text) + "': the shard index is 0-based and must be below " +
                                  std::to_string(*count));
  }
  return ShardSpec{static_cast<uint32_t>(*index), static_cast<uint32_t>(*count)};
}

uint64_t ShardWeight(std::string_view source_name, uint32_t index) {
  std::string key(source_name);
  key.push_back('\0');
  key += std::to_string(index);
  return XXH3_64bits(key.data(), key.size());
}

uint32_t ShardOfSource(std::string_view source_name, uint32_t count) {
  uint32_t best = 0;
  uint64_t best_weight = 0;
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t w = ShardWeight(source_name, i);
    if (i == 0 || w > best_weight) {
      best = i;
      best_weight = w;
    }
  }
  return best;
}

bool InShard(const ShardSpec& shard, std::string_view source_name) {
  return !shard.sharded() || ShardOfSource(source_name, shard.count) == shard.index;
}

std::vector<std::string> ShardSources(const Policy& policy, const ShardSpec& shard) {
  std::vector<std::string> out;
  for (const auto& s : policy.sources) {
    if (InShard(shard, s.name)) out.push_back(s.name);
  }
  return out;
}

}  // namespace barge::orchestrate
