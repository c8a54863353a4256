// Fuzzes the one resume mechanism's decision (pipeline/resume.h) over a
// journal read from untrusted bytes (a damaged or planted journal at a
// job's site): the bytes decode or not, the key is compared with the job's
// and the kept data (a small raw copy in memory, all zeros) is
// verified against the entries as given. Any input gives a decision, never
// a crash; a resume keeps a non-empty prefix of entries that exist, cut
// below its next cluster, and a refusal or mismatch never reads the data.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "blockio/memory.h"
#include "pipeline/resume.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace barge;
  using namespace barge::pipeline;
  if (size == 0) return 0;
  // The first byte picks the job's terms; the rest is the journal.
  const uint8_t mode = data[0];
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  Result<LoadedJournal> loaded = DecodeResumeJournal(text, "fuzz");

  constexpr uint64_t kSize = 1 << 20;
  constexpr uint32_t kCluster = 65536;
  ResumeTerms terms;
  if (mode & 1) terms.refused = "resuming is off";
  // Either the journal's own key (the same job) or a fixed one.
  if (mode & 2) {
    terms.expected = [](const ResumeKey& staged) { return staged; };
  } else {
    terms.expected = [](const ResumeKey& staged) {
      ResumeKey k = staged;
      k.tool_version += "+other";
      return k;
    };
  }
  bool read = false;
  StagedRaw kept(
      "the staged copy",
      [&read]() -> Result<std::unique_ptr<BlockSource>> {
        read = true;
        std::vector<std::byte> bytes(kSize);
        return std::unique_ptr<BlockSource>(std::make_unique<MemorySource>(std::move(bytes)));
      },
      kSize, kCluster, (mode & 4) != 0);
  ResumeDecision d = DecideResume(loaded, terms, kept);

  if (!loaded.ok()) {
    if (loaded.error().code() == ErrorCode::kNotFound) {
      if (d.found()) std::abort();
    } else if (d.outcome != ResumeDecision::Outcome::kDiscard || d.reason.empty()) {
      std::abort();
    }
  }
  if ((mode & 1) || !(mode & 2)) {
    if (read) std::abort();  // refused or another job's: the data is never read
    if (loaded.ok() && d.resumed()) std::abort();
  }
  if (d.outcome == ResumeDecision::Outcome::kLeave) std::abort();  // the data opened: never out of reach
  if (d.resumed()) {
    if (d.kept.next_cluster == 0 || d.kept.kept_entries > d.journal.entries.size()) std::abort();
    LoadedJournal cut = d.KeptJournal();
    if (cut.next_cluster > d.kept.next_cluster) std::abort();
    for (const JournalEntry& e : cut.entries) {
      if (e.stored.cluster_index >= cut.next_cluster) std::abort();
    }
  } else if (d.found() && d.reason.empty()) {
    std::abort();  // a discarded site always says why
  }
  return 0;
}
