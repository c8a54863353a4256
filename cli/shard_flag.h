// `--shard I/N | auto` and `--shard-count N` of `barge run`: which shard of a
// sharded policy run this worker is (docs/policies.md, "Sharded runs").
// `auto` reads the scheduler's environment here, in the cli, and nowhere
// else: a Kubernetes Indexed Job's JOB_COMPLETION_INDEX (the count from
// --shard-count or BARGE_SHARD_COUNT, which the manifest sets from the Job's
// completions: Kubernetes exports no count), or a Slurm array task's
// SLURM_ARRAY_TASK_ID, _MIN, _STEP and _COUNT.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "blockio/error.h"
#include "orchestrate/policy/policy_shard.h"

namespace barge::cli {

// Reads one environment variable; nullopt when it is not set.
using GetEnvFn = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (std::getenv).
GetEnvFn ProcessEnv();

// The shard of `shard_flag` ("" = not sharded; "I/N"; "auto") with
// `count_flag` (0 = not given). kInvalidArgument (a usage error) saying
// what is wrong or missing: a bad I/N, --shard-count without --shard or
// contradicting N, `auto` without a scheduler's index in the environment,
// a Slurm array that is not one range (index beyond the count).
Result<orchestrate::ShardSpec> ResolveShard(const std::string& shard_flag, uint32_t count_flag,
                                            const GetEnvFn& getenv);

}  // namespace barge::cli
