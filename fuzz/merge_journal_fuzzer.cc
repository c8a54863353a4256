// Fuzzes the merge journal decoder (the journal sits in the chain folder and
// names files to rename and delete): any input gives a journal or an Error,
// every name in a decoded journal is a plain file name of the expected kind,
// and a decoded journal survives an encode/decode round trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "pipeline/merge_journal.h"

namespace {

bool Plain(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge::pipeline;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = DecodeMergeJournal(text);
  if (!j.ok()) return 0;
  for (const auto& r : j->renames) {
    if (!Plain(r.from) || !Plain(r.to) || r.from != MergeStagedName(r.to)) std::abort();
  }
  for (const auto& name : j->remove) {
    if (!Plain(name)) std::abort();
  }
  // Text the parser accepted is UTF-8, so it always encodes again.
  auto encoded = EncodeMergeJournal(*j);
  if (!encoded.ok()) std::abort();
  auto again = DecodeMergeJournal(*encoded);
  if (!again.ok() || again->through != j->through || again->renames.size() != j->renames.size() ||
      again->remove != j->remove) {
    std::abort();
  }
  return 0;
}
