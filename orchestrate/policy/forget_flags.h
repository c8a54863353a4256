// barge forget's flags, checked before anything is read: one of a chain
// folder or a policy, --source only with a policy, --keep-within a
// duration, and at least one keep rule (docs/policies.md, "forget").
#pragma once

#include <string_view>

#include "blockio/error.h"
#include "orchestrate/policy/policy_decisions.h"

namespace barge::orchestrate {

// The keep rules of `keep` with --keep-within (`keep_within`, "" when not
// given) parsed into it.
// Returns kInvalidArgument, with the text the cli prints as its usage
// error, when both or neither of `policy_file` and `chain_dir` are given;
// when `has_sources` goes with a chain folder; when `keep_within` is not a
// duration ("--keep-within: ..."); when no rule keeps anything (that would
// forget every point).
Result<ForgetPolicy> CheckForgetFlags(std::string_view policy_file, std::string_view chain_dir, bool has_sources,
                                      std::string_view keep_within, ForgetPolicy keep);

}  // namespace barge::orchestrate
