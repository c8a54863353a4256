// Merge journal: encoding, durable writing and roll-forward recovery.
#include "pipeline/merge_journal.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "pipeline/chain.h"
#include "pipeline/staged_file.h"

namespace barge::pipeline {

namespace fs = std::filesystem;
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
  return name.ends_with(".json") || name.ends_with(".qcow2") || name.ends_with(".digests");
}

Error JournalError(const std::string& dir, const std::string& message) {
  return Error::Corruption("merge journal: " + message)
      .set_path(dir + "/" + std::string(kMergeJournalName));
}

}  // namespace

std::string MergeStagedName(const std::string& final_name) {
  return "." + final_name + std::string(kStagedSuffix);
}

std::string EncodeMergeJournal(const MergeJournal& journal) {
  json renames = json::array();
  for (const auto& r : journal.renames) {
    renames.push_back({{"from", r.from}, {"to", r.to}, {"size", r.size_bytes}});
  }
  json j = {{"format", kFormat},
            {"version", 1},
            {"through", journal.through},
            {"renames", renames},
            {"remove", journal.remove}};
  return j.dump(2) + "\n";
}

Result<MergeJournal> DecodeMergeJournal(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [](const std::string& why) { return Error::Corruption("merge journal: " + why); };
  if (!j.is_object()) return bad("not a JSON object");
  if (j.value("format", "") != kFormat) return bad("format is not " + std::string(kFormat));
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

bool MergeJournalExists(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kMergeJournalName, ec);
}

Status WriteMergeJournal(const std::string& dir, const MergeJournal& journal) {
  std::string text = EncodeMergeJournal(journal);
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<StagedFile> file,
                         StagedFile::Create(dir + "/" + std::string(kMergeJournalName),
                                            /*overwrite=*/true));
  BARGE_RETURN_IF_ERROR(
      file->sink().WriteAt(0, std::as_bytes(std::span(text.data(), text.size()))));
  // Commit flushes the file, renames it and syncs the folder: the journal is
  // durable before the caller's first rename.
  return file->Commit();
}

Status CompleteMergeJournal(const std::string& dir, const MergeStepHook& after_step) {
  const std::string path = dir + "/" + std::string(kMergeJournalName);
  if (!MergeJournalExists(dir)) return OkStatus();
  BARGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, 1 << 20));
  auto journal = DecodeMergeJournal(text);
  if (!journal.ok()) return Error(journal.error()).set_path(path);
  auto step = [&](const std::string& what) {
    return after_step ? after_step(what) : OkStatus();
  };

  // 1. The renames. The staged files were complete and synced before the
  // journal was written, so doing the rest in any state is safe; a staged
  // file that is gone was renamed before the stop.
  for (const auto& r : journal->renames) {
    std::string from = dir + "/" + r.from, to = dir + "/" + r.to;
    std::error_code ec;
    if (fs::exists(from, ec)) {
      uint64_t size = fs::file_size(from, ec);
      if (ec || size != r.size_bytes) {
        return JournalError(dir, "staged file " + r.from + " has " + std::to_string(size) +
                                     " bytes, the journal says " + std::to_string(r.size_bytes));
      }
      if (::rename(from.c_str(), to.c_str()) != 0) return Error::FromErrno(errno, "rename", from);
    } else {
      uint64_t size = fs::file_size(to, ec);
      if (ec || size != r.size_bytes) {
        return JournalError(dir, "cannot complete the merge through " + journal->through + ": " +
                                     r.from + " is gone and " + r.to + " is not the merged file");
      }
    }
    BARGE_RETURN_IF_ERROR(step("renamed " + r.to));
  }
  // The renames must be durable before anything they replace is deleted.
  BARGE_RETURN_IF_ERROR(SyncDirectory(dir));

  // 2. The folded layers: manifests first, so no manifest ever names a
  // missing image or digest table.
  for (const auto& name : journal->remove) {
    std::string p = dir + "/" + name;
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return Error::FromErrno(errno, "remove", p);
    BARGE_RETURN_IF_ERROR(step("removed " + name));
  }
  BARGE_RETURN_IF_ERROR(SyncDirectory(dir));

  // 3. Done: the journal goes last.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Error::FromErrno(errno, "remove", path);
  BARGE_RETURN_IF_ERROR(SyncDirectory(dir));
  return step("removed the journal");
}

Status RecoverMerge(const std::string& dir) {
  if (MergeJournalExists(dir)) return CompleteMergeJournal(dir);
  // No journal: a merge that stopped earlier changed nothing but may have
  // left staged files.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() > kStagedSuffix.size() + 1 && name[0] == '.' && name.ends_with(kStagedSuffix)) {
      std::error_code remove_ec;
      fs::remove(entry.path(), remove_ec);
    }
  }
  return OkStatus();
}

}  // namespace barge::pipeline
