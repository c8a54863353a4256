// Fuzzes the state-migration journal parser (the journal sits in the target
// folder, so a damaged or planted one is untrusted input): any text gives a
// list of records, never an exception or a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "orchestrate/state_migrate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto records = barge::orchestrate::ParseMigrateJournal(text);
  for (const auto& r : records) (void)barge::orchestrate::MigrateStepName(r.step);
  return 0;
}
