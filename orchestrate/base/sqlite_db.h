// A small RAII wrapper over SQLite: one connection, prepared statements with
// typed binds and columns, and scoped transactions. Shared by every catalog
// in orchestrate/ (backup catalog, image catalog).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "blockio/env.h"
#include "blockio/error.h"

namespace barge::orchestrate {

class SqliteStatement;

// One open database. Not thread-safe: use one SqliteDb per thread (SQLite's
// own locking arbitrates between connections and processes; a busy timeout
// of 10 s is set).
class SqliteDb {
 public:
  // Opens (creating it and its parent folder if missing) the database file,
  // with WAL journal and foreign keys on. kIoError naming the path otherwise.
  // The folder is made through `env`; the database file, its WAL and its
  // locks are SQLite's own (its VFS does the I/O and fsyncs, and is not
  // routed through the Env: SQLite's transactions give their own crash
  // safety, and a crash test of the catalogs kills real processes).
  static Result<std::unique_ptr<SqliteDb>> Open(Env& env, const std::string& path);
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;

  // Runs one or more statements without results (schema, pragmas).
  Status Exec(std::string_view sql);
  // Compiles one statement; the statement must not outlive this object.
  Result<SqliteStatement> Prepare(std::string_view sql);
  int64_t LastInsertRowId() const;
  int Changes() const;
  const std::string& path() const { return path_; }
  sqlite3* handle() { return db_; }

  // An Error from the connection's last failure, prefixed with `what`.
  Error LastError(std::string_view what) const;

 private:
  SqliteDb(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
};

// A prepared statement. Bind indexes start at 1, column indexes at 0.
class SqliteStatement {
 public:
  SqliteStatement(SqliteDb* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  ~SqliteStatement();
  SqliteStatement(SqliteStatement&& other) noexcept;
  SqliteStatement& operator=(SqliteStatement&&) = delete;
  SqliteStatement(const SqliteStatement&) = delete;

  SqliteStatement& Bind(int index, std::string_view text);
  SqliteStatement& Bind(int index, int64_t value);
  SqliteStatement& BindNull(int index);
  // Named apart from Bind: an int argument would match both int64_t and double.
  SqliteStatement& BindReal(int index, double value);

  // Steps once: true with a row, false when done; an Error otherwise.
  Result<bool> Step();
  // Steps to the end, ignoring rows (INSERT/UPDATE/DELETE).
  Status Run();
  Status Reset();

  std::string Text(int column) const;
  int64_t Int(int column) const;
  double Real(int column) const;
  bool IsNull(int column) const;

 private:
  SqliteDb* db_;  // must outlive the statement
  sqlite3_stmt* stmt_;
  Status bind_status_;
};

// BEGIN IMMEDIATE on construction; ROLLBACK on destruction unless Commit()
// succeeded. One at a time per connection.
class SqliteTransaction {
 public:
  static Result<std::unique_ptr<SqliteTransaction>> Begin(SqliteDb& db);
  ~SqliteTransaction();
  SqliteTransaction(const SqliteTransaction&) = delete;
  SqliteTransaction& operator=(const SqliteTransaction&) = delete;
  Status Commit();

 private:
  explicit SqliteTransaction(SqliteDb& db) : db_(db) {}
  SqliteDb& db_;
  bool done_ = false;
};

}  // namespace barge::orchestrate
