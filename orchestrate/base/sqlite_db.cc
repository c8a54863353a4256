// SQLite RAII wrapper.
#include "orchestrate/base/sqlite_db.h"

#include "blockio/path.h"

namespace barge::orchestrate {

Result<std::unique_ptr<SqliteDb>> SqliteDb::Open(Env& env, const std::string& path) {
  if (Status made = env.CreateDirs(DirName(path)); !made.ok()) {
    return std::move(made).error().Wrap("create catalog folder");
  }
  // A new catalog is made private (0600) before SQLite opens it: it holds
  // the paths of disks and backups (and SQLite gives its -wal and -shm files
  // the database file's mode). An empty file is an empty database; one made
  // meanwhile by another process is simply opened.
  if (!env.Exists(path)) {
    FileOptions o;
    o.create_mode = 0600;
    auto made = env.OpenSink(path, SinkMode::kCreateNew, o);
    // The new name is made durable before SQLite writes into the file: a
    // power cut must not lose the folder entry of a catalog SQLite has
    // committed to (SQLite syncs the file, not our create).
    if (made.ok()) {
      made->reset();
      if (Status synced = env.SyncDir(DirName(path)); !synced.ok()) {
        return std::move(synced).error().Wrap("create catalog");
      }
    }
    // Otherwise SQLite creates it, or says why it cannot.
  }
  sqlite3* raw = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &raw,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    sqlite3_close(raw);
    return Error::IoError("open catalog: " + msg).set_path(path);
  }
  std::unique_ptr<SqliteDb> db(new SqliteDb(raw, path));
  sqlite3_busy_timeout(raw, 10000);
  BARGE_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL; PRAGMA foreign_keys=ON;"));
  return db;
}

SqliteDb::~SqliteDb() { sqlite3_close_v2(db_); }

Error SqliteDb::LastError(std::string_view what) const {
  int code = sqlite3_errcode(db_);
  Error e = (code == SQLITE_FULL) ? Error::NoSpace("") : Error::IoError("");
  e = Error(e.code(), std::string(what) + ": " + sqlite3_errmsg(db_));
  e.set_path(path_);
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) e.set_retryable(true);
  return e;
}

Status SqliteDb::Exec(std::string_view sql) {
  char* err = nullptr;
  std::string s(sql);
  if (sqlite3_exec(db_, s.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return Error::IoError("catalog: " + msg).set_path(path_);
  }
  return OkStatus();
}

Result<SqliteStatement> SqliteDb::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) != SQLITE_OK) {
    return LastError("prepare");
  }
  return SqliteStatement(this, stmt);
}

int64_t SqliteDb::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }
int SqliteDb::Changes() const { return sqlite3_changes(db_); }

SqliteStatement::~SqliteStatement() {
  if (stmt_) sqlite3_finalize(stmt_);
}

SqliteStatement::SqliteStatement(SqliteStatement&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), bind_status_(std::move(other.bind_status_)) {
  other.stmt_ = nullptr;
}

SqliteStatement& SqliteStatement::Bind(int index, std::string_view text) {
  if (sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT) !=
          SQLITE_OK && bind_status_.ok()) {
    bind_status_ = db_->LastError("bind");
  }
  return *this;
}

SqliteStatement& SqliteStatement::Bind(int index, int64_t value) {
  if (sqlite3_bind_int64(stmt_, index, value) != SQLITE_OK && bind_status_.ok()) {
    bind_status_ = db_->LastError("bind");
  }
  return *this;
}

SqliteStatement& SqliteStatement::BindReal(int index, double value) {
  if (sqlite3_bind_double(stmt_, index, value) != SQLITE_OK && bind_status_.ok()) {
    bind_status_ = db_->LastError("bind");
  }
  return *this;
}

SqliteStatement& SqliteStatement::BindNull(int index) {
  if (sqlite3_bind_null(stmt_, index) != SQLITE_OK && bind_status_.ok()) {
    bind_status_ = db_->LastError("bind");
  }
  return *this;
}

Result<bool> SqliteStatement::Step() {
  if (!bind_status_.ok()) return bind_status_.error();
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->LastError("step");
}

Status SqliteStatement::Run() {
  for (;;) {
    BARGE_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return OkStatus();
  }
}

Status SqliteStatement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_status_ = OkStatus();
  return OkStatus();
}

std::string SqliteStatement::Text(int column) const {
  const unsigned char* p = sqlite3_column_text(stmt_, column);
  return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(stmt_, column)) : "";
}

int64_t SqliteStatement::Int(int column) const { return sqlite3_column_int64(stmt_, column); }
double SqliteStatement::Real(int column) const { return sqlite3_column_double(stmt_, column); }
bool SqliteStatement::IsNull(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }

Result<std::unique_ptr<SqliteTransaction>> SqliteTransaction::Begin(SqliteDb& db) {
  BARGE_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
  return std::unique_ptr<SqliteTransaction>(new SqliteTransaction(db));
}

SqliteTransaction::~SqliteTransaction() {
  if (!done_) {
    IgnoreError(db_.Exec("ROLLBACK"),
                "the error that abandons the transaction is already on its way out; should the ROLLBACK fail "
                "too, SQLite undoes the open transaction when the connection closes, and the next BEGIN on "
                "this connection fails and says so");
  }
}

Status SqliteTransaction::Commit() {
  BARGE_RETURN_IF_ERROR(db_.Exec("COMMIT"));
  done_ = true;
  return OkStatus();
}

}  // namespace barge::orchestrate
