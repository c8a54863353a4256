// ImageCatalog: SQLite rows for images and their copies per disk; add, sync
// (bounded sends per sender, fewest active first), rescan and cleanup.
#include "orchestrate/image_catalog.h"

#include <sqlite3.h>

#include <algorithm>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>

#include "blockio/file.h"
#include "formats/image.h"
#include "pipeline/endpoints.h"

namespace barge::orchestrate {

namespace fs = std::filesystem;

namespace {

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// One prepared statement; binds are 1-based, columns 0-based.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& Bind(int i, const std::string& v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_text(stmt_, i, v.c_str(), -1, SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int i, int64_t v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  // true with a row, false when done.
  Result<bool> Step() {
    if (rc_ != SQLITE_OK) return Fail("prepare/bind");
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    rc_ = rc;
    return Fail("step");
  }
  Status Run() {
    while (true) {
      BARGE_ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return OkStatus();
    }
  }
  std::string Text(int c) const {
    auto* t = sqlite3_column_text(stmt_, c);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  int64_t Int(int c) const { return sqlite3_column_int64(stmt_, c); }
  double Real(int c) const { return sqlite3_column_double(stmt_, c); }

 private:
  Error Fail(const char* what) const {
    return Error::IoError(std::string("sqlite ") + what + ": " + sqlite3_errmsg(db_));
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  int rc_;
};

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
  PRIMARY KEY (image, disk)
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
    "image, disk, path, state, percent, message, sender, updated, unused_since";

ImageCopyRecord CopyFromRow(const Stmt& s) {
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
  return r;
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

std::string DiskKey(const std::string& disk) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(disk, ec), ec);
  return p.string();
}

std::string CopyPath(const std::string& disk, const std::string& name) { return (fs::path(disk) / name).string(); }

// The backing file `qcow2` names, resolved against its folder; "" if none
// or not a qcow2 file.
std::string BackingOf(const fs::path& qcow2) {
  char magic[4] = {};
  std::ifstream in(qcow2, std::ios::binary);
  in.read(magic, 4);
  if (in.gcount() != 4 || std::string_view(magic, 4) != std::string_view("QFI\xfb", 4)) return "";
  formats::OpenOptions o;
  o.format = formats::ImageFormat::kQcow2;
  o.open_backing = false;
  o.open_data_file = false;
  o.allow_any_path = true;
  formats::SourceOpener opener = [](const std::string& p) { return OpenFileSource(p); };
  auto image = formats::OpenImage(qcow2.string(), opener, o);
  if (!image.ok() || (*image)->info().backing_file.empty()) return "";
  fs::path b((*image)->info().backing_file);
  if (b.is_relative()) b = qcow2.parent_path() / b;
  std::error_code ec;
  return fs::weakly_canonical(b, ec).string();
}

}  // namespace

Result<std::chrono::seconds> ParseDuration(const std::string& text) {
  if (text.empty()) return Error::InvalidArgument("empty duration");
  size_t pos = 0;
  int64_t v = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) {
    if (v > (INT64_MAX / 10) - 10) return Error::InvalidArgument("duration too large: " + text);
    v = v * 10 + (text[pos++] - '0');
  }
  if (pos == 0) return Error::InvalidArgument("not a duration: '" + text + "' (e.g. 90s, 15m, 2h, 7d)");
  std::string unit = text.substr(pos);
  int64_t mult = 0;
  if (unit.empty() || unit == "s") mult = 1;
  else if (unit == "m") mult = 60;
  else if (unit == "h") mult = 3600;
  else if (unit == "d") mult = 86400;
  else return Error::InvalidArgument("unknown duration unit in '" + text + "' (use s, m, h, d)");
  return std::chrono::seconds(v * mult);
}

