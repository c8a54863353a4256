// Fuzzes the strong (SHA-256) digest table decoder and the entry
// replacement a digest incremental makes over a decoded table.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "formats/strong_digest_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto t = barge::formats::DecodeStrongDigestTable(bytes);
  if (!t.ok()) return 0;
  if (barge::formats::EncodeStrongDigestTable(*t).size() != size) std::abort();
  auto again = barge::formats::DecodeStrongDigestTable(barge::formats::EncodeStrongDigestTable(*t));
  if (!again.ok() || again->entries != t->entries) std::abort();
  // Replacing every listed cluster by itself gives the table back.
  std::vector<barge::formats::ClusterSpan> spans;
  for (const auto& e : t->entries) spans.push_back({e.cluster_index, e.cluster_index + 1});
  auto same = barge::formats::ReplaceStrongEntries(t->entries, spans, t->entries);
  if (!same.ok() || *same != t->entries) std::abort();
  // Replacing them by nothing (they became zero) empties it.
  auto none = barge::formats::ReplaceStrongEntries(t->entries, spans, {});
  if (!none.ok() || !none->empty()) std::abort();
  for (const auto& e : t->entries) {
    if (!t->Find(e.cluster_index)) std::abort();
  }
  return 0;
}
