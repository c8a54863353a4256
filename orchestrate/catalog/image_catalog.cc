// ImageCatalog: SQLite rows for images and their copies per disk; add, sync
// (bounded sends per sender, fewest active first), rescan, cleanup, and the
// recovery of rows whose sending process is gone.
#include "orchestrate/catalog/image_catalog.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "blockio/env.h"
#include "blockio/path.h"
#include "blockio/thread.h"
#include "formats/image.h"
#include "orchestrate/catalog/backup_catalog.h"
#include "orchestrate/catalog/image_upload.h"
#include "orchestrate/base/file_lock.h"
#include "orchestrate/base/sqlite_db.h"
#include "pipeline/endpoints.h"

namespace barge::orchestrate {

namespace {

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS images (
  name TEXT PRIMARY KEY,
  source TEXT NOT NULL,
  expected_sha512 TEXT NOT NULL DEFAULT '',
  sha512 TEXT NOT NULL DEFAULT '',
  format TEXT NOT NULL DEFAULT '',
  virtual_size INTEGER NOT NULL DEFAULT 0,
  created INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS image_copies (
  image TEXT NOT NULL REFERENCES images(name) ON DELETE CASCADE,
  disk TEXT NOT NULL,
  path TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'in-progress', 'ready', 'failed')),
  percent REAL NOT NULL DEFAULT 0,
  message TEXT NOT NULL DEFAULT '',
  sender TEXT NOT NULL DEFAULT '',
  updated INTEGER NOT NULL,
  unused_since INTEGER NOT NULL DEFAULT 0,
  owner TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (image, disk)
);
CREATE TABLE IF NOT EXISTS image_add_failures (
  image TEXT PRIMARY KEY,
  disk TEXT NOT NULL,
  source TEXT NOT NULL,
  message TEXT NOT NULL,
  updated INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS image_senders (
  image TEXT NOT NULL REFERENCES images(name) ON DELETE CASCADE,
  sender TEXT NOT NULL,
  sends INTEGER NOT NULL DEFAULT 0,
  max_concurrent INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (image, sender)
);
)sql";

constexpr const char* kCopyColumns =
    "image, disk, path, state, percent, message, sender, updated, unused_since, owner, bytes_done, bytes_total";

ImageCopyRecord CopyFromRow(const SqliteStatement& s) {
  ImageCopyRecord r;
  r.image = s.Text(0);
  r.disk = s.Text(1);
  r.path = s.Text(2);
  r.state = s.Text(3);
  r.percent = s.Real(4);
  r.message = s.Text(5);
  r.sender = s.Text(6);
  r.updated = s.Int(7);
  r.unused_since = s.Int(8);
  r.owner = s.Text(9);
  r.bytes_done = static_cast<uint64_t>(s.Int(10));
  r.bytes_total = static_cast<uint64_t>(s.Int(11));
  return r;
}

// Creates the tables, and adds the columns that older versions lacked
// (image_copies.owner, bytes_done, bytes_total), in one transaction so
// that two processes opening an old catalog at once do not both alter it.
Status CreateOrMigrate(SqliteDb& db) {
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(db));
  BARGE_RETURN_IF_ERROR(db.Exec(kSchema));
  for (const auto& [column, type] : {std::pair<const char*, const char*>{"owner", "TEXT NOT NULL DEFAULT ''"},
                                     {"bytes_done", "INTEGER NOT NULL DEFAULT 0"},
                                     {"bytes_total", "INTEGER NOT NULL DEFAULT 0"}}) {
    bool has = false;
    {
      BARGE_ASSIGN_OR_RETURN(auto st, db.Prepare("SELECT 1 FROM pragma_table_info('image_copies') WHERE name = ?1"));
      st.Bind(1, std::string(column));
      BARGE_ASSIGN_OR_RETURN(has, st.Step());
    }
    if (!has) {
      BARGE_RETURN_IF_ERROR(
          db.Exec(std::string("ALTER TABLE image_copies ADD COLUMN ") + column + " " + type));
    }
  }
  return tx->Commit();
}

Status SetCopy(SqliteDb& db, const ImageCopyRecord& r) {
  BARGE_ASSIGN_OR_RETURN(
      auto s, db.Prepare("INSERT INTO image_copies (image, disk, path, state, percent, message, sender, updated, "
                         "unused_since, owner, bytes_done, bytes_total) "
                         "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) "
                         "ON CONFLICT (image, disk) DO UPDATE SET "
                         "path = ?3, state = ?4, percent = ?5, message = ?6, sender = ?7, "
                         "updated = ?8, unused_since = ?9, owner = ?10, bytes_done = ?11, bytes_total = ?12"));
  return s.Bind(1, r.image).Bind(2, r.disk).Bind(3, r.path).Bind(4, r.state).BindReal(5, r.percent)
      .Bind(6, r.message).Bind(7, r.sender).Bind(8, r.updated).Bind(9, r.unused_since).Bind(10, r.owner)
      .Bind(11, static_cast<int64_t>(r.bytes_done)).Bind(12, static_cast<int64_t>(r.bytes_total)).Run();
}

// The progress of a copy in progress: one short UPDATE (the catalog is in
// WAL mode, so readers such as `image status` are not blocked).
Status SetProgress(SqliteDb& db, const std::string& image, const std::string& disk, uint64_t done,
                   uint64_t total) {
  const double percent = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
  BARGE_ASSIGN_OR_RETURN(
      auto s, db.Prepare("UPDATE image_copies SET percent = ?3, bytes_done = ?4, bytes_total = ?5 "
                         "WHERE image = ?1 AND disk = ?2"));
  return s.Bind(1, image).Bind(2, disk).BindReal(3, percent).Bind(4, static_cast<int64_t>(done))
      .Bind(5, static_cast<int64_t>(total)).Run();
}

