// MigrateState: journaled copy -> verify -> mark current -> remove old, with
// recovery of an earlier run's journal.
#include "orchestrate/state/state_migrate.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/path.h"
#include "formats/image.h"
#include "formats/json_fields.h"
#include "formats/manifest.h"
#include "orchestrate/catalog/catalog_path.h"
#include "orchestrate/state/state_repoint.h"
#include "pipeline/endpoints.h"
#include "pipeline/stages.h"

namespace barge::orchestrate {

using nlohmann::json;

std::string_view MigrateStepName(MigrateStep step) {
  switch (step) {
    case MigrateStep::kNone: return "none";
    case MigrateStep::kBegin: return "begin";
    case MigrateStep::kCopied: return "copied";
    case MigrateStep::kVerified: return "verified";
    case MigrateStep::kCurrent: return "current";
    case MigrateStep::kOldRemoved: return "old-removed";
    case MigrateStep::kDone: return "done";
  }
  return "?";
}

namespace {

constexpr uint64_t kBlockBytes = 1 << 20;

// The journal: one JSON object per line, appended and fdatasync'ed.
class Journal {
 public:
  Journal(Env& env, std::string path) : env_(env), path_(std::move(path)) {}

  Status Append(MigrateStep step, json fields) {
    fields["step"] = static_cast<int>(step);
    fields["name"] = MigrateStepName(step);
    fields["time"] = formats::NowRfc3339();
    BARGE_ASSIGN_OR_RETURN(std::string line, formats::DumpJson(fields, -1, "state migration journal " + path_));
    line += "\n";
    auto st = env_.Stat(path_);
    if (!st.ok() && st.error().code() != ErrorCode::kNotFound) return st.error();
    const bool created = !st.ok();
    FileOptions o;
    o.write_behind = false;
    o.create_mode = 0600;
    BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> sink,
                           env_.OpenSink(path_, created ? SinkMode::kCreateNew : SinkMode::kExisting, o));
    uint64_t end = sink->size_bytes();
    if (!created && end > 0) {
      BARGE_ASSIGN_OR_RETURN(end, CutTornLine(*sink));
    }
    BARGE_RETURN_IF_ERROR(sink->WriteAt(end, std::as_bytes(std::span(line.data(), line.size()))));
    BARGE_RETURN_IF_ERROR(sink->Flush());
    if (created) BARGE_RETURN_IF_ERROR(env_.SyncDir(DirName(path_)));
    return OkStatus();
  }

  // The records so far; a torn last line (a crash mid-append) is ignored
  // (and cut off by the next Append, so a new record never continues it).
  // No journal: no records.
  Result<std::vector<MigrateJournalRecord>> Read() const {
    auto text = env_.ReadFile(path_);
    if (!text.ok()) {
      if (text.error().code() == ErrorCode::kNotFound) return std::vector<MigrateJournalRecord>{};
      return std::move(text).error();
    }
    auto records = ParseMigrateJournal(*text);
    if (!records.ok()) return std::move(records).error().set_path(path_);
    return records;
  }

  const std::string& path() const { return path_; }

 private:
  // Truncates the journal after its last newline when the append before a
  // crash stopped part-way through a line; returns where the next record
  // goes.
  Result<uint64_t> CutTornLine(BlockSink& sink) const {
    BARGE_ASSIGN_OR_RETURN(std::string text, env_.ReadFile(path_));
    if (text.empty() || text.back() == '\n') return static_cast<uint64_t>(text.size());
    const size_t newline = text.rfind('\n');
    const uint64_t keep = newline == std::string::npos ? 0 : newline + 1;
    BARGE_RETURN_IF_ERROR(sink.Truncate(keep));
    return keep;
  }

