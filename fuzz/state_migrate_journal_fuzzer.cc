// Fuzzes the state-migration journal parser (the journal sits in the target
// folder, so a damaged or planted one is untrusted input): any text gives a
// list of records or an Error, never an exception or a crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "orchestrate/state/state_migrate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  using namespace barge::orchestrate;
  auto records = ParseMigrateJournal(text);
  if (!records.ok()) return 0;
  // Only what a migration writes comes back: steps 1, 2, 3... from a first
  // record naming both folders.
  for (size_t i = 0; i < records->size(); ++i) {
    if (static_cast<size_t>((*records)[i].step) != i + 1 || MigrateStepName((*records)[i].step) == "?") {
      std::abort();
    }
  }
  if (!records->empty() && ((*records)[0].from.empty() || (*records)[0].to.empty())) std::abort();
  return 0;
}