// Rows of `image` ("" = all) on `disk` ("" = all); with `unfinished`, only
// pending and in-progress ones.
Result<std::vector<ImageCopyRecord>> CopiesOf(SqliteDb& db, const std::string& image, const std::string& disk = "",
                                              bool unfinished = false) {
  std::string sql = std::string("SELECT ") + kCopyColumns +
                    " FROM image_copies WHERE (?1 = '' OR image = ?1) AND (?2 = '' OR disk = ?2)" +
                    (unfinished ? " AND state IN ('pending', 'in-progress')" : "") + " ORDER BY image, disk";
  BARGE_ASSIGN_OR_RETURN(auto s, db.Prepare(sql));
  s.Bind(1, image).Bind(2, disk);
  std::vector<ImageCopyRecord> out;
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    out.push_back(CopyFromRow(s));
  }
}

Result<std::vector<ImageRecord>> ImagesOf(SqliteDb& db, const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(
      auto s, db.Prepare("SELECT name, source, expected_sha512, sha512, format, virtual_size, created FROM images "
                         "WHERE (?1 = '' OR name = ?1) ORDER BY name"));
  s.Bind(1, name);
  std::vector<ImageRecord> out;
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Text(4), static_cast<uint64_t>(s.Int(5)),
                   s.Int(6)});
  }
}

Status ValidName(const std::string& name) {
  if (name.empty() || name.size() > 200 || name[0] == '.' ||
      !std::all_of(name.begin(), name.end(),
                   [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; })) {
    return Error::InvalidArgument("image name must be 1..200 of [A-Za-z0-9._-], not starting with '.': '" +
                                  name + "'");
  }
  return OkStatus();
}

// The extension of a source file (".qcow2", ".raw", ".img"), of an http(s)
// URL's path (its query and fragment aside) alike; "." + `format` for an
// upload on standard input (the format its first bytes show, recorded
// as the image's); "" for another URI, a name without one, or anything but
// a short run of letters and digits.
std::string SourceExtension(const std::string& source, const std::string& format = "") {
  if (source == kUploadSource) return format.empty() ? "" : "." + format;
  std::string path = source;
  if (IsHttpUrl(source)) {
    path = source.substr(0, source.find_first_of("?#"));
    path = path.substr(path.find("://") + 3);
    const size_t slash = path.find('/');
    path = slash == std::string::npos ? "" : path.substr(slash);
  } else if (source.find("://") != std::string::npos) {
    return "";
  }
  const std::string ext = Extension(path);
  if (ext.size() < 2 || ext.size() > 9 ||
      !std::all_of(ext.begin() + 1, ext.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); })) {
    return "";
  }
  return ext;
}

// Image `name`'s copy in `disk`: the name with its source's extension
// (base -> base.qcow2, base.qcow2 -> base.qcow2.qcow2), so the file says its
// format to people and tools; the name alone when the source has none.
// `format`: the image's, for an upload (SourceExtension).
// Given the source, the name is the file less that extension
// (ImageNameOf); two images whose sources differ may still map to one file
// (`a` from x.qcow2, `a.qcow2` from an NBD URI), which add and sync refuse
// (CopyHolder).
std::string CopyPath(const std::string& disk, const std::string& name, const std::string& source,
                     const std::string& format = "") {
  return JoinPath(disk, name + SourceExtension(source, format));
}

// CopyPath's reverse: the image whose copy from `source` is the file
// `file` (a name in a disk folder). A copy made before copies kept their
// source's extension is the name alone; an upload's copy ends in .qcow2 or
// .raw.
std::string ImageNameOf(const std::string& file, const std::string& source) {
  if (source == kUploadSource) {
    for (const std::string ext : {".qcow2", ".raw"}) {
      if (file.size() > ext.size() && file.ends_with(ext)) return file.substr(0, file.size() - ext.size());
    }
    return file;
  }
  const std::string ext = SourceExtension(source);
  if (ext.empty() || file.size() <= ext.size() || !file.ends_with(ext)) return file;
  return file.substr(0, file.size() - ext.size());
}

// The image other than `name` whose copy on `disk` is (or is being sent to)
// `path`; "" when none. A failed row holds no file.
Result<std::string> CopyHolder(SqliteDb& db, const std::string& disk, const std::string& path,
                               const std::string& name) {
  BARGE_ASSIGN_OR_RETURN(auto s, db.Prepare("SELECT image FROM image_copies WHERE disk = ?1 AND path = ?2 AND "
                                            "image != ?3 AND state != 'failed' ORDER BY image LIMIT 1"));
  s.Bind(1, disk).Bind(2, path).Bind(3, name);
  BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? s.Text(0) : std::string();
}

// Why image `name` may not be copied to `path`, the copy of `holder`.
std::string TakenMessage(const std::string& name, const std::string& path, const std::string& holder) {
  return "image '" + name + "' would be copied to " + path + ", the copy of image '" + holder +
         "' (one file name from two sources); add the image under another name";
}

// The backing file `qcow2` names, resolved against its folder; "" if none
// or not a qcow2 file; the error when the file cannot be read.
Result<std::string> BackingOf(Env& env, const std::string& qcow2) {
  // ProbeQcow2Layer takes a file it cannot open or read for one that is not
  // a qcow2, which here would read "does not use the copy": open it and
  // read its magic first, and hand the probe that open file.
  BARGE_ASSIGN_OR_RETURN(std::unique_ptr<BlockSource> file, env.OpenSource(qcow2));
  if (file->size_bytes() >= 4) {
    std::array<std::byte, 4> magic;
    BARGE_RETURN_IF_ERROR(file->ReadAt(0, magic));
  }
  auto opener = [&](const std::string& path) -> Result<std::unique_ptr<BlockSource>> {
    if (file != nullptr && path == qcow2) return std::move(file);
    return env.OpenSource(path);
  };
  BARGE_ASSIGN_OR_RETURN(auto info, formats::ProbeQcow2Layer(qcow2, opener));
  if (!info || info->backing_file.empty()) return std::string();
  return CanonicalPath(env, JoinPath(DirName(qcow2), info->backing_file));
}

