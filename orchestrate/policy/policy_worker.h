// One `barge run` worker of a policy: where it keeps its records and
// which of the sources asked for (--source) it may back up (its shard's).
#pragma once

#include <string>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/policy/policy_shard.h"

namespace barge::orchestrate {

// Where `barge run` keeps its records: --catalog `flag` as every command
// reads it (CatalogPathFromFlag), except that a flag naming a folder is a
// records folder, one catalog file per policy and shard in it:
// FOLDER/<policy>.db, FOLDER/<policy>.shard-I.db for shard I (of any
// count). Workers of one policy on different machines give one folder on a
// shared volume; `runs list --catalog FOLDER` reads every file in it as one
// table (docs/policies.md, "Sharded runs").
// Returns CatalogPathFromFlag's errors (an explicit --catalog in a missing
// folder is one: not a new catalog somewhere else).
Result<std::string> RecordsCatalogPath(Env& env, const std::string& flag, const std::string& policy,
                                       const ShardSpec& shard);

// Every source of `sources` falls to `shard` (any does when not sharded).
// kInvalidArgument otherwise, naming the first source's shard and the
// command that lists them (`barge policy shards POLICY_FILE --shards N`).
Status CheckSourcesInShard(const std::vector<std::string>& sources, const ShardSpec& shard,
                           const std::string& policy_file);

}  // namespace barge::orchestrate
