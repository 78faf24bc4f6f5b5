// Private to planner/store: RAII ownership of sqlite3 / sqlite3_stmt handles and the single
// place where SQLite result codes become absl::Status. Not thread-safe: the owner serialises.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan::sqlite {

// Maps a SQLite result code to a Status: FULL (and an I/O error from ENOSPC) ->
// RESOURCE_EXHAUSTED, BUSY/LOCKED/IOERR/CANTOPEN/READONLY -> UNAVAILABLE, CORRUPT/NOTADB ->
// DATA_LOSS, CONSTRAINT -> ALREADY_EXISTS, anything else -> INTERNAL. `what` is cut to its first
// line and 120 characters (it may be a whole migration script).
absl::Status ToStatus(int rc, sqlite3* db, absl::string_view what);

// The SQL function memplan_row_crc(v1, v2, ...) registered on every Database: CRC-32C of the
// values' canonical bytes (type tag, length, content), so a row whose stored checksum no longer
// matches its columns was changed outside SQLite (a garbled page). See [Row checksums].
inline constexpr char kRowChecksumFunction[] = "memplan_row_crc";

struct StatementDeleter {
  void operator()(sqlite3_stmt* stmt) const { sqlite3_finalize(stmt); }
};
struct DatabaseDeleter {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};

// One prepared statement. Columns and parameters are 0-based here (SQLite binds from 1).
class Statement {
 public:
  Statement(sqlite3* db, std::unique_ptr<sqlite3_stmt, StatementDeleter> stmt)
      : db_(db), stmt_(std::move(stmt)) {}

  absl::Status BindInt64(int index, int64_t value);
  absl::Status BindDouble(int index, double value);
  absl::Status BindText(int index, absl::string_view value);
  absl::Status BindBlob(int index, absl::string_view value);

  // true: a row is available; false: done.
  absl::StatusOr<bool> Step();
  // Steps to completion, for statements that return no rows.
  absl::Status Run();

  int64_t ColumnInt64(int index) const;
  double ColumnDouble(int index) const;
  std::string ColumnText(int index) const;
  std::string ColumnBlob(int index) const;

  // Ends the statement's read snapshot (an un-reset SELECT pins the WAL) and clears bindings.
  void Reset();

 private:
  sqlite3* db_;
  std::unique_ptr<sqlite3_stmt, StatementDeleter> stmt_;
};

// A cached statement lent for one use; resets it when the lease ends.
class StatementLease {
 public:
  explicit StatementLease(Statement* stmt) : stmt_(stmt) {}
  StatementLease(StatementLease&& other) noexcept : stmt_(other.stmt_) { other.stmt_ = nullptr; }
  StatementLease& operator=(StatementLease&&) = delete;
  ~StatementLease() {
    if (stmt_ != nullptr) stmt_->Reset();
  }
  Statement* operator->() const { return stmt_; }

 private:
  Statement* stmt_;
};

// An open connection with a cache of prepared statements keyed by SQL text.
class Database {
 public:
  // Read-write, created when missing. read_only: for a second connection that only checks.
  static absl::StatusOr<std::unique_ptr<Database>> Open(const std::string& path,
                                                       bool read_only = false);

  // Runs one or more statements that return nothing of interest.
  absl::Status Exec(absl::string_view sql);
  // A cached prepared statement for `sql` (prepared on first use).
  absl::StatusOr<StatementLease> Prepare(absl::string_view sql);
  // Runs a single-value query such as "PRAGMA user_version".
  absl::StatusOr<int64_t> QueryInt64(absl::string_view sql);
  absl::StatusOr<std::string> QueryText(absl::string_view sql);
  // Rows changed by the last INSERT, UPDATE or DELETE.
  int64_t Changes() const { return sqlite3_changes(db_.get()); }

  sqlite3* raw() const { return db_.get(); }

 private:
  explicit Database(std::unique_ptr<sqlite3, DatabaseDeleter> db) : db_(std::move(db)) {}

  // Declared before the cache so statements are finalised before the connection closes.
  std::unique_ptr<sqlite3, DatabaseDeleter> db_;
  std::unordered_map<std::string, std::unique_ptr<Statement>> statements_;
};

// BEGIN IMMEDIATE ... COMMIT; rolls back when destroyed uncommitted.
class Transaction {
 public:
  static absl::StatusOr<Transaction> Begin(Database& db);
  Transaction(Transaction&& other) noexcept : db_(other.db_) { other.db_ = nullptr; }
  Transaction& operator=(Transaction&&) = delete;
  ~Transaction();
  absl::Status Commit();

 private:
  explicit Transaction(Database* db) : db_(db) {}
  Database* db_;  // null once committed or moved from
};

}  // namespace memplan::sqlite