// Every regular file under `dir` (links to files included; linked folders
// are not entered).
Status ListFilesUnder(Env& env, const std::string& dir, std::vector<std::string>& out) {
  BARGE_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDir(dir));
  for (const std::string& name : names) {
    std::string path = JoinPath(dir, name);
    BARGE_ASSIGN_OR_RETURN(FileStat st, env.StatNoFollow(path));
    if (st.is_directory()) {
      BARGE_RETURN_IF_ERROR(ListFilesUnder(env, path, out));
    } else if (st.is_regular() || (st.is_symlink() && env.Stat(path).ok() && env.Stat(path)->is_regular())) {
      out.push_back(std::move(path));
    }
  }
  return OkStatus();
}

}  // namespace

ImageCatalog::ImageCatalog(Env& env, std::unique_ptr<SqliteDb> db, std::string catalog_path)
    : env_(env), db_(std::move(db)), catalog_path_(std::move(catalog_path)) {}
ImageCatalog::~ImageCatalog() = default;

Result<std::unique_ptr<ImageCatalog>> ImageCatalog::Open(Env& env, const std::string& db_path) {
  BARGE_ASSIGN_OR_RETURN(auto db, SqliteDb::Open(env, db_path));
  BARGE_RETURN_IF_ERROR(CreateOrMigrate(*db));
  return std::unique_ptr<ImageCatalog>(
      new ImageCatalog(env, std::move(db), db_path));
}

std::string ImageCatalog::DiskKey(const std::string& disk) { return CanonicalPath(env_, disk); }

Status ImageCatalog::RecordCopy(const ImageCopyRecord& copy) {
  std::lock_guard lock(mu_);
  return SetCopy(*db_, copy);
}

std::function<void(size_t, uint64_t, uint64_t)> ImageCatalog::PercentRecorder(const ImageCopyRecord& copy) {
  return [this, image = copy.image, disk = copy.disk, last = std::chrono::steady_clock::now()](
             size_t, uint64_t done, uint64_t total) mutable {
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::seconds(1)) return;
    last = now;
    std::lock_guard lock(mu_);
    IgnoreError(SetProgress(*db_, image, disk, done, total),
                "a progress note; the copy's state is recorded at its end, with its error checked");
  };
}

std::string ImageCatalog::LockPath(const std::string& name) const {
  return CatalogLockPath(catalog_path_, LockKind::kImage, name);
}

Result<std::vector<ImageRecord>> ImageCatalog::Images(const std::string& name) {
  std::lock_guard lock(mu_);
  return ImagesOf(*db_, name);
}

Result<std::vector<ImageCopyRecord>> ImageCatalog::Copies(const std::string& name) {
  std::lock_guard lock(mu_);
  return CopiesOf(*db_, name);
}

Result<std::vector<SenderRecord>> ImageCatalog::Senders(const std::string& name) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(
      auto s, db_->Prepare("SELECT image, sender, sends, max_concurrent FROM image_senders "
                           "WHERE (?1 = '' OR image = ?1) ORDER BY image, sender"));
  s.Bind(1, name);
  std::vector<SenderRecord> out;
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    out.push_back({s.Text(0), s.Text(1), static_cast<int>(s.Int(2)), static_cast<int>(s.Int(3))});
  }
}

Result<std::optional<FailedAddRecord>> ImageCatalog::FailedAdd(const std::string& name) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(
      auto s, db_->Prepare("SELECT image, disk, source, message, updated FROM image_add_failures WHERE image = ?1"));
  s.Bind(1, name);
  BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<FailedAddRecord>();
  return std::optional<FailedAddRecord>(FailedAddRecord{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4)});
}

Result<std::vector<ImageCopyRecord>> ImageCatalog::RecoverInterrupted(const std::string& name) {
  return Recover(name, "");
}

Result<std::vector<ImageCopyRecord>> ImageCatalog::Recover(const std::string& name, const std::string& held) {
  std::map<std::string, std::vector<ImageCopyRecord>> gone;  // by image
  {
    std::lock_guard lock(mu_);
    BARGE_ASSIGN_OR_RETURN(auto rows, CopiesOf(*db_, name, "", /*unfinished=*/true));
    for (auto& r : rows) {
      if (OwnerIsGone(env_, r.owner)) gone[r.image].push_back(std::move(r));
    }
  }
  std::vector<ImageCopyRecord> recovered;
  for (auto& [image, rows] : gone) {
    // Holding the image's lock keeps a new add or sync from claiming these
    // rows (and writing these temporaries) while we mark and remove them.
    // A lock held elsewhere means a live add or sync, which recovered the
    // image's rows itself when it started.
    std::unique_ptr<EnvLock> image_lock;
    if (image != held) {
      if (!ValidName(image).ok()) continue;
      auto l = TryLockFile(env_, LockPath(image), "image " + image + " is busy");
      if (!l.ok() && l.error().code() == ErrorCode::kBusy) continue;
      if (!l.ok()) return l.error();
      image_lock = std::move(l).value();
    }
    for (ImageCopyRecord& r : rows) {
      {
        // Only if the row is still the one we judged: same state, same owner.
        std::lock_guard lock(mu_);
        BARGE_ASSIGN_OR_RETURN(
            auto s, db_->Prepare("UPDATE image_copies SET state = 'failed', message = ?5, owner = '', updated = ?6 "
                                 "WHERE image = ?1 AND disk = ?2 AND state = ?3 AND owner = ?4"));
        BARGE_RETURN_IF_ERROR(s.Bind(1, r.image).Bind(2, r.disk).Bind(3, r.state).Bind(4, r.owner)
                                  .Bind(5, std::string(kInterruptedMessage)).Bind(6, Now()).Run());
        if (db_->Changes() == 0) continue;
      }
      // What a killed RunReplicate leaves: the hidden temporaries of the copy
      // and of its checksum record (pipeline/staged_file.h). The final names
      // are left alone: a replaced copy keeps its old file until the rename.
      // Only while no live writer holds them (a replicate run may write the
      // same path outside the catalog).
      // A copy's temporary that a resume journal names stays for the next
      // sync to resume from (docs/formats/resume.md); that sync checks it.
      const bool resumable = env_.Exists(pipeline::ReplicaJournalPath(r.path));
      for (const std::string& temp : {TempPathFor(r.path), TempPathFor(pipeline::ReplicaRecordPath(r.path))}) {
        if (resumable && temp == TempPathFor(r.path)) continue;
        LockOptions o;
        o.create = false;
        if (auto held = env_.LockFile(temp, o); held.ok()) BARGE_RETURN_IF_ERROR(env_.UnlinkIfExists(temp));
      }
      recovered.push_back(std::move(r));
    }
  }
  return recovered;
}

