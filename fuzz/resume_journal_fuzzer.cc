// Fuzzes the backup resume journal decoder (the journal sits in the chain
// folder beside a staged image, so a damaged or planted one is untrusted
// input): any input gives a journal or an Error, and the entries of a
// decoded journal are either refused by the writer's replay (PlanStored)
// or laid out below the image end it computes, compressed payloads within
// a cluster, as CheckStaged reads them back.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "formats/qcow2_writer.h"
#include "pipeline/backup_resume.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto journal = pipeline::DecodeResumeJournal(text, "fuzz");
  if (!journal.ok()) return 0;
  // Replay the entries as a resume would, in a small image (the key's own
  // sizes are untrusted too; a resume compares them with the backup's).
  formats::Qcow2WriterOptions options;
  options.virtual_size = 64ull << 20;
  options.cluster_bits = 16;
  options.compression = formats::Compression::kZstd;
  std::vector<formats::StoredCluster> stored;
  for (const auto& e : journal->entries) stored.push_back(e.stored);
  auto layout = formats::Qcow2Writer::PlanStored(options, stored);
  if (!layout.ok()) return 0;
  if (layout->host_offsets.size() != stored.size()) std::abort();
  const uint64_t cs = uint64_t{1} << options.cluster_bits;
  for (size_t i = 0; i < stored.size(); ++i) {
    const auto& c = stored[i];
    if (c.kind == formats::StoredKind::kCompressed && (c.payload_bytes == 0 || c.payload_bytes > cs)) std::abort();
    if (c.kind != formats::StoredKind::kZero && layout->host_offsets[i] + (c.payload_bytes ? c.payload_bytes : cs) >
                                                    layout->end_bytes) {
      std::abort();
    }
  }
  return 0;
}
