// Fuzzes the digest table decoder and the chain merge over decoded tables.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "formats/digest_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto t = barge::formats::DecodeDigestTable(bytes);
  if (!t.ok()) return 0;
  if (barge::formats::EncodeDigestTable(*t).size() != size) std::abort();
  const barge::formats::DigestTable* layers[] = {&*t, &*t};
  auto merged = barge::formats::MergeDigestTables(layers);
  if (!merged.ok() || merged->entries != t->entries) std::abort();
  // The version 2 fold costs the entries, whatever the virtual size.
  using barge::formats::ImageDigestAlgorithm;
  (void)barge::formats::ImageDigestOf(*merged, ImageDigestAlgorithm::kZeroRunFold);
  // Bound the version 1 fold: the virtual size may be huge in a fuzzed header.
  if (t->cluster_count() < (1u << 20)) {
    (void)barge::formats::ImageDigestOf(*merged, ImageDigestAlgorithm::kClusterFold);
  }
  return 0;
}
