// MigrateState: journaled copy -> verify -> mark current -> remove old, with
// recovery of an earlier run's journal.
#include "orchestrate/state_migrate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "blockio/file.h"
#include "formats/image.h"
#include "formats/manifest.h"
#include "pipeline/staged_file.h"
#include "pipeline/stages.h"

namespace barge::orchestrate {

namespace fs = std::filesystem;
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

constexpr size_t kBlockBytes = 1 << 20;

// Owns one file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Error::FromErrno(errno, "write", path);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

Status PwriteAll(int fd, const std::byte* data, size_t n, off_t off, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, data, n, off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Error::FromErrno(errno, "write", path);
    }
    data += w;
    n -= static_cast<size_t>(w);
    off += w;
  }
  return OkStatus();
}

// Reads up to n bytes; fewer only at end of file.
Result<size_t> PreadFull(int fd, std::byte* out, size_t n, off_t off, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd, out + got, n - got, off + static_cast<off_t>(got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Error::FromErrno(errno, "read", path);
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

// The journal: one JSON object per line, appended and fdatasync'ed.
class Journal {
 public:
  explicit Journal(std::string path) : path_(std::move(path)) {}

  Status Append(MigrateStep step, json fields) {
    fields["step"] = static_cast<int>(step);
    fields["name"] = MigrateStepName(step);
    fields["time"] = formats::NowRfc3339();
    std::string line = fields.dump() + "\n";
    bool created = !fs::exists(path_);
    Fd fd(::open(path_.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
    if (fd.get() < 0) return Error::FromErrno(errno, "open journal", path_);
    BARGE_RETURN_IF_ERROR(CutTornLine(fd.get()));
    BARGE_RETURN_IF_ERROR(WriteAll(fd.get(), line.data(), line.size(), path_));
    if (::fdatasync(fd.get()) != 0) return Error::FromErrno(errno, "fdatasync journal", path_);
    if (created) BARGE_RETURN_IF_ERROR(pipeline::SyncDirectory(fs::path(path_).parent_path().string()));
    return OkStatus();
  }

  // The records so far; a torn last line (a crash mid-append) is ignored
  // (and cut off by the next Append, so a new record never continues it).
  Result<std::vector<MigrateJournalRecord>> Read() const {
    std::ifstream in(path_);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto records = ParseMigrateJournal(text);
    if (!records.ok()) return std::move(records).error().set_path(path_);
    return records;
  }

  const std::string& path() const { return path_; }

 private:
  // Truncates the file after its last newline when the append before a
  // crash stopped part-way through a line.
  Status CutTornLine(int fd) const {
    struct stat st;
    if (::fstat(fd, &st) != 0) return Error::FromErrno(errno, "stat journal", path_);
    if (st.st_size == 0) return OkStatus();
    std::string text(static_cast<size_t>(st.st_size), '\0');
    BARGE_ASSIGN_OR_RETURN(size_t n, PreadFull(fd, reinterpret_cast<std::byte*>(text.data()), text.size(), 0, path_));
    text.resize(n);
    if (text.empty() || text.back() == '\n') return OkStatus();
    const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (::ftruncate(fd, static_cast<off_t>(keep)) != 0) return Error::FromErrno(errno, "truncate journal", path_);
    return OkStatus();
  }

  std::string path_;
};

struct Entry {
  MigratedFile file;
  fs::path source;
  fs::path target;
  mode_t mode = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

bool Inside(const fs::path& p, const fs::path& dir) {
  auto rel = p.lexically_normal().lexically_relative(dir);
  return !rel.empty() && *rel.begin() != "..";
}

// Refuses a qcow2 file whose data file or backing file lies inside the
// folder being moved: its stored absolute name would dangle afterwards.
Status CheckQcow2References(const fs::path& file, const fs::path& from) {
  BARGE_ASSIGN_OR_RETURN(std::optional<formats::ImageInfo> info,
                         formats::ProbeQcow2Layer(file.string(), [](const std::string& p) { return OpenFileSource(p); }));
  if (!info) return OkStatus();
  for (const std::string* name : {&info->data_file, &info->backing_file}) {
    if (name->empty()) continue;
    fs::path p(*name);
    if (p.is_absolute() && Inside(p, from)) {
      return Error::NotSupported("qcow2 file names '" + *name +
                                 "' inside the folder being moved by an absolute path; it would "
                                 "dangle after the move")
          .set_path(file.string());
    }
  }
  return OkStatus();
}

Result<std::vector<Entry>> Scan(const fs::path& from, const fs::path& to) {
  std::vector<Entry> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(from, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    const fs::path& p = it->path();
    fs::path rel = p.lexically_relative(from);
    if (rel == kMigrateJournalName) continue;  // an earlier migration's, not state
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) return Error::FromErrno(errno, "lstat", p.string());
    Entry e;
    e.file.path = rel.string();
    e.source = p;
    e.target = to / rel;
    e.mode = st.st_mode & 07777;
    e.uid = st.st_uid;
    e.gid = st.st_gid;
    if (S_ISDIR(st.st_mode)) {
      e.file.kind = "dir";
    } else if (S_ISLNK(st.st_mode)) {
      e.file.kind = "symlink";
    } else if (S_ISREG(st.st_mode)) {
      e.file.kind = "file";
      e.file.bytes = static_cast<uint64_t>(st.st_size);
      BARGE_RETURN_IF_ERROR(CheckQcow2References(p, from));
    } else {
      return Error::NotSupported("not a regular file, folder or symlink").set_path(p.string());
    }
    out.push_back(std::move(e));
  }
  if (ec) return Error::FromErrno(ec.value(), "scan folder", from.string());
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.file.path < b.file.path; });
  return out;
}

// SHA-512 of a file's bytes.
Result<std::string> HashFile(const fs::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return Error::FromErrno(errno, "open", path.string());
  pipeline::Sha512Stream sha;
  std::vector<std::byte> buf(kBlockBytes);
  off_t off = 0;
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(size_t n, PreadFull(fd.get(), buf.data(), buf.size(), off, path.string()));
    if (n == 0) break;
    BARGE_RETURN_IF_ERROR(sha.Update(std::span(buf.data(), n)));
    off += static_cast<off_t>(n);
  }
  return sha.FinishHex();
}

// Copies a regular file, leaving all-zero blocks as holes, then fsyncs it.
// Returns the SHA-512 of the bytes read.
Result<std::string> CopyFile(const Entry& e) {
  std::string src = e.source.string(), dst = e.target.string();
  Fd in(::open(src.c_str(), O_RDONLY | O_CLOEXEC));
  if (in.get() < 0) return Error::FromErrno(errno, "open", src);
  Fd out(::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (out.get() < 0) return Error::FromErrno(errno, "create", dst);
  pipeline::Sha512Stream sha;
  std::vector<std::byte> buf(kBlockBytes);
  off_t off = 0;
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(size_t n, PreadFull(in.get(), buf.data(), buf.size(), off, src));
    if (n == 0) break;
    BARGE_RETURN_IF_ERROR(sha.Update(std::span(buf.data(), n)));
    bool zero = std::all_of(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n),
                            [](std::byte b) { return b == std::byte{0}; });
    if (!zero) BARGE_RETURN_IF_ERROR(PwriteAll(out.get(), buf.data(), n, off, dst));
    off += static_cast<off_t>(n);
  }
  if (::ftruncate(out.get(), off) != 0) return Error::FromErrno(errno, "truncate", dst);
  if (off != static_cast<off_t>(e.file.bytes)) {
    return Error::IoError("file changed size while being copied").set_path(src);
  }
  if (::fchmod(out.get(), e.mode) != 0) return Error::FromErrno(errno, "chmod", dst);
  if (::geteuid() == 0 && ::fchown(out.get(), e.uid, e.gid) != 0) return Error::FromErrno(errno, "chown", dst);
  if (::fsync(out.get()) != 0) return Error::FromErrno(errno, "fsync", dst);
  return sha.FinishHex();
}

