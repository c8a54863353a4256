#include "orchestrate/policy/policy_worker.h"

#include "orchestrate/catalog/catalog_path.h"

namespace barge::orchestrate {

Result<std::string> RecordsCatalogPath(Env& env, const std::string& flag, const std::string& policy,
                                       const ShardSpec& shard) {
  if (!flag.empty()) {
    auto st = env.Stat(flag);
    if (st.ok() && st->is_directory()) {
      std::string dir = flag;
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      return dir + "/" + policy + (shard.sharded() ? ".shard-" + std::to_string(shard.index) : "") + ".db";
    }
  }
  return CatalogPathFromFlag(env, flag);
}

Status CheckSourcesInShard(const std::vector<std::string>& sources, const ShardSpec& shard,
                           const std::string& policy_file) {
  for (const auto& name : sources) {
    if (InShard(shard, name)) continue;
    return Error::InvalidArgument("source '" + name + "' falls to shard " +
                                  std::to_string(ShardOfSource(name, shard.count)) + "/" +
                                  std::to_string(shard.count) + ", not to this worker's " + shard.ToString() +
                                  " (barge policy shards " + policy_file + " --shards " +
                                  std::to_string(shard.count) + ")");
  }
  return OkStatus();
}

}  // namespace barge::orchestrate