  Env& env_;
  std::string path_;
};

struct Entry {
  MigratedFile file;
  std::string source;
  std::string target;
  uint32_t mode = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// Refuses a qcow2 file whose data file or backing file lies inside the
// folder being moved: its stored absolute name would dangle afterwards.
Status CheckQcow2References(Env& env, const std::string& file, const std::string& from) {
  BARGE_ASSIGN_OR_RETURN(std::optional<formats::ImageInfo> info,
                         formats::ProbeQcow2Layer(file, pipeline::EnvSourceOpener(env)));
  if (!info) return OkStatus();
  for (const std::string* name : {&info->data_file, &info->backing_file}) {
    if (name->empty()) continue;
    if (IsAbsolutePath(*name) && IsInsidePath(*name, from)) {
      return Error::NotSupported("qcow2 file names '" + *name +
                                 "' inside the folder being moved by an absolute path; it would "
                                 "dangle after the move")
          .set_path(file);
    }
  }
  return OkStatus();
}

// Every entry under `dir` (relative names `rel`/NAME), links not followed.
Status ScanInto(Env& env, const std::string& from, const std::string& to, const std::string& rel,
                std::vector<Entry>& out) {
  const std::string dir = JoinPath(from, rel);
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    const std::string r = JoinPath(rel, name);
    if (r == kMigrateJournalName) continue;  // an earlier migration's, not state
    const std::string p = JoinPath(from, r);
    BARGE_ASSIGN_OR_RETURN(FileStat st, env.StatNoFollow(p));
    Entry e;
    e.file.path = r;
    e.source = p;
    e.target = JoinPath(to, r);
    e.mode = st.mode & 07777;
    e.uid = st.uid;
    e.gid = st.gid;
    if (st.is_directory()) {
      e.file.kind = "dir";
      out.push_back(std::move(e));
      BARGE_RETURN_IF_ERROR(ScanInto(env, from, to, r, out));
      continue;
    }
    if (st.is_symlink()) {
      e.file.kind = "symlink";
    } else if (st.is_regular()) {
      e.file.kind = "file";
      e.file.bytes = st.size_bytes;
      BARGE_RETURN_IF_ERROR(CheckQcow2References(env, p, from));
    } else {
      return Error::NotSupported("not a regular file, folder or symlink").set_path(p);
    }
    out.push_back(std::move(e));
  }
  return OkStatus();
}

Result<std::vector<Entry>> Scan(Env& env, const std::string& from, const std::string& to) {
  std::vector<Entry> out;
  if (Status s = ScanInto(env, from, to, "", out); !s.ok()) return std::move(s).error().Wrap("scan folder");
  // A folder sorts before what it holds.
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.file.path < b.file.path; });
  return out;
}

// SHA-512 of a file's bytes.
Result<std::string> HashFile(Env& env, const std::string& path) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> in, env.OpenSource(path));
  pipeline::Sha512Stream sha;
  std::vector<std::byte> buf(kBlockBytes);
  for (uint64_t off = 0; off < in->size_bytes(); off += kBlockBytes) {
    std::span<std::byte> block(buf.data(), std::min(kBlockBytes, in->size_bytes() - off));
    BARGE_RETURN_IF_ERROR(in->ReadAt(off, block));
    BARGE_RETURN_IF_ERROR(sha.Update(block));
  }
  return sha.FinishHex();
}

// Copies a regular file, leaving all-zero blocks as holes, with its mode
// (and owner, as root), then syncs it. Created private: no other user ever
// sees it readable before its mode is set. Returns the SHA-512 of the
// bytes read.
Result<std::string> CopyFile(Env& env, const Entry& e) {
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> in, env.OpenSource(e.source));
  if (in->size_bytes() != e.file.bytes) {
    return Error::IoError("file changed size while being copied").set_path(e.source);
  }
  FileOptions o;
  o.create_mode = 0600;
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSink> out, env.OpenSink(e.target, SinkMode::kTruncate, o));
  pipeline::Sha512Stream sha;
  std::vector<std::byte> buf(kBlockBytes);
  for (uint64_t off = 0; off < e.file.bytes; off += kBlockBytes) {
    std::span<std::byte> block(buf.data(), std::min(kBlockBytes, e.file.bytes - off));
    BARGE_RETURN_IF_ERROR(in->ReadAt(off, block));
    BARGE_RETURN_IF_ERROR(sha.Update(block));
    bool zero = std::all_of(block.begin(), block.end(), [](std::byte b) { return b == std::byte{0}; });
    if (!zero) BARGE_RETURN_IF_ERROR(out->WriteAt(off, block));
  }
  BARGE_RETURN_IF_ERROR(out->Truncate(e.file.bytes));
  BARGE_RETURN_IF_ERROR(env.SetMode(e.target, e.mode));
  if (::geteuid() == 0) BARGE_RETURN_IF_ERROR(env.SetOwner(e.target, e.uid, e.gid));
  BARGE_RETURN_IF_ERROR(out->Flush());
  return sha.FinishHex();
}