Result<ImageCopyRecord> ImageCatalog::Add(const std::string& name, const std::string& source,
                                          const std::string& expected_sha512, const std::string& disk,
                                          const pipeline::ReplicateOptions& options, const UploadSpec& upload) {
  BARGE_RETURN_IF_ERROR(ValidName(name));
  BARGE_RETURN_IF_ERROR(env_.CreateDirs(disk));
  BARGE_ASSIGN_OR_RETURN(auto image_lock, TryLockFile(env_, LockPath(name), "an image add or sync of " + name +
                                                                                " is already running"));
  BARGE_RETURN_IF_ERROR(Recover(name, name));
  // An upload's first bytes say its format, and so its copy's name.
  const bool uploaded = source == kUploadSource;
  std::optional<UploadHead> head;
  if (uploaded) {
    BARGE_ASSIGN_OR_RETURN(head, ReadUploadHead(upload));
  }
  ImageCopyRecord copy{name, DiskKey(disk), CopyPath(DiskKey(disk), name, source, head ? head->format : ""),
                       "in-progress", 0, "", "", Now(), 0, ProcessOwner::Self(env_).Encode()};
  // The origin as recorded: a URL without credentials (image sync may
  // download it again).
  const std::string origin = IsHttpUrl(source) ? RedactHttpUrl(source) : source;
  {
    std::lock_guard lock(mu_);
    BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
    BARGE_ASSIGN_OR_RETURN(auto existing, ImagesOf(*db_, name));
    if (!existing.empty()) {
      BARGE_ASSIGN_OR_RETURN(auto copies, CopiesOf(*db_, name));
      for (const auto& c : copies) {
        if (c.state == "ready" || c.state == "in-progress") {
          return Error::InvalidArgument("image '" + name + "' exists (has a " + c.state + " copy on " + c.disk +
                                        "); use image sync to deliver it");
        }
      }
      BARGE_ASSIGN_OR_RETURN(auto del, db_->Prepare("DELETE FROM images WHERE name = ?1"));
      BARGE_RETURN_IF_ERROR(del.Bind(1, name).Run());
    }
    // Checked and claimed in one transaction: an add or sync of another
    // image holds only that image's lock.
    BARGE_ASSIGN_OR_RETURN(std::string holder, CopyHolder(*db_, copy.disk, copy.path, name));
    if (!holder.empty()) return Error::InvalidArgument(TakenMessage(name, copy.path, holder)).set_path(copy.path);
    BARGE_ASSIGN_OR_RETURN(
        auto ins, db_->Prepare("INSERT INTO images (name, source, expected_sha512, created) VALUES (?1, ?2, ?3, ?4)"));
    BARGE_RETURN_IF_ERROR(ins.Bind(1, name).Bind(2, origin).Bind(3, expected_sha512).Bind(4, Now()).Run());
    BARGE_RETURN_IF_ERROR(SetCopy(*db_, copy));
    BARGE_RETURN_IF_ERROR(tx->Commit());
  }
  pipeline::ReplicateOptions o = options;
  o.expected_sha512 = expected_sha512;
  o.force = true;  // the file is this image's: no other image's row names it (CopyHolder above)
  o.source_location = source;
  // A failed add leaves no row: the image has no copy (and had none ready:
  // see above), so it is not in the catalog. Why it failed is kept apart
  // (FailedAdd), for `image status NAME`.
  auto finish = [&](Error e) -> Result<ImageCopyRecord> {
    std::lock_guard lock(mu_);
    auto forget = [&]() -> Status {
      BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
      for (const char* sql : {"DELETE FROM image_copies WHERE image = ?1", "DELETE FROM image_senders WHERE image = ?1",
                              "DELETE FROM images WHERE name = ?1"}) {
        BARGE_ASSIGN_OR_RETURN(auto del, db_->Prepare(sql));
        BARGE_RETURN_IF_ERROR(del.Bind(1, name).Run());
      }
      BARGE_ASSIGN_OR_RETURN(
          auto failed, db_->Prepare("INSERT INTO image_add_failures (image, disk, source, message, updated) "
                                    "VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (image) DO UPDATE SET "
                                    "disk = ?2, source = ?3, message = ?4, updated = ?5"));
      BARGE_RETURN_IF_ERROR(failed.Bind(1, name).Bind(2, copy.disk).Bind(3, origin).Bind(4, e.ToString())
                                .Bind(5, Now()).Run());
      return tx->Commit();
    };
    return std::move(e.Also(forget()));
  };
  pipeline::SourceSpec spec;
  spec.location = source;
  spec.http = options.source_http;
  // What cannot be read in place (an upload, a download without byte
  // ranges) is staged beside the catalog, never at a guessable name.
  const std::string stage_dir = DirName(catalog_path_);
  if (spec.http.stage_dir.empty()) spec.http.stage_dir = stage_dir;
  auto src = uploaded ? OpenUpload(env_, stage_dir, upload, *head) : pipeline::OpenSource(env_, spec);
  if (!src.ok()) return finish(src.error());
  o.source_format = src->format_name();
  // A stream is read once: an upload that failed is sent again, whole.
  if (uploaded) o.resume = false;
  // A staged part of a download resumes only from the same version.
  if (!src->remote_version.empty()) o.resume_identity = src->remote_version;
  o.progress = PercentRecorder(copy);
  std::vector<std::string> dests = {copy.path};
  auto r = pipeline::RunReplicate(env_, *src->image, dests, o);
  if (!r.ok()) return finish(r.error());
  const auto& rep = r->replicas[0];
  if (rep.state == pipeline::ReplicaState::kFailed) return finish(*rep.error);
  copy.state = "ready";
  copy.percent = 100;
  copy.bytes_done = copy.bytes_total = r->virtual_size;
  copy.updated = Now();
  copy.owner.clear();
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
  BARGE_ASSIGN_OR_RETURN(
      auto up, db_->Prepare("UPDATE images SET sha512 = ?2, format = ?3, virtual_size = ?4 WHERE name = ?1"));
  BARGE_RETURN_IF_ERROR(up.Bind(1, name).Bind(2, r->sha512_hex).Bind(3, r->format)
                            .Bind(4, static_cast<int64_t>(r->virtual_size)).Run());
  BARGE_RETURN_IF_ERROR(SetCopy(*db_, copy));
  BARGE_ASSIGN_OR_RETURN(auto forget_failure, db_->Prepare("DELETE FROM image_add_failures WHERE image = ?1"));
  BARGE_RETURN_IF_ERROR(forget_failure.Bind(1, name).Run());
  BARGE_RETURN_IF_ERROR(tx->Commit());
  return copy;
}

