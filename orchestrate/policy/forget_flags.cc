#include "orchestrate/policy/forget_flags.h"

#include <string>

#include "orchestrate/schedule/time_text.h"

namespace barge::orchestrate {

Result<ForgetPolicy> CheckForgetFlags(std::string_view policy_file, std::string_view chain_dir, bool has_sources,
                                      std::string_view keep_within, ForgetPolicy keep) {
  if (policy_file.empty() == chain_dir.empty()) {
    return Error::InvalidArgument("give a chain folder or --policy FILE (one of them)");
  }
  if (!chain_dir.empty() && has_sources) return Error::InvalidArgument("--source goes with --policy, not a chain folder");
  if (!keep_within.empty()) {
    auto d = ParseDuration(keep_within);
    if (!d.ok()) return Error::InvalidArgument("--keep-within: " + d.error().message());
    keep.keep_within = *d;
  }
  if (keep.empty()) {
    return Error::InvalidArgument(
        "give at least one keep rule: --keep-last, --keep-hourly, --keep-daily, --keep-weekly, "
        "--keep-monthly, --keep-yearly above 0, or --keep-within (none would forget every point)");
  }
  return keep;
}

}  // namespace barge::orchestrate