struct ImageCatalog::Db {
  sqlite3* handle = nullptr;
  ~Db() { sqlite3_close(handle); }
  Status Exec(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(handle, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "?";
      sqlite3_free(err);
      return Error::IoError("sqlite: " + msg);
    }
    return OkStatus();
  }
  Status SetCopy(const ImageCopyRecord& r) {
    Stmt s(handle,
           "INSERT INTO image_copies (image, disk, path, state, percent, message, sender, updated, unused_since) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (image, disk) DO UPDATE SET "
           "path = ?3, state = ?4, percent = ?5, message = ?6, sender = ?7, updated = ?8, unused_since = ?9");
    return s.Bind(1, r.image).Bind(2, r.disk).Bind(3, r.path).Bind(4, r.state).Bind(5, r.percent)
        .Bind(6, r.message).Bind(7, r.sender).Bind(8, r.updated).Bind(9, r.unused_since).Run();
  }
  Status SetPercent(const std::string& image, const std::string& disk, double percent) {
    Stmt s(handle, "UPDATE image_copies SET percent = ?3 WHERE image = ?1 AND disk = ?2");
    return s.Bind(1, image).Bind(2, disk).Bind(3, percent).Run();
  }
  Result<std::vector<ImageCopyRecord>> Copies(const std::string& image, const std::string& disk = "") {
    std::string sql = std::string("SELECT ") + kCopyColumns +
                      " FROM image_copies WHERE (?1 = '' OR image = ?1) AND (?2 = '' OR disk = ?2) "
                      "ORDER BY image, disk";
    Stmt s(handle, sql.c_str());
    s.Bind(1, image).Bind(2, disk);
    std::vector<ImageCopyRecord> out;
    while (true) {
      BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) return out;
      out.push_back(CopyFromRow(s));
    }
  }
  Result<std::vector<ImageRecord>> Images(const std::string& name) {
    Stmt s(handle,
           "SELECT name, source, expected_sha512, sha512, format, virtual_size, created FROM images "
           "WHERE (?1 = '' OR name = ?1) ORDER BY name");
    s.Bind(1, name);
    std::vector<ImageRecord> out;
    while (true) {
      BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) return out;
      out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Text(4),
                     static_cast<uint64_t>(s.Int(5)), s.Int(6)});
    }
  }
};

ImageCatalog::ImageCatalog(std::unique_ptr<Db> db) : db_(std::move(db)) {}
ImageCatalog::~ImageCatalog() = default;