// One Sync of an image: its senders (ready copies), the disks it sends to,
// and the dispatch's shared state. Lives in Sync's frame; the send threads
// it starts are joined before Dispatch returns.
struct ImageCatalog::SyncRun {
  struct Sender {
    std::string path;
    int active = 0;
    int max_concurrent = 0;
    int sends = 0;
  };

  SyncRun(ImageCatalog& catalog, const std::string& name, const SyncOptions& options)
      : catalog(catalog), name(name), options(options), owner(ProcessOwner::Self(catalog.env_).Encode()) {}

  // Reads the image, its senders and claims a pending row for each disk
  // in `disks` that lacks a copy, in one hold of the catalog.
  Status Plan(const std::vector<std::string>& disks);
  // The image's ready copies whose records match; needs mu_ held.
  Status FindSenders();
  // A pending row for each disk asked for, or a failed one for a disk that
  // cannot take the copy; needs mu_ held.
  Status ClaimDisks(const std::vector<std::string>& disks);
  // Sends to every pending disk, and waits for the sends.
  void Dispatch();
  // The least busy sender under the limit; senders.size() when none is free.
  size_t PickSender() const;
  // Starts the send of the next pending disk from sender `best`; needs m held.
  void StartSend(size_t best);
  // One send (a thread): replicates from the sender to the copy and records
  // the copy's state.
  void Send(ImageCopyRecord copy, size_t sender_index, std::string sender_path);
  // Replicates `spec` (opened here) to `copy` with `o` (its progress
  // recorded) and sets the copy's state, message and times; the error,
  // if it failed. Records nothing.
  std::optional<Error> CopyFrom(const pipeline::SourceSpec& spec, pipeline::ReplicateOptions o,
                                ImageCopyRecord& copy);
  // No ready copy left: downloads the image again from `origin` to the
  // first pending disk, which then sends to the others; on failure that
  // disk and the others are failed and origin_error says why.
  void DownloadFromOrigin();
  // Cancelled (or nothing to send from): the disks not sent to fail now,
  // with `why`, not as "interrupted" rows left to the next recovery.
  void FailUnsent(const std::string& why);
  // Records this sync's senders and returns the copies of the disks asked for.
  Result<SyncResult> Finish();

  ImageCatalog& catalog;
  const std::string& name;
  const SyncOptions& options;
  const std::string owner;
  ImageRecord image;
  std::vector<Sender> senders;
  std::deque<ImageCopyRecord> pending;
  std::vector<std::string> keys;
  // The dispatch's state, guarded by m.
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::thread> threads;
  int running = 0;
  std::optional<Error> record_error;  // the first state the catalog failed to record
  // The image's origin URL when no ready copy is left ("" otherwise), and
  // why downloading it again failed.
  std::string origin;
  std::optional<Error> origin_error;
  std::string downloaded_from;
};

Status ImageCatalog::SyncRun::Plan(const std::vector<std::string>& disks) {
  std::lock_guard lock(catalog.mu_);
  if (Status found = FindSenders(); !found.ok()) {
    // No ready copy: an image that came from a URL comes from it again.
    if (found.error().code() != ErrorCode::kNotFound || image.name.empty() || !IsHttpUrl(image.source)) {
      return found;
    }
    if (image.sha512.empty() && image.expected_sha512.empty()) {
      return std::move(found).error().Wrap("no SHA-512 to check a download from its origin against");
    }
    origin = image.source;
  }
  return ClaimDisks(disks);
}