Status CopyAll(Env& env, std::vector<Entry>& entries, const std::string& to) {
  std::vector<std::string> dirs = {to};
  for (Entry& e : entries) {
    if (e.file.kind == "dir") {
      BARGE_RETURN_IF_ERROR(env.CreateDir(e.target));
      BARGE_RETURN_IF_ERROR(env.SetMode(e.target, e.mode));
      dirs.push_back(e.target);
    } else if (e.file.kind == "symlink") {
      BARGE_ASSIGN_OR_RETURN(std::string link, env.ReadLink(e.source));
      BARGE_RETURN_IF_ERROR(env.CreateSymlink(link, e.target));
      e.file.sha512 = link;  // compared as text on verify
    } else {
      BARGE_ASSIGN_OR_RETURN(e.file.sha512, CopyFile(env, e));
    }
  }
  for (const std::string& d : dirs) BARGE_RETURN_IF_ERROR(env.SyncDir(d));
  return OkStatus();
}

Status VerifyAll(Env& env, const std::vector<Entry>& entries) {
  for (const Entry& e : entries) {
    if (e.file.kind == "dir") {
      auto st = env.Stat(e.target);
      if (!st.ok() || !st->is_directory()) {
        return Error::Corruption("folder missing in the copy").set_path(e.target);
      }
    } else if (e.file.kind == "symlink") {
      auto link = env.ReadLink(e.target);
      if (!link.ok() || *link != e.file.sha512) {
        return Error::Corruption("symlink differs in the copy").set_path(e.target);
      }
    } else {
      auto st = env.Stat(e.target);
      if (!st.ok() || st->size_bytes != e.file.bytes) {
        return Error::Corruption("size differs in the copy").set_path(e.target);
      }
      BARGE_ASSIGN_OR_RETURN(std::string sha, HashFile(env, e.target));
      if (sha != e.file.sha512) {
        return Error::Corruption("SHA-512 of the copy differs from the original's").set_path(e.target);
      }
    }
  }
  return OkStatus();
}

Status WriteMarker(Env& env, const std::string& to, const std::string& from, size_t files) {
  json j = {{"current", true}, {"migrated_from", from}, {"migrated_at", formats::NowRfc3339()}, {"entries", files}};
  BARGE_ASSIGN_OR_RETURN(std::string text, formats::DumpJson(j, 2, "state marker in " + to));
  return env.WriteFileAtomic(JoinPath(to, kStateMarkerName), text + "\n");
}

// Removes the new copy: everything in `to` but the journal, then the
// journal (so a crash in between still finds it and rolls back again), then
// the folder if it is empty (a mount point stays).
Status RollBack(Env& env, const std::string& to, const Journal& journal) {
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(to));
  for (const std::string& name : names) {
    if (name == kMigrateJournalName) continue;
    BARGE_RETURN_IF_ERROR(env.RemoveTree(JoinPath(to, name)));
  }
  BARGE_RETURN_IF_ERROR(env.SyncDir(to));
  BARGE_RETURN_IF_ERROR(env.UnlinkIfExists(journal.path()));
  BARGE_RETURN_IF_ERROR(env.SyncDir(to));
  Status removed = env.RemoveDir(to);
  if (removed.ok()) return env.SyncDir(DirName(to));
  // A mount point cannot be removed (EBUSY) and stays, empty.
  if (removed.error().errno_value() == EBUSY) return OkStatus();
  return removed;
}

Status RemoveOld(Env& env, const std::string& from) {
  if (Status s = env.RemoveTree(from); !s.ok()) return std::move(s).error().Wrap("remove old copy");
  return env.SyncDir(DirName(from));
}

// From kCurrent on: the new copy is current; finish removing the old one.
Status Finish(Env& env, const std::string& from, const std::string& to, Journal& journal, MigrateStep last,
              const MigrateRepoint& repoint) {
  if (last < MigrateStep::kOldRemoved && repoint) {
    if (Status s = repoint(from, to); !s.ok()) return std::move(s).error().Wrap("repoint to the new folder");
  }
  if (last < MigrateStep::kOldRemoved) {
    BARGE_RETURN_IF_ERROR(RemoveOld(env, from));
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kOldRemoved, json::object()));
  }
  if (last < MigrateStep::kDone) BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kDone, json::object()));
  return OkStatus();
}

