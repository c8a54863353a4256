// A policy target's offsite copy (`offsite:`, docs/policies.md "Offsite
// copies", issue 40 §1): after a successful backup of a source to a target
// with an offsite, the source's chain folder(s) are synced there with the
// sync pipeline (pipeline/chain_sync.h: only the points the offsite lacks,
// each verified in both places, committed whole), then the offsite keeps
// its own retention_count newest points of each chain folder.
#pragma once

#include <string>

#include "blockio/env.h"
#include "blockio/error.h"
#include "orchestrate/policy/policy.h"
#include "pipeline/copy.h"

namespace barge::orchestrate {

// The folder under `root` (a target or an offsite) holding `source`'s
// chains: root/<policy>/<source name>, a domain's root/<policy>/<domain>
// (one chain folder per disk inside).
std::string SourceChainsDir(const std::string& root, const Policy& policy, const PolicySource& source);

// Copies `source`'s chains on `offsite.target` to `offsite.location` and
// applies the offsite's retention there (ForgetChainFolder, keep_last
// retention_count). The offsite keeps its own history: points the target
// forgot stay there, and points the offsite forgot are not copied again
// (SyncOptions::newer_only). `copy.cancel` stops it between points.
// Returns: one line for the run's outcome ("2 point(s) copied to
// s3://B/P, verified; 1 removed there"); the sync's errors (kBusy while
// another job writes the offsite chain, kInvalidArgument for a chain of
// another disk there, the store's errors: a missing bucket is kNotFound),
// or the offsite retention's. The runner records them as "offsite
// LOCATION: ERROR" (OffsiteFailureText), the point on the target kept.
// What a run's record says when the offsite copy failed; the metrics
// count the failed records that start with it (IsOffsiteFailure).
std::string OffsiteFailureText(const PolicyOffsite& offsite, const Error& error);
bool IsOffsiteFailure(const std::string& record_error);

Result<std::string> SyncOffsite(Env& env, const Policy& policy, const PolicySource& source,
                                const PolicyOffsite& offsite, const pipeline::CopyOptions& copy);

}  // namespace barge::orchestrate