Status ImageCatalog::SyncRun::FindSenders() {
  SqliteDb& db = *catalog.db_;
  BARGE_ASSIGN_OR_RETURN(auto images, ImagesOf(db, name));
  if (images.empty()) return Error::NotFound("no image '" + name + "' in the catalog");
  image = images[0];
  BARGE_ASSIGN_OR_RETURN(auto copies, CopiesOf(db, name));
  // A ready copy whose record cannot be read (an I/O error, not a missing
  // record) is no sender; when it was the only one, that error is the
  // answer, not NotFound (found by the reliability campaign).
  std::optional<Error> unreadable;
  for (const auto& c : copies) {
    auto rec = pipeline::ReadReplicaRecord(catalog.env_, c.path);
    if (c.state == "ready" && rec.ok() && pipeline::FileMatchesRecord(catalog.env_, c.path, *rec) &&
        rec->sha512 == image.sha512) {
      senders.push_back({c.path});
    } else if (c.state == "ready" && !rec.ok() && rec.error().code() != ErrorCode::kNotFound && !unreadable) {
      unreadable = rec.error();
    }
  }
  if (senders.empty() && unreadable) {
    return std::move(*unreadable).Wrap("image '" + name + "' has no ready copy to send from");
  }
  if (senders.empty()) return Error::NotFound("image '" + name + "' has no ready copy to send from");
  return OkStatus();
}

Status ImageCatalog::SyncRun::ClaimDisks(const std::vector<std::string>& disks) {
  SqliteDb& db = *catalog.db_;
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(db));
  for (const std::string& d : disks) {
    Status made = catalog.env_.CreateDirs(d);
    std::string key = catalog.DiskKey(d);
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    keys.push_back(key);
    std::string path = CopyPath(key, name, image.source, image.format);
    if (std::any_of(senders.begin(), senders.end(), [&](const Sender& s) { return s.path == path; })) continue;
    ImageCopyRecord c{name, key, path, "pending", 0, "", "", Now(), 0, owner};
    BARGE_ASSIGN_OR_RETURN(std::string holder, CopyHolder(db, key, path, name));
    if (!made.ok() || !holder.empty()) {
      // This disk cannot take a copy; the others still can.
      c.state = "failed";
      c.message = made.ok() ? TakenMessage(name, path, holder) : made.error().ToString();
      c.owner.clear();
      BARGE_RETURN_IF_ERROR(SetCopy(db, c));
      continue;
    }
    BARGE_RETURN_IF_ERROR(SetCopy(db, c));
    pending.push_back(std::move(c));
  }
  return tx->Commit();
}

void ImageCatalog::SyncRun::Send(ImageCopyRecord copy, size_t sender_index, std::string sender_path) {
  pipeline::ReplicateOptions o = options.replicate;
  o.expected_sha512 = image.sha512;
  o.force = true;  // the file is this image's: no other image's row names it (CopyHolder)
  o.source_location = sender_path;
  // A send cut short resumes on the next sync from whichever copy sends
  // it then: the image's content is what the staged part must be of.
  o.resume_identity = "image " + image.name + " sha512:" + image.sha512;
  pipeline::SourceSpec spec;
  spec.location = sender_path;
  spec.format = image.format;
  std::optional<Error> error = CopyFrom(spec, std::move(o), copy);
  Status recorded = catalog.RecordCopy(copy);
  std::lock_guard lock(m);
  if (!recorded.ok() && !record_error) record_error = std::move(recorded).error();
  senders[sender_index].active--;
  if (!error) senders.push_back({copy.path});
  --running;
  cv.notify_all();
}

std::optional<Error> ImageCatalog::SyncRun::CopyFrom(const pipeline::SourceSpec& spec, pipeline::ReplicateOptions o,
                                                      ImageCopyRecord& copy) {
  o.progress = catalog.PercentRecorder(copy);
  std::optional<Error> error;
  auto src = pipeline::OpenSource(catalog.env_, spec);
  if (!src.ok()) {
    error = src.error();
  } else {
    o.source_format = src->format_name();
    std::vector<std::string> dests = {copy.path};
    auto r = pipeline::RunReplicate(catalog.env_, *src->image, dests, o);
    if (!r.ok()) error = r.error();
    else if (r->replicas[0].state == pipeline::ReplicaState::kFailed) error = *r->replicas[0].error;
  }
  copy.state = error ? "failed" : "ready";
  copy.message = error ? error->ToString() : "";
  copy.percent = error ? copy.percent : 100;
  if (!error) copy.bytes_done = copy.bytes_total = image.virtual_size;
  copy.updated = Now();
  copy.owner.clear();
  return error;
}

void ImageCatalog::SyncRun::DownloadFromOrigin() {
  ImageCopyRecord copy = std::move(pending.front());
  pending.pop_front();
  copy.state = "in-progress";
  copy.sender = origin;
  copy.updated = Now();
  copy.owner = owner;
  if (Status recorded = catalog.RecordCopy(copy); !recorded.ok() && !record_error) {
    record_error = std::move(recorded).error();
  }
  pipeline::ReplicateOptions o = options.replicate;
  o.expected_sha512 = image.sha512.empty() ? image.expected_sha512 : image.sha512;
  o.force = true;  // the file is this image's (ClaimDisks checked)
  o.source_location = origin;
  // As a send: the content is pinned by the SHA-512 checked at the end, so
  // a download cut short resumes on the next sync, from a copy or the origin.
  o.resume_identity = "image " + image.name + " sha512:" + o.expected_sha512;
  pipeline::SourceSpec spec;
  spec.location = origin;
  spec.format = image.format;
  spec.http = options.origin_http;
  std::optional<Error> error = CopyFrom(spec, std::move(o), copy);
  if (Status recorded = catalog.RecordCopy(copy); !recorded.ok() && !record_error) {
    record_error = std::move(recorded).error();
  }
  if (error) {
    origin_error = std::move(*error).Wrap("image '" + name + "' has no ready copy; downloading it again from its origin");
    FailUnsent("not sent: the image has no ready copy and downloading it from its origin failed");
    return;
  }
  downloaded_from = origin;
  senders.push_back({copy.path});
}

