// Merge journal: encoding, durable writing and roll-forward recovery.
#include "pipeline/merge_journal.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "formats/json_fields.h"
#include "pipeline/backup_resume.h"
#include "pipeline/chain_files.h"
#include "pipeline/file_access.h"
#include "pipeline/small_file.h"

namespace barge::pipeline {

using nlohmann::json;

namespace {

constexpr std::string_view kFormat = "barge-merge-journal";
constexpr std::string_view kStagedSuffix = ".merge-new";

bool PlainName(const std::string& name) {
  return !name.empty() && name.size() < 256 && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos && name != "." && name != "..";
}

// A backup file of a chain folder: "<sequence>-....{json,qcow2,digests}".
bool BackupFileName(const std::string& name) {
  if (!PlainName(name) || !std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return name.ends_with(".json") || name.ends_with(".qcow2") || name.ends_with(".digests") ||
         name.ends_with(".sha256");
}

Error JournalError(const std::string& dir, const std::string& message) {
  return Error::Corruption("merge journal: " + message)
      .set_path(dir + "/" + std::string(kMergeJournalName));
}

}  // namespace

std::string MergeStagedName(const std::string& final_name) {
  return "." + final_name + std::string(kStagedSuffix);
}

Result<std::string> EncodeMergeJournal(const MergeJournal& journal) {
  json renames = json::array();
  for (const auto& r : journal.renames) {
    renames.push_back({{"from", r.from}, {"to", r.to}, {"size", r.size_bytes}});
  }
  json j = {{"format", kFormat},
            {"version", 1},
            {"through", journal.through},
            {"renames", renames},
            {"remove", journal.remove}};
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::DumpJson(j, 2, "merge journal through " + journal.through));
  return text + "\n";
}

Result<MergeJournal> DecodeMergeJournal(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) { return Error::Corruption("merge journal: " + why); };
  if (!j.is_object()) return bad("not a JSON object");
  if (formats::JsonString(j, "format") != kFormat) return bad("format is not " + std::string(kFormat));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"] != 1) {
    return Error::NotSupported("merge journal: unsupported version");
  }
  MergeJournal out;
  if (!j.contains("through") || !j["through"].is_string()) return bad("no 'through'");
  out.through = j["through"].get<std::string>();
  if (!j.contains("renames") || !j["renames"].is_array()) return bad("no 'renames' list");
  for (const auto& r : j["renames"]) {
    if (!r.is_object() || !r.contains("from") || !r["from"].is_string() || !r.contains("to") ||
        !r["to"].is_string() || !r.contains("size") || !r["size"].is_number_unsigned()) {
      return bad("a rename needs 'from', 'to' and 'size'");
    }
    MergeJournal::Rename rename{r["from"].get<std::string>(), r["to"].get<std::string>(),
                                r["size"].get<uint64_t>()};
    if (!BackupFileName(rename.to) || rename.from != MergeStagedName(rename.to)) {
      return bad("rename of '" + rename.from + "' to '" + rename.to + "' is not a merge's");
    }
    out.renames.push_back(std::move(rename));
  }
  if (!j.contains("remove") || !j["remove"].is_array()) return bad("no 'remove' list");
  for (const auto& r : j["remove"]) {
    if (!r.is_string() || !BackupFileName(r.get<std::string>())) {
      return bad("'remove' names something that is not a backup file");
    }
    out.remove.push_back(r.get<std::string>());
  }
  return out;
}

Result<bool> MergeJournalExists(Env& env, const std::string& dir) {
  auto st = env.Stat(dir + "/" + std::string(kMergeJournalName));
  if (st.ok()) return true;
  if (st.error().code() == ErrorCode::kNotFound) return false;
  return st.error();
}

Status WriteMergeJournal(Env& env, const std::string& dir, const MergeJournal& journal) {
  // Flushed, renamed and the folder synced: the journal is durable before
  // the caller's first rename.
  BARGE_ASSIGN_OR_RETURN(std::string text, EncodeMergeJournal(journal));
  return WriteFileLikeFolder(env, dir + "/" + std::string(kMergeJournalName), text);
}

Status CompleteMergeJournal(Env& env, const std::string& dir) {
  const std::string path = dir + "/" + std::string(kMergeJournalName);
  BARGE_ASSIGN_OR_RETURN(bool exists, MergeJournalExists(env, dir));
  if (!exists) return OkStatus();
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadChainFile(env, path, 1 << 20));
  auto journal = DecodeMergeJournal(text);
  if (!journal.ok()) return Error(journal.error()).set_path(path);

  // 1. The renames. The staged files were complete and synced before the
  // journal was written, so doing the rest in any state is safe; a staged
  // file that is gone was renamed before the stop.
  for (const auto& r : journal->renames) {
    std::string from = dir + "/" + r.from, to = dir + "/" + r.to;
    auto staged = env.Stat(from);
    if (!staged.ok() && staged.error().code() != ErrorCode::kNotFound) return staged.error();
    if (staged.ok()) {
      if (staged->size_bytes != r.size_bytes) {
        return JournalError(dir, "staged file " + r.from + " has " + std::to_string(staged->size_bytes) +
                                     " bytes, the journal says " + std::to_string(r.size_bytes));
      }
      BARGE_RETURN_IF_ERROR(env.Rename(from, to));
    } else {
      auto done = env.Stat(to);
      if (!done.ok() || done->size_bytes != r.size_bytes) {
        return JournalError(dir, "cannot complete the merge through " + journal->through + ": " +
                                     r.from + " is gone and " + r.to + " is not the merged file");
      }
    }
  }
  // The renames must be durable before anything they replace is deleted.
  BARGE_RETURN_IF_ERROR(env.SyncDir(dir));

  // 2. The folded layers: manifests first, so no manifest ever names a
  // missing image or digest table.
  for (const auto& name : journal->remove) BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(dir + "/" + name));
  BARGE_RETURN_IF_ERROR(env.SyncDir(dir));

  // 3. Done: the journal goes last.
  BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(path));
  return env.SyncDir(dir);
}

Status RecoverMerge(Env& env, const std::string& dir) {
  BARGE_ASSIGN_OR_RETURN(bool exists, MergeJournalExists(env, dir));
  if (exists) return CompleteMergeJournal(env, dir);
  // No journal: a merge that stopped earlier changed nothing but may have
  // left staged files (and their temporaries, which the sweep takes).
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    if (name.size() > kStagedSuffix.size() + 1 && name[0] == '.' && name.ends_with(kStagedSuffix)) {
      BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(dir + "/" + name));
    }
  }
  // A backup that may resume decides about its staged image itself.
  std::unique_ptr<EnvLock> spared = SpareResumableImage(env, dir);
  auto swept = SweepStaleTemporaries(env, dir);
  if (!swept.ok()) return swept.error();
  return OkStatus();
}

}  // namespace barge::pipeline
