// Fuzzes the policy parser (YAML through yaml-cpp, then validation): any
// input gives a policy or an Error, never a crash or an escaped exception;
// a policy has the fields validation promises (offsites included).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "blockio/env.h"
#include "orchestrate/policy/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto p = barge::orchestrate::ParsePolicy(barge::PosixEnv(), text, "fuzz");
  if (!p.ok()) return 0;
  if (p->name.empty() || p->sources.empty() || p->targets.empty() || p->retention_count < 1 ||
      p->max_parallel < 1 || p->max_parallel > 64) {
    std::abort();
  }
  // Every offsite belongs to a target, is none of them, and keeps >= 1.
  for (const auto& o : p->offsites) {
    if (o.location.empty() || o.retention_count < 1 || !p->OffsiteOf(o.target) ||
        std::find(p->targets.begin(), p->targets.end(), o.location) != p->targets.end()) {
      std::abort();
    }
  }
  (void)barge::orchestrate::NextRunTimes(*p, std::chrono::sys_seconds{std::chrono::seconds{1798761599}}, 5);
  return 0;
}