void ImageCatalog::SyncRun::FailUnsent(const std::string& why) {
  std::lock_guard db_lock(catalog.mu_);
  for (ImageCopyRecord& copy : pending) {
    copy.state = "failed";
    copy.message = why;
    copy.updated = Now();
    copy.owner.clear();
    IgnoreError(SetCopy(*catalog.db_, copy),
                "the row stays in progress; the next command marks it failed (interrupted)");
  }
  pending.clear();
}

size_t ImageCatalog::SyncRun::PickSender() const {
  size_t best = senders.size();
  for (size_t i = 0; i < senders.size(); ++i) {
    if (senders[i].active >= options.max_sends_per_sender) continue;
    if (best == senders.size() || senders[i].active < senders[best].active) best = i;
  }
  return best;
}

void ImageCatalog::SyncRun::StartSend(size_t best) {
  ImageCopyRecord copy = std::move(pending.front());
  pending.pop_front();
  Sender& s = senders[best];
  s.active++;
  s.sends++;
  s.max_concurrent = std::max(s.max_concurrent, s.active);
  copy.state = "in-progress";
  copy.sender = s.path;
  copy.updated = Now();
  copy.owner = owner;
  if (Status recorded = catalog.RecordCopy(copy); !recorded.ok() && !record_error) {
    record_error = std::move(recorded).error();
  }
  ++running;
  auto thread = StartThread(
      "image send", [this](ImageCopyRecord c, size_t i, std::string p) { Send(std::move(c), i, std::move(p)); },
      copy, best, s.path);
  if (!thread.ok()) {
    // Not sent: this copy fails with the reason; the next may fare better.
    --running;
    --s.active;
    --s.sends;
    copy.state = "failed";
    copy.message = thread.error().ToString();
    copy.updated = Now();
    copy.owner.clear();
    std::lock_guard db_lock(catalog.mu_);
    IgnoreError(SetCopy(*catalog.db_, copy),
                "the row stays in progress; the next command marks it failed (interrupted)");
    return;
  }
  threads.push_back(std::move(thread).value());
}

// The sender with the fewest active sends under the limit takes the next
// disk; a copy that becomes ready joins the senders.
void ImageCatalog::SyncRun::Dispatch() {
  const std::atomic<bool>* cancel = options.replicate.copy.cancel;
  if (senders.empty() && !origin.empty() && !pending.empty()) DownloadFromOrigin();
  {
    std::unique_lock lock(m);
    senders.reserve(senders.size() + pending.size());  // indexes stay valid; no reallocation
    while (!pending.empty()) {
      if (cancel && cancel->load()) {
        FailUnsent("cancelled before its send started");
        break;
      }
      size_t best = PickSender();
      if (best == senders.size()) {
        cv.wait_for(lock, std::chrono::milliseconds(100));  // and look at `cancel` again
        continue;
      }
      StartSend(best);
    }
    cv.wait(lock, [&] { return running == 0; });
  }
  for (auto& t : threads) t.join();
}

Result<SyncResult> ImageCatalog::SyncRun::Finish() {
  SyncResult result;
  result.downloaded_from = downloaded_from;
  std::lock_guard lock(catalog.mu_);
  SqliteDb& db = *catalog.db_;
  for (const Sender& s : senders) {
    if (s.sends == 0) continue;
    result.senders.push_back({name, s.path, s.sends, s.max_concurrent});
    BARGE_ASSIGN_OR_RETURN(
        auto up, db.Prepare("INSERT INTO image_senders (image, sender, sends, max_concurrent) VALUES (?1, ?2, ?3, ?4) "
                            "ON CONFLICT (image, sender) DO UPDATE SET sends = sends + ?3, "
                            "max_concurrent = MAX(max_concurrent, ?4)"));
    BARGE_RETURN_IF_ERROR(up.Bind(1, name).Bind(2, s.path).Bind(3, int64_t{s.sends})
                              .Bind(4, int64_t{s.max_concurrent}).Run());
  }
  for (const std::string& key : keys) {
    BARGE_ASSIGN_OR_RETURN(auto rows, CopiesOf(db, name, key));
    for (auto& r : rows) result.copies.push_back(std::move(r));
  }
  return result;
}

Result<SyncResult> ImageCatalog::Sync(const std::string& name, const std::vector<std::string>& disks,
                                      const SyncOptions& options) {
  if (options.max_sends_per_sender < 1) return Error::InvalidArgument("max sends per sender must be >= 1");
  BARGE_RETURN_IF_ERROR(ValidName(name));
  // One sync (or add) of an image at a time, across processes: two would
  // both send to the same disks and each count only its own sends.
  BARGE_ASSIGN_OR_RETURN(auto image_lock,
                         TryLockFile(env_, LockPath(name), "an image sync of " + name + " is already running"));
  BARGE_RETURN_IF_ERROR(Recover(name, name));
  SyncRun run(*this, name, options);
  BARGE_RETURN_IF_ERROR(run.Plan(disks));
  run.Dispatch();
  if (run.record_error) {
    return std::move(*run.record_error).Wrap("image sync of " + name + ": recording a copy's state");
  }
  if (run.origin_error) return std::move(*run.origin_error);
  return run.Finish();
}

