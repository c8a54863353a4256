// The campaigns over one scenario: power loss at every durability boundary,
// an error injected once at every filesystem call site, and kill -9 at
// random moments of a real process. Each returns its figure.
#pragma once

#include "tests/reliability/harness.h"
#include "tests/reliability/scenarios.h"

namespace barge::reliability {

Figure PowerLossCampaign(Scenario& scenario, uint64_t seed);
Figure InjectedErrorCampaign(Scenario& scenario, uint64_t seed);
Figure KillCampaign(Scenario& scenario, uint64_t seed);
// The work tree on a small tmpfs that a filler fills (leaving a few
// clusters) when the command opens its first temporary, i.e. after its
// free-space estimate passed; then the filler goes and the recovery runs.
// `skipped` says why when no tmpfs could be mounted (not root, no mount).
Figure FullFilesystemCampaign(Scenario& scenario, uint64_t seed, std::string* skipped);
// Two `barge image sync` processes on one image catalog at once, one of
// them killed at a random moment (or none, every fourth round).
Figure ConcurrentCatalogCampaign(uint64_t seed);

// "" when the failed outcome's error is clear: a non-zero exit, the code
// that `err` maps to, and a file that is one of `user_paths` (or below one)
// and not a temporary; else what is wrong.
std::string JudgeError(const Outcome& o, int err, const std::vector<std::string>& user_paths);

}  // namespace barge::reliability