Status CopyAll(std::vector<Entry>& entries, const fs::path& to, const StateMigrateOptions& options) {
  int files = 0;
  std::vector<fs::path> dirs = {to};
  for (Entry& e : entries) {
    if (e.file.kind == "dir") {
      if (::mkdir(e.target.c_str(), 0700) != 0 && errno != EEXIST) {
        return Error::FromErrno(errno, "mkdir", e.target.string());
      }
      if (::chmod(e.target.c_str(), e.mode) != 0) return Error::FromErrno(errno, "chmod", e.target.string());
      dirs.push_back(e.target);
    } else if (e.file.kind == "symlink") {
      std::error_code ec;
      fs::path link = fs::read_symlink(e.source, ec);
      if (ec) return Error::FromErrno(ec.value(), "readlink", e.source.string());
      fs::create_symlink(link, e.target, ec);
      if (ec) return Error::FromErrno(ec.value(), "symlink", e.target.string());
      e.file.sha512 = link.string();  // compared as text on verify
    } else {
      BARGE_ASSIGN_OR_RETURN(e.file.sha512, CopyFile(e));
      if (options.stop_after_files > 0 && ++files >= options.stop_after_files) {
        return Error::Cancelled("test hook: stopped after " + std::to_string(files) + " files");
      }
    }
  }
  for (const fs::path& d : dirs) BARGE_RETURN_IF_ERROR(pipeline::SyncDirectory(d.string()));
  return OkStatus();
}