Status ImageCatalog::Rescan(const std::vector<std::string>& disks_arg) {
  BARGE_RETURN_IF_ERROR(Recover("", ""));
  std::lock_guard lock(mu_);
  std::vector<std::string> disks;
  for (const auto& d : disks_arg) disks.push_back(DiskKey(d));
  if (disks.empty()) {
    BARGE_ASSIGN_OR_RETURN(auto copies, CopiesOf(*db_, ""));
    for (const auto& c : copies) {
      if (std::find(disks.begin(), disks.end(), c.disk) == disks.end()) disks.push_back(c.disk);
    }
  }
  BARGE_ASSIGN_OR_RETURN(auto tx, SqliteTransaction::Begin(*db_));
  for (const std::string& disk : disks) {
    // Pending and in-progress rows left after the recovery belong to a live
    // add or sync (or to another host): kept as they are, file or not.
    std::set<std::string> live;  // images
    {
      BARGE_ASSIGN_OR_RETURN(auto rows, CopiesOf(*db_, "", disk, /*unfinished=*/true));
      for (const auto& r : rows) live.insert(r.image);
    }
    BARGE_ASSIGN_OR_RETURN(
        auto del, db_->Prepare("DELETE FROM image_copies WHERE disk = ?1 AND state NOT IN ('pending', 'in-progress')"));
    BARGE_RETURN_IF_ERROR(del.Bind(1, disk).Run());
    auto st = env_.Stat(disk);
    if (!st.ok() || !st->is_directory()) continue;
    const std::string suffix = ".sha512.json";
    BARGE_ASSIGN_OR_RETURN(std::vector<std::string> fnames, env_.ListDir(disk));
    for (const std::string& fname : fnames) {
      if (fname.size() <= suffix.size() || fname.compare(fname.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      const std::string file = fname.substr(0, fname.size() - suffix.size());
      const std::string path = JoinPath(disk, file);
      auto rec = pipeline::ReadReplicaRecord(env_, path);
      const std::string name = rec.ok() ? ImageNameOf(file, rec->source) : file;
      if (!ValidName(name).ok() || live.count(name)) continue;
      ImageCopyRecord c{name, disk, path, "ready", 100, "", "", Now(), 0, ""};
      if (!rec.ok()) {
        c.state = "failed";
        c.percent = 0;
        c.message = rec.error().ToString();
      } else if (!pipeline::FileMatchesRecord(env_, path, *rec)) {
        c.state = "failed";
        c.percent = 0;
        c.message = "file missing or changed since its checksum record";
      }
      BARGE_ASSIGN_OR_RETURN(
          auto ins, db_->Prepare("INSERT INTO images (name, source, sha512, format, virtual_size, created) "
                                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (name) DO UPDATE SET "
                                 "sha512 = CASE WHEN sha512 = '' THEN ?3 ELSE sha512 END"));
      BARGE_RETURN_IF_ERROR(ins.Bind(1, name).Bind(2, rec.ok() ? rec->source : std::string())
                                .Bind(3, rec.ok() ? rec->sha512 : std::string())
                                .Bind(4, rec.ok() ? rec->format : std::string())
                                .Bind(5, static_cast<int64_t>(rec.ok() ? rec->virtual_size : 0))
                                .Bind(6, Now()).Run());
      BARGE_RETURN_IF_ERROR(SetCopy(*db_, c));
    }
  }
  return tx->Commit();
}

Result<CleanupResult> ImageCatalog::Cleanup(std::chrono::seconds unused_for, bool dry_run) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(auto copies, CopiesOf(*db_, ""));
  CleanupResult result;
  result.dry_run = dry_run;
  int64_t now = Now();
  // Ready copies per image not removed (so far): the last one always stays.
  std::map<std::string, size_t> ready;
  for (const ImageCopyRecord& c : copies) ready[c.image] += c.state == "ready";
  auto record = [&](const ImageCopyRecord& c) { return dry_run ? OkStatus() : SetCopy(*db_, c); };
  for (ImageCopyRecord& c : copies) {
    if (c.state != "ready") continue;
    std::string target = CanonicalPath(env_, c.path);
    // A copy is in use while any qcow2 under its disk folder names it; a
    // folder that cannot be listed, or a file in it that cannot be read
    // (it may name the copy), stops the cleanup: never removed unseen
    // (found by the reliability campaign: an open that failed with EIO let
    // cleanup remove a VM disk's backing file).
    std::vector<std::string> files;
    if (Status listed = ListFilesUnder(env_, c.disk, files);
        !listed.ok() && listed.error().code() != ErrorCode::kNotFound) {
      return std::move(listed).error();
    }
    bool used = false;
    for (const std::string& f : files) {
      if (f == c.path) continue;
      BARGE_ASSIGN_OR_RETURN(std::string backing, BackingOf(env_, f));
      if (backing == target) {
        used = true;
        break;
      }
    }
    if (used) {
      c.unused_since = 0;
      result.in_use.push_back(c.path);
      BARGE_RETURN_IF_ERROR(record(c));
      continue;
    }
    if (c.unused_since == 0) c.unused_since = c.updated;
    if (now - c.unused_since < unused_for.count()) {
      result.waiting.push_back(c.path);
      BARGE_RETURN_IF_ERROR(record(c));
      continue;
    }
    if (ready[c.image] <= 1) {
      result.last_copy.push_back(c.path);
      BARGE_RETURN_IF_ERROR(record(c));
      continue;
    }
    auto image_lock = TryLockFile(env_, LockPath(c.image), "image " + c.image + " is busy");
    if (!image_lock.ok()) {
      if (image_lock.error().code() != ErrorCode::kBusy) return image_lock.error();
      result.busy.push_back(c.path);
      continue;
    }
    --ready[c.image];
    if (dry_run) {
      result.removed.push_back(c.path);
      continue;
    }
    // The record goes first: a file without one is never taken as ready.
    BARGE_RETURN_IF_ERROR(env_.UnlinkIfExists(pipeline::ReplicaRecordPath(c.path)));
    BARGE_RETURN_IF_ERROR(env_.UnlinkIfExists(c.path));
    // The removal is durable before the row goes: after a power loss, a
    // copy that came back still has its row, and the next cleanup removes
    // it (issue 13).
    BARGE_RETURN_IF_ERROR(env_.SyncDir(DirName(c.path)));
    BARGE_ASSIGN_OR_RETURN(auto del, db_->Prepare("DELETE FROM image_copies WHERE image = ?1 AND disk = ?2"));
    BARGE_RETURN_IF_ERROR(del.Bind(1, c.image).Bind(2, c.disk).Run());
    result.removed.push_back(c.path);
  }
  return result;
}

}  // namespace barge::orchestrate