Result<std::unique_ptr<ImageCatalog>> ImageCatalog::Open(const std::string& db_path) {
  std::error_code ec;
  fs::path parent = fs::path(db_path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  auto db = std::make_unique<Db>();
  if (sqlite3_open_v2(db_path.c_str(), &db->handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    return Error::IoError(std::string("open catalog: ") + sqlite3_errmsg(db->handle)).set_path(db_path);
  }
  sqlite3_busy_timeout(db->handle, 10000);
  BARGE_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON;"));
  BARGE_RETURN_IF_ERROR(db->Exec(kSchema));
  return std::unique_ptr<ImageCatalog>(new ImageCatalog(std::move(db)));
}

Result<std::vector<ImageRecord>> ImageCatalog::Images(const std::string& name) {
  std::lock_guard lock(mu_);
  return db_->Images(name);
}

Result<std::vector<ImageCopyRecord>> ImageCatalog::Copies(const std::string& name) {
  std::lock_guard lock(mu_);
  return db_->Copies(name);
}

Result<std::vector<SenderRecord>> ImageCatalog::Senders(const std::string& name) {
  std::lock_guard lock(mu_);
  Stmt s(db_->handle,
         "SELECT image, sender, sends, max_concurrent FROM image_senders WHERE (?1 = '' OR image = ?1) "
         "ORDER BY image, sender");
  s.Bind(1, name);
  std::vector<SenderRecord> out;
  while (true) {
    BARGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    out.push_back({s.Text(0), s.Text(1), static_cast<int>(s.Int(2)), static_cast<int>(s.Int(3))});
  }
}

Result<ImageCopyRecord> ImageCatalog::Add(const std::string& name, const std::string& source,
                                          const std::string& expected_sha512, const std::string& disk,
                                          const pipeline::ReplicateOptions& options) {
  BARGE_RETURN_IF_ERROR(ValidName(name));
  std::error_code ec;
  fs::create_directories(disk, ec);
  if (!fs::is_directory(disk)) return Error::InvalidArgument("disk is not a folder").set_path(disk);
  ImageCopyRecord copy{name, DiskKey(disk), CopyPath(DiskKey(disk), name), "in-progress", 0, "", "", Now(), 0};
  {
    std::lock_guard lock(mu_);
    BARGE_ASSIGN_OR_RETURN(auto existing, db_->Images(name));
    if (!existing.empty()) {
      BARGE_ASSIGN_OR_RETURN(auto copies, db_->Copies(name));
      for (const auto& c : copies) {
        if (c.state == "ready" || c.state == "in-progress") {
          return Error::InvalidArgument("image '" + name + "' exists (has a " + c.state + " copy on " + c.disk +
                                        "); use image sync to deliver it");
        }
      }
      Stmt del(db_->handle, "DELETE FROM images WHERE name = ?1");
      BARGE_RETURN_IF_ERROR(del.Bind(1, name).Run());
    }
    Stmt ins(db_->handle,
             "INSERT INTO images (name, source, expected_sha512, created) VALUES (?1, ?2, ?3, ?4)");
    BARGE_RETURN_IF_ERROR(ins.Bind(1, name).Bind(2, source).Bind(3, expected_sha512).Bind(4, Now()).Run());
    BARGE_RETURN_IF_ERROR(db_->SetCopy(copy));
  }
  pipeline::ReplicateOptions o = options;
  o.expected_sha512 = expected_sha512;
  o.force = true;  // the disk folder's file of this name is ours
  o.source_location = source;
  auto finish = [&](Error e) -> Result<ImageCopyRecord> {
    copy.state = "failed";
    copy.message = e.ToString();
    copy.updated = Now();
    std::lock_guard lock(mu_);
    BARGE_RETURN_IF_ERROR(db_->SetCopy(copy));
    return copy;
  };
  pipeline::SourceSpec spec;
  spec.location = source;
  auto src = pipeline::OpenSource(spec);
  if (!src.ok()) return finish(src.error());
  o.source_format = src->format_name();
  auto last = std::chrono::steady_clock::now();
  o.progress = [&](size_t, uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (done < total && now - last < std::chrono::seconds(1)) return;
    last = now;
    std::lock_guard lock(mu_);
    (void)db_->SetPercent(copy.image, copy.disk, total ? 100.0 * static_cast<double>(done) / total : 100.0);
  };
  std::vector<std::string> dests = {copy.path};
  auto r = pipeline::RunReplicate(*src->image, dests, o);
  if (!r.ok()) return finish(r.error());
  const auto& rep = r->replicas[0];
  if (rep.state == pipeline::ReplicaState::kFailed) return finish(*rep.error);
  copy.state = "ready";
  copy.percent = 100;
  copy.updated = Now();
  std::lock_guard lock(mu_);
  Stmt up(db_->handle, "UPDATE images SET sha512 = ?2, format = ?3, virtual_size = ?4 WHERE name = ?1");
  BARGE_RETURN_IF_ERROR(up.Bind(1, name).Bind(2, r->sha512_hex).Bind(3, r->format)
                            .Bind(4, static_cast<int64_t>(r->virtual_size)).Run());
  BARGE_RETURN_IF_ERROR(db_->SetCopy(copy));
  return copy;
}

Result<SyncResult> ImageCatalog::Sync(const std::string& name, const std::vector<std::string>& disks,
                                      const SyncOptions& options) {
  if (options.max_sends_per_sender < 1) return Error::InvalidArgument("max sends per sender must be >= 1");
  ImageRecord image;
  struct Sender {
    std::string path;
    int active = 0;
    int max_concurrent = 0;
    int sends = 0;
  };
  std::vector<Sender> senders;
  std::deque<ImageCopyRecord> pending;
  std::vector<std::string> keys;
  {
    std::lock_guard lock(mu_);
    BARGE_ASSIGN_OR_RETURN(auto images, db_->Images(name));
    if (images.empty()) return Error::NotFound("no image '" + name + "' in the catalog");
    image = images[0];
    BARGE_ASSIGN_OR_RETURN(auto copies, db_->Copies(name));
    for (const auto& c : copies) {
      auto rec = pipeline::ReadReplicaRecord(c.path);
      if (c.state == "ready" && rec.ok() && pipeline::FileMatchesRecord(c.path, *rec) && rec->sha512 == image.sha512) {
        senders.push_back({c.path});
      }
    }
    if (senders.empty()) return Error::NotFound("image '" + name + "' has no ready copy to send from");
    for (const std::string& d : disks) {
      std::error_code ec;
      fs::create_directories(d, ec);
      std::string key = DiskKey(d);
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
      keys.push_back(key);
      std::string path = CopyPath(key, name);
      if (std::any_of(senders.begin(), senders.end(), [&](const Sender& s) { return s.path == path; })) continue;
      ImageCopyRecord c{name, key, path, "pending", 0, "", "", Now(), 0};
      BARGE_RETURN_IF_ERROR(db_->SetCopy(c));
      pending.push_back(std::move(c));
    }
  }

  // Dispatch: the sender with the fewest active sends under the limit
  // takes the next disk; a copy that becomes ready joins the senders.
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::thread> threads;
  int running = 0;
  auto send = [&](ImageCopyRecord copy, size_t sender_index, std::string sender_path) {
    pipeline::ReplicateOptions o = options.replicate;
    o.expected_sha512 = image.sha512;
    o.force = true;
    o.source_location = sender_path;
    o.source_format = image.format;
    auto last = std::chrono::steady_clock::now();
    o.progress = [&](size_t, uint64_t done, uint64_t total) {
      auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::seconds(1)) return;
      last = now;
      std::lock_guard lock(mu_);
      (void)db_->SetPercent(copy.image, copy.disk, total ? 100.0 * static_cast<double>(done) / total : 100.0);
    };
    std::optional<Error> error;
    pipeline::SourceSpec spec;
    spec.location = sender_path;
    spec.format = image.format;
    auto src = pipeline::OpenSource(spec);
    if (!src.ok()) {
      error = src.error();
    } else {
      std::vector<std::string> dests = {copy.path};
      auto r = pipeline::RunReplicate(*src->image, dests, o);
      if (!r.ok()) error = r.error();
      else if (r->replicas[0].state == pipeline::ReplicaState::kFailed) error = *r->replicas[0].error;
    }
    copy.state = error ? "failed" : "ready";
    copy.message = error ? error->ToString() : "";
    copy.percent = error ? copy.percent : 100;
    copy.updated = Now();
    {
      std::lock_guard lock(mu_);
      (void)db_->SetCopy(copy);
    }
    std::lock_guard lock(m);
    senders[sender_index].active--;
    if (!error) senders.push_back({copy.path});
    --running;
    cv.notify_all();
  };
  {
    std::unique_lock lock(m);
    senders.reserve(senders.size() + pending.size());  // indexes stay valid; no reallocation
    while (!pending.empty()) {
      size_t best = senders.size();
      for (size_t i = 0; i < senders.size(); ++i) {
        if (senders[i].active >= options.max_sends_per_sender) continue;
        if (best == senders.size() || senders[i].active < senders[best].active) best = i;
      }
      if (best == senders.size()) {
        cv.wait(lock);
        continue;
      }
      ImageCopyRecord copy = std::move(pending.front());
      pending.pop_front();
      Sender& s = senders[best];
      s.active++;
      s.sends++;
      s.max_concurrent = std::max(s.max_concurrent, s.active);
      copy.state = "in-progress";
      copy.sender = s.path;
      copy.updated = Now();
      {
        std::lock_guard db_lock(mu_);
        (void)db_->SetCopy(copy);
      }
      ++running;
      threads.emplace_back(send, std::move(copy), best, s.path);
    }
    cv.wait(lock, [&] { return running == 0; });
  }
  for (auto& t : threads) t.join();

  SyncResult result;
  std::lock_guard lock(mu_);
  for (const Sender& s : senders) {
    if (s.sends == 0) continue;
    result.senders.push_back({name, s.path, s.sends, s.max_concurrent});
    Stmt up(db_->handle,
            "INSERT INTO image_senders (image, sender, sends, max_concurrent) VALUES (?1, ?2, ?3, ?4) "
            "ON CONFLICT (image, sender) DO UPDATE SET sends = sends + ?3, "
            "max_concurrent = MAX(max_concurrent, ?4)");
    BARGE_RETURN_IF_ERROR(up.Bind(1, name).Bind(2, s.path).Bind(3, int64_t{s.sends})
                              .Bind(4, int64_t{s.max_concurrent}).Run());
  }
  for (const std::string& key : keys) {
    BARGE_ASSIGN_OR_RETURN(auto rows, db_->Copies(name, key));
    for (auto& r : rows) result.copies.push_back(std::move(r));
  }
  return result;
}

Status ImageCatalog::Rescan(const std::vector<std::string>& disks_arg) {
  std::lock_guard lock(mu_);
  std::vector<std::string> disks;
  for (const auto& d : disks_arg) disks.push_back(DiskKey(d));
  if (disks.empty()) {
    BARGE_ASSIGN_OR_RETURN(auto copies, db_->Copies(""));
    for (const auto& c : copies) {
      if (std::find(disks.begin(), disks.end(), c.disk) == disks.end()) disks.push_back(c.disk);
    }
  }
  BARGE_RETURN_IF_ERROR(db_->Exec("BEGIN IMMEDIATE"));
  auto body = [&]() -> Status {
    for (const std::string& disk : disks) {
      Stmt del(db_->handle, "DELETE FROM image_copies WHERE disk = ?1");
      BARGE_RETURN_IF_ERROR(del.Bind(1, disk).Run());
      std::error_code ec;
      if (!fs::is_directory(disk, ec)) continue;
      const std::string suffix = ".sha512.json";
      for (const auto& e : fs::directory_iterator(disk, ec)) {
        std::string fname = e.path().filename().string();
        if (fname.size() <= suffix.size() || fname.compare(fname.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
        std::string name = fname.substr(0, fname.size() - suffix.size());
        if (!ValidName(name).ok()) continue;
        std::string path = CopyPath(disk, name);
        auto rec = pipeline::ReadReplicaRecord(path);
        ImageCopyRecord c{name, disk, path, "ready", 100, "", "", Now(), 0};
        if (!rec.ok()) {
          c.state = "failed";
          c.percent = 0;
          c.message = rec.error().ToString();
        } else if (!pipeline::FileMatchesRecord(path, *rec)) {
          c.state = "failed";
          c.percent = 0;
          c.message = "file missing or changed since its checksum record";
        }
        Stmt ins(db_->handle,
                 "INSERT INTO images (name, source, sha512, format, virtual_size, created) "
                 "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (name) DO UPDATE SET "
                 "sha512 = CASE WHEN sha512 = '' THEN ?3 ELSE sha512 END");
        BARGE_RETURN_IF_ERROR(ins.Bind(1, name).Bind(2, rec.ok() ? rec->source : std::string())
                                  .Bind(3, rec.ok() ? rec->sha512 : std::string())
                                  .Bind(4, rec.ok() ? rec->format : std::string())
                                  .Bind(5, static_cast<int64_t>(rec.ok() ? rec->virtual_size : 0))
                                  .Bind(6, Now()).Run());
        BARGE_RETURN_IF_ERROR(db_->SetCopy(c));
      }
    }
    return OkStatus();
  };
  Status s = body();
  if (!s.ok()) {
    (void)db_->Exec("ROLLBACK");
    return s;
  }
  return db_->Exec("COMMIT");
}

Result<CleanupResult> ImageCatalog::Cleanup(std::chrono::seconds unused_for) {
  std::lock_guard lock(mu_);
  BARGE_ASSIGN_OR_RETURN(auto copies, db_->Copies(""));
  CleanupResult result;
  int64_t now = Now();
  for (ImageCopyRecord& c : copies) {
    if (c.state != "ready") continue;
    std::error_code ec;
    std::string target = fs::weakly_canonical(c.path, ec).string();
    bool used = false;
    for (auto it = fs::recursive_directory_iterator(c.disk, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file() || it->path() == fs::path(c.path)) continue;
      if (BackingOf(it->path()) == target) {
        used = true;
        break;
      }
    }
    if (used) {
      c.unused_since = 0;
      result.in_use.push_back(c.path);
      BARGE_RETURN_IF_ERROR(db_->SetCopy(c));
      continue;
    }
    if (c.unused_since == 0) c.unused_since = c.updated;
    if (now - c.unused_since < unused_for.count()) {
      result.waiting.push_back(c.path);
      BARGE_RETURN_IF_ERROR(db_->SetCopy(c));
      continue;
    }
    // The record goes first: a file without one is never taken as ready.
    fs::remove(pipeline::ReplicaRecordPath(c.path), ec);
    fs::remove(c.path, ec);
    if (ec) return Error::FromErrno(ec.value(), "remove", c.path);
    Stmt del(db_->handle, "DELETE FROM image_copies WHERE image = ?1 AND disk = ?2");
    BARGE_RETURN_IF_ERROR(del.Bind(1, c.image).Bind(2, c.disk).Run());
    result.removed.push_back(c.path);
  }
  return result;
}

}  // namespace barge::orchestrate