Status VerifyAll(const std::vector<Entry>& entries) {
  for (const Entry& e : entries) {
    if (e.file.kind == "dir") {
      if (!fs::is_directory(e.target)) return Error::Corruption("folder missing in the copy").set_path(e.target.string());
    } else if (e.file.kind == "symlink") {
      std::error_code ec;
      if (fs::read_symlink(e.target, ec).string() != e.file.sha512 || ec) {
        return Error::Corruption("symlink differs in the copy").set_path(e.target.string());
      }
    } else {
      std::error_code ec;
      if (fs::file_size(e.target, ec) != e.file.bytes || ec) {
        return Error::Corruption("size differs in the copy").set_path(e.target.string());
      }
      BARGE_ASSIGN_OR_RETURN(std::string sha, HashFile(e.target));
      if (sha != e.file.sha512) {
        return Error::Corruption("SHA-512 of the copy differs from the original's").set_path(e.target.string());
      }
    }
  }
  return OkStatus();
}

Status WriteMarker(const fs::path& to, const fs::path& from, size_t files) {
  json j = {{"current", true}, {"migrated_from", from.string()}, {"migrated_at", formats::NowRfc3339()}, {"entries", files}};
  std::string text = j.dump(2) + "\n";
  BARGE_ASSIGN_OR_RETURN(auto staged, pipeline::StagedFile::Create((to / kStateMarkerName).string(), true));
  BARGE_RETURN_IF_ERROR(staged->sink().WriteAt(0, std::as_bytes(std::span(text.data(), text.size()))));
  return staged->Commit();
}

// Removes the new copy: everything in `to` but the journal, then the
// journal (so a crash in between still finds it and rolls back again), then
// the folder if it is empty (a mount point stays).
Status RollBack(const fs::path& to, const Journal& journal) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(to, ec)) {
    if (e.path().filename() == kMigrateJournalName) continue;
    fs::remove_all(e.path(), ec);
    if (ec) return Error::FromErrno(ec.value(), "remove", e.path().string());
  }
  BARGE_RETURN_IF_ERROR(pipeline::SyncDirectory(to.string()));
  fs::remove(journal.path(), ec);
  BARGE_RETURN_IF_ERROR(pipeline::SyncDirectory(to.string()));
  if (::rmdir(to.c_str()) == 0) BARGE_RETURN_IF_ERROR(pipeline::SyncDirectory(to.parent_path().string()));
  return OkStatus();
}

Status RemoveOld(const fs::path& from) {
  std::error_code ec;
  fs::remove_all(from, ec);
  if (ec) return Error::FromErrno(ec.value(), "remove old copy", from.string());
  return pipeline::SyncDirectory(from.parent_path().string());
}

Status StopHook(const StateMigrateOptions& options, MigrateStep step) {
  if (options.stop_after_step == static_cast<int>(step)) {
    return Error::Cancelled("test hook: stopped after step " + std::string(MigrateStepName(step)));
  }
  return OkStatus();
}

// From kCurrent on: the new copy is current; finish removing the old one.
Status Finish(const fs::path& from, Journal& journal, MigrateStep last, const StateMigrateOptions& options) {
  if (last < MigrateStep::kOldRemoved) {
    BARGE_RETURN_IF_ERROR(RemoveOld(from));
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kOldRemoved, json::object()));
    BARGE_RETURN_IF_ERROR(StopHook(options, MigrateStep::kOldRemoved));
  }
  if (last < MigrateStep::kDone) BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kDone, json::object()));
  return OkStatus();
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

