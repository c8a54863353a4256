// --shard and --shard-count (cli/shard_flag.h).
#include "cli/shard_flag.h"

#include <charconv>
#include <cstdlib>

namespace barge::cli {

namespace orc = barge::orchestrate;

namespace {

// A variable that must hold a decimal number.
Result<std::optional<uint64_t>> Number(const GetEnvFn& getenv, const std::string& name) {
  auto text = getenv(name);
  if (!text) return std::optional<uint64_t>();
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (text->empty() || ec != std::errc() || end != text->data() + text->size()) {
    return Error::InvalidArgument("--shard auto: $" + name + " is '" + *text + "', not a number");
  }
  return std::optional<uint64_t>(value);
}

Result<orc::ShardSpec> Checked(uint64_t index, uint64_t count, const std::string& where) {
  if (count == 0 || count > orc::kMaxShards) {
    return Error::InvalidArgument("--shard auto: the shard count " + std::to_string(count) + " (" + where +
                                  ") is not in 1.." + std::to_string(orc::kMaxShards));
  }
  if (index >= count) {
    return Error::InvalidArgument("--shard auto: the shard index " + std::to_string(index) + " (" + where +
                                  ") is not below the count " + std::to_string(count));
  }
  return orc::ShardSpec{static_cast<uint32_t>(index), static_cast<uint32_t>(count)};
}

}  // namespace

GetEnvFn ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<orc::ShardSpec> ResolveShard(const std::string& shard_flag, uint32_t count_flag, const GetEnvFn& getenv) {
  if (shard_flag.empty()) {
    if (count_flag != 0) return Error::InvalidArgument("--shard-count goes with --shard auto");
    return orc::ShardSpec{};
  }
  if (shard_flag != "auto") {
    auto spec = orc::ParseShard(shard_flag);
    if (!spec.ok()) return Error::InvalidArgument("--shard: " + spec.error().message());
    if (count_flag != 0 && count_flag != spec->count) {
      return Error::InvalidArgument("--shard-count " + std::to_string(count_flag) + " contradicts --shard " +
                                    shard_flag);
    }
    return spec;
  }
  // The count a Kubernetes manifest passes (the Job's completions).
  std::optional<uint64_t> count;
  std::string count_from;
  if (count_flag != 0) {
    count = count_flag;
    count_from = "--shard-count";
  } else {
    BARGE_ASSIGN_OR_RETURN(count, Number(getenv, "BARGE_SHARD_COUNT"));
    count_from = "$BARGE_SHARD_COUNT";
  }
  BARGE_ASSIGN_OR_RETURN(auto k8s_index, Number(getenv, "JOB_COMPLETION_INDEX"));
  if (k8s_index) {
    if (!count) {
      return Error::InvalidArgument(
          "--shard auto: $JOB_COMPLETION_INDEX is set (a Kubernetes Indexed Job) but not the shard count: give "
          "--shard-count N or set $BARGE_SHARD_COUNT (the Job's spec.completions)");
    }
    return Checked(*k8s_index, *count, "$JOB_COMPLETION_INDEX, count from " + count_from);
  }
  BARGE_ASSIGN_OR_RETURN(auto task_id, Number(getenv, "SLURM_ARRAY_TASK_ID"));
  if (task_id) {
    BARGE_ASSIGN_OR_RETURN(auto task_min, Number(getenv, "SLURM_ARRAY_TASK_MIN"));
    BARGE_ASSIGN_OR_RETURN(auto task_step, Number(getenv, "SLURM_ARRAY_TASK_STEP"));
    BARGE_ASSIGN_OR_RETURN(auto task_count, Number(getenv, "SLURM_ARRAY_TASK_COUNT"));
    if (!task_min) {
      return Error::InvalidArgument(
          "--shard auto: $SLURM_ARRAY_TASK_ID is set (a Slurm array task) but not $SLURM_ARRAY_TASK_MIN");
    }
    if (!count) {
      if (!task_count) {
        return Error::InvalidArgument(
            "--shard auto: $SLURM_ARRAY_TASK_ID is set (a Slurm array task) but not $SLURM_ARRAY_TASK_COUNT "
            "(or give --shard-count N)");
      }
      count = task_count;
      count_from = "$SLURM_ARRAY_TASK_COUNT";
    }
    const uint64_t step = task_step && *task_step > 0 ? *task_step : 1;
    if (*task_id < *task_min || (*task_id - *task_min) % step != 0) {
      return Error::InvalidArgument("--shard auto: $SLURM_ARRAY_TASK_ID " + std::to_string(*task_id) +
                                    " is not in the array's range from $SLURM_ARRAY_TASK_MIN " +
                                    std::to_string(*task_min) + " by " + std::to_string(step) +
                                    " (submit the array as one range, e.g. --array=0-" +
                                    std::to_string(*count - 1) + ")");
    }
    return Checked((*task_id - *task_min) / step, *count,
                   "$SLURM_ARRAY_TASK_ID - $SLURM_ARRAY_TASK_MIN, count from " + count_from);
  }
  return Error::InvalidArgument(
      "--shard auto: no shard index in the environment: neither $JOB_COMPLETION_INDEX (a Kubernetes Indexed "
      "Job) nor $SLURM_ARRAY_TASK_ID (a Slurm array task) is set; give --shard I/N");
}

}  // namespace barge::cli
