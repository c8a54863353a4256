// ForEachCrashPoint: the crash campaign of one operation over a FaultEnv
// (fault_env.h).
#include <optional>

#include "blockio/fault_env.h"

namespace barge {

Result<uint64_t> ForEachCrashPoint(FaultEnv& env, const std::function<Status()>& setup,
                                   const std::function<Status(Env&)>& op,
                                   const std::function<void(const CrashPoint&)>& check) {
  auto run = [&](std::optional<uint64_t> crash_after) -> Result<CrashPoint> {
    BARGE_RETURN_IF_ERROR(setup());
    env.MarkDurable();
    env.ResetCounters();
    if (crash_after) {
      env.CrashAfter(*crash_after);
    } else {
      env.CancelCrash();
    }
    CrashPoint point;
    {
      ScopedDefaultEnv scoped(env);
      point.op_status = op(env);
    }
    point.crashed = env.crashed();
    point.after_boundaries = point.crashed && crash_after ? *crash_after : env.boundaries();
    BARGE_RETURN_IF_ERROR(env.SimulatePowerLoss());
    return point;
  };
  BARGE_ASSIGN_OR_RETURN(CrashPoint clean, run(std::nullopt));
  uint64_t total = clean.after_boundaries;
  clean.boundaries = total;
  check(clean);
  for (uint64_t i = 0; i <= total; ++i) {
    BARGE_ASSIGN_OR_RETURN(CrashPoint point, run(i));
    point.boundaries = total;
    check(point);
  }
  return total + 2;
}

}  // namespace barge