Result<StateMigrateResult> MigrateState(const std::string& from_arg, const std::string& to_arg,
                                        const StateMigrateOptions& options) {
  std::error_code ec;
  fs::path from = fs::absolute(from_arg, ec).lexically_normal();
  fs::path to = fs::absolute(to_arg, ec).lexically_normal();
  if (from.filename().empty()) from = from.parent_path();
  if (to.filename().empty()) to = to.parent_path();
  if (from == to || Inside(to, from) || Inside(from, to)) {
    return Error::InvalidArgument("source and target folders must be distinct and not nested");
  }
  StateMigrateResult result;
  Journal journal((to / kMigrateJournalName).string());

  if (fs::exists(journal.path())) {
    BARGE_ASSIGN_OR_RETURN(std::vector<MigrateJournalRecord> records, journal.Read());
    MigrateStep last = MigrateStep::kNone;
    for (const MigrateJournalRecord& r : records) last = r.step;
    if (!records.empty() && (records[0].from != from.string() || records[0].to != to.string())) {
      return Error::InvalidArgument("the target holds the journal of another migration (from " +
                                    (records[0].from.empty() ? "?" : records[0].from) + ")")
          .set_path(journal.path());
    }
    if (last == MigrateStep::kDone) {
      result.outcome = "already-migrated";
      return result;
    }
    if (last >= MigrateStep::kCurrent) {
      BARGE_RETURN_IF_ERROR(Finish(from, journal, last, options));
      result.outcome = "migrated";
      result.recovery = "finished";
      return result;
    }
    // Before the commit point the old folder is current: drop the partial
    // new copy, then migrate again from the start.
    BARGE_RETURN_IF_ERROR(RollBack(to, journal));
    result.recovery = "rolled back";
  }

  if (!fs::is_directory(from)) return Error::NotFound("no state folder to migrate").set_path(from.string());
  if (fs::exists(to)) {
    if (!fs::is_directory(to) || !fs::is_empty(to)) {
      return Error::InvalidArgument("target exists and is not an empty folder").set_path(to.string());
    }
  }
  BARGE_ASSIGN_OR_RETURN(std::vector<Entry> entries, Scan(from, to));
  if (!fs::exists(to)) {
    fs::create_directories(to, ec);
    if (ec) return Error::FromErrno(ec.value(), "create folder", to.string());
    BARGE_RETURN_IF_ERROR(pipeline::SyncDirectory(to.parent_path().string()));
  }

  // Steps before the commit point: any error removes the new copy.
  auto before_commit = [&]() -> Status {
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kBegin, {{"from", from.string()}, {"to", to.string()}}));
    BARGE_RETURN_IF_ERROR(StopHook(options, MigrateStep::kBegin));
    BARGE_RETURN_IF_ERROR(CopyAll(entries, to, options));
    json files = json::array();
    for (const Entry& e : entries) {
      files.push_back({{"path", e.file.path}, {"kind", e.file.kind}, {"bytes", e.file.bytes},
                       {"sha512", e.file.sha512}});
    }
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kCopied, {{"files", files}}));
    BARGE_RETURN_IF_ERROR(StopHook(options, MigrateStep::kCopied));
    BARGE_RETURN_IF_ERROR(VerifyAll(entries));
    BARGE_RETURN_IF_ERROR(journal.Append(MigrateStep::kVerified, json::object()));
    BARGE_RETURN_IF_ERROR(StopHook(options, MigrateStep::kVerified));
    BARGE_RETURN_IF_ERROR(WriteMarker(to, from, entries.size()));
    return journal.Append(MigrateStep::kCurrent, json::object());
  };
  if (Status s = before_commit(); !s.ok()) {
    Error e = std::move(s).error();
    if (e.code() == ErrorCode::kCancelled) return e;  // the test hook: a "crash", touch nothing
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
      if (Status rb = RollBack(to, journal); !rb.ok()) e.Wrap("rollback failed too (" + rb.error().ToString() + ")");
      return e.Wrap("migration failed; the old folder stays current and the new copy was removed");
    }
    return e;
  }
  BARGE_RETURN_IF_ERROR(StopHook(options, MigrateStep::kCurrent));
  if (Status s = Finish(from, journal, MigrateStep::kCurrent, options); !s.ok()) {
    Error e = std::move(s).error();
    if (e.code() == ErrorCode::kCancelled) return e;
    return e.Wrap("the new copy is current; run again to finish removing the old one");
  }
  result.outcome = "migrated";
  for (Entry& e : entries) result.files.push_back(std::move(e.file));
  return result;
}

}  // namespace barge::orchestrate