bool IsEmptyFolder(Env& env, const std::string& dir) {
  auto names = env.ListDir(dir);
  return names.ok() && names->empty();
}

}  // namespace

Result<std::vector<MigrateJournalRecord>> ParseMigrateJournal(std::string_view text) {
  std::vector<MigrateJournalRecord> out;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const bool complete = eol != std::string_view::npos;
    const std::string_view line = text.substr(0, eol);
    text = complete ? text.substr(eol + 1) : std::string_view();
    ++line_number;
    auto bad = [&](const std::string& why) {
      return Error::Corruption("migration journal line " + std::to_string(line_number) + ": " + why);
    };
    // Fields are checked before use: json's value() throws on a type
    // mismatch, and a step outside the enum would steer recovery.
    const json j = json::parse(line, nullptr, false);
    const bool is_record = !j.is_discarded() && j.is_object() && j.contains("step");
    if (!is_record) {
      if (!complete) break;  // a torn append
      return bad("not a journal record");
    }
    const json& step = j["step"];
    const int expected = static_cast<int>(out.size()) + 1;
    if (!step.is_number_integer() || step.get<int64_t>() != expected) {
      return bad("step " + step.dump() + " where step " + std::to_string(expected) + " was due");
    }
    MigrateJournalRecord r;
    r.step = static_cast<MigrateStep>(expected);
    if (expected > static_cast<int>(MigrateStep::kDone)) return bad("steps past 'done'");
    for (auto [key, field] : {std::pair{"from", &r.from}, std::pair{"to", &r.to}}) {
      if (!j.contains(key)) continue;
      if (!j[key].is_string()) return bad(std::string("'") + key + "' is not a string");
      *field = j[key].get<std::string>();
    }
    if (r.step == MigrateStep::kBegin && (r.from.empty() || r.to.empty())) {
      return bad("the first record must name both folders");
    }
    out.push_back(std::move(r));
  }
  return out;
}

