// The journal of a merge's switch-over (docs/formats/backup.md, "Merge"):
// which staged files replace which chain files and which old layers go, so
// that a merge stopped between two renames is completed by the next job
// that loads the chain folder.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::pipeline {

inline constexpr std::string_view kMergeJournalName = ".merge-journal.json";

struct MergeJournal {
  struct Rename {
    std::string from;     // staged name (MergeStagedName(to))
    std::string to;       // final name in the chain folder
    uint64_t size_bytes;  // of the staged file: identifies it once renamed
  };
  std::string through;                // id of the merged point
  std::vector<Rename> renames;        // done in order: image, digests, manifest
  std::vector<std::string> remove;    // old layers' files, manifests first
};

// ".NAME.merge-new": where a merge stages the new version of NAME. Hidden,
// so chain scans ignore it.
std::string MergeStagedName(const std::string& final_name);

Result<std::string> EncodeMergeJournal(const MergeJournal& journal);
// Parses untrusted JSON. Every name must be a plain file name of the chain
// folder of the expected kind (staged names for `from`, backup files for
// `to` and `remove`): a journal never makes us rename or delete anything
// else. kCorruption otherwise.
Result<MergeJournal> DecodeMergeJournal(std::string_view json);

// The functions below touch the chain folder through `env`.

// Stat of the journal: kNotFound is false; any other error is returned.
Result<bool> MergeJournalExists(Env& env, const std::string& dir);

// Writes the journal durably (Env::WriteFileAtomic: temporary, fsync,
// rename, folder sync).
Status WriteMergeJournal(Env& env, const std::string& dir, const MergeJournal& journal);

// Rolls the journal of `dir` forward. Needs the chain lock. Idempotent:
// every rename whose staged file is still there is done (a staged file that
// is gone must already sit under its final name, checked by size), the
// folder is synced, the old files are removed (missing ones are fine),
// and the journal is removed last. Returns OK when there is no journal;
// kCorruption when a rename can neither be done nor found done. A crash
// between any two of its steps (tests stop the Env there) is completed by
// the next call.
Status CompleteMergeJournal(Env& env, const std::string& dir);

// With the chain lock held: completes a journal if there is one, else
// removes staged files of a merge that stopped before writing its journal.
Status RecoverMerge(Env& env, const std::string& dir);

}  // namespace barge::pipeline