namespace {

Result<StateMigrateResult> MigrateJournaled(Env& env, const std::string& from_arg, const std::string& to_arg,
                                            const MigrateRepoint& repoint) {
  const std::string from = AbsolutePath(from_arg);
  const std::string to = AbsolutePath(to_arg);
  if (from == to || IsInsidePath(to, from) || IsInsidePath(from, to)) {
    return Error::InvalidArgument("source and target folders must be distinct and not nested");
  }
  StateMigrateResult result;
  Journal journal(env, JoinPath(to, kMigrateJournalName));

  auto journal_st = env.Stat(journal.path());
  if (!journal_st.ok() && journal_st.error().code() != ErrorCode::kNotFound) return journal_st.error();
  if (journal_st.ok()) {
    BARGE_ASSIGN_OR_RETURN(std::vector<MigrateJournalRecord> records, journal.Read());
    MigrateStep last = MigrateStep::kNone;
    for (const MigrateJournalRecord& r : records) last = r.step;
    if (!records.empty() && (records[0].from != from || records[0].to != to)) {
      return Error::InvalidArgument("the target holds the journal of another migration (from " +
                                    (records[0].from.empty() ? "?" : records[0].from) + ")")
          .set_path(journal.path());
    }
    if (last == MigrateStep::kDone) {
      result.outcome = "already-migrated";
      return result;
    }
    if (last >= MigrateStep::kCurrent) {
      BARGE_RETURN_IF_ERROR(Finish(env, from, to, journal, last, repoint));
      result.outcome = "migrated";
      result.recovery = "finished";
      return result;
    }
    // Before the commit point the old folder is current: drop the partial
    // new copy, then migrate again from the start.
    if (repoint) {
      if (Status s = repoint(to, from); !s.ok()) return std::move(s).error().Wrap("repoint back to the old folder");
    }
    BARGE_RETURN_IF_ERROR(RollBack(env, to, journal));
    result.recovery = "rolled back";
  }

  auto from_st = env.Stat(from);
  if (!from_st.ok() || !from_st->is_directory()) {
    return Error::NotFound("no state folder to migrate").set_path(from);
  }
  auto to_st = env.Stat(to);
  if (to_st.ok() && (!to_st->is_directory() || !IsEmptyFolder(env, to))) {
    return Error::InvalidArgument("target exists and is not an empty folder").set_path(to);
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<Entry> entries, Scan(env, from, to));
  if (!to_st.ok()) {
    if (Status made = env.CreateDirs(to); !made.ok()) return std::move(made).error().Wrap("create folder");
    BARGE_RETURN_IF_ERROR(env.SyncDir(DirName(to)));
  }

  // Steps before the commit point: any error removes the new copy.
  auto before_commit = [&]() -> Status {
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kBegin, {{"from", from}, {"to", to}}));
    BARGE_RETURN_IF_ERROR(CopyAll(env, entries, to));
    json files = json::array();
    for (const Entry& e : entries) {
      files.push_back({{"path", e.file.path}, {"kind", e.file.kind}, {"bytes", e.file.bytes},
                       {"sha512", e.file.sha512}});
    }
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kCopied, {{"files", files}}));
    BARGE_RETURN_IF_ERROR(VerifyAll(env, entries));
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kVerified, json::object()));
    if (repoint) {
      if (Status s = repoint(from, to); !s.ok()) return std::move(s).error().Wrap("repoint to the new folder");
    }
    BARGE_RETURN_IF_ERROR(WriteMarker(env, to, from, entries.size()));
    return journal.Append(MigrateStep::kCurrent, json::object());
  };
  if (Status s = before_commit(); !s.ok()) {
    Error e = std::move(s).error();
    // The journal may or may not hold kCurrent (its append failed): only a
    // journal without it may be rolled back.
    auto records = journal.Read();
    if (!records.ok()) {
      return e.Wrap("the journal cannot be read back (" + records.error().ToString() +
                    "); nothing was rolled back");
    }
    MigrateStep last = MigrateStep::kNone;
    for (const MigrateJournalRecord& r : *records) last = r.step;
    if (last < MigrateStep::kCurrent) {
      if (repoint) {
        if (Status back = repoint(to, from); !back.ok()) {
          // The domains may name the new copy: keep both copies.
          e.Also(std::move(back));
          return e.Wrap("migration failed and repointing back to the old folder failed too; both copies are "
                        "kept: run again");
        }
      }
      e.Also(RollBack(env, to, journal));
      return e.Wrap("migration failed; the old folder stays current and the new copy was removed");
    }
    return e;
  }
  if (Status s = Finish(env, from, to, journal, MigrateStep::kCurrent, {}); !s.ok()) {
    return std::move(s).error().Wrap("the new copy is current; run again to finish removing the old one");
  }
  result.outcome = "migrated";
  for (Entry& e : entries) result.files.push_back(std::move(e.file));
  return result;
}

}  // namespace

Result<StateMigrateResult> MigrateState(Env& env, const std::string& from, const std::string& to,
                                        const MigrateOptions& options) {
  if (!options.use_libvirt) return MigrateJournaled(env, from, to, options.repoint);
  BARGE_ASSIGN_OR_RETURN(std::string catalog, ExistingCatalogPath(env, options.catalog_flag));
  DomainRepoint users(env, options.libvirt_uri, catalog);
  BARGE_RETURN_IF_ERROR(users.LockUsers(from));
  return MigrateJournaled(env, from, to, [&users](const std::string& old_dir, const std::string& new_dir) {
    return users.Repoint(old_dir, new_dir);
  });
}

std::string MovedFromLocation(Env& env, const std::string& path) {
  std::string dir = DirName(path);
  // A state folder holds its files a few levels deep at most.
  for (int depth = 0; depth < 8 && !dir.empty() && dir != "/"; ++depth, dir = DirName(dir)) {
    auto text = env.ReadFile(JoinPath(dir, kStateMarkerName), 1 << 20);
    if (!text.ok()) continue;
    json marker = json::parse(*text, nullptr, false);
    std::string from = marker.is_object() ? formats::JsonString(marker, "migrated_from") : "";
    if (from.empty() || !IsAbsolutePath(from)) return "";
    from = LexicallyNormal(from);
    const std::string old_dir = JoinPath(CanonicalPath(env, DirName(from)), BaseName(from));
    return JoinPath(old_dir, path.substr(dir.size() + 1));
  }
  return "";
}

}  // namespace barge::orchestrate
