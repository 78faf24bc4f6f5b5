#include "planner/store/sqlite_handle.h"

#include "absl/strings/str_cat.h"

namespace memplan::sqlite {

absl::Status ToStatus(int rc, sqlite3* db, absl::string_view what) {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return absl::OkStatus();
  // The connection's message is more specific than sqlite3_errstr when it belongs to this call.
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  const std::string message =
      absl::StrCat("sqlite: ", std::string(what), ": ", detail, " (code ", rc, ")");
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
      return absl::UnavailableError(message);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    case SQLITE_CONSTRAINT:
      return absl::AlreadyExistsError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Statement::BindInt64(int index, int64_t value) {
  return ToStatus(sqlite3_bind_int64(stmt_.get(), index + 1, value), db_, "bind");
}

absl::Status Statement::BindDouble(int index, double value) {
  return ToStatus(sqlite3_bind_double(stmt_.get(), index + 1, value), db_, "bind");
}

absl::Status Statement::BindText(int index, absl::string_view value) {
  return ToStatus(sqlite3_bind_text64(stmt_.get(), index + 1, value.data(), value.size(),
                                      SQLITE_TRANSIENT, SQLITE_UTF8),
                  db_, "bind");
}

absl::Status Statement::BindBlob(int index, absl::string_view value) {
  // A zero-length blob must still bind as a blob, not NULL: pass a non-null pointer.
  static const char kEmpty = 0;
  const char* data = value.empty() ? &kEmpty : value.data();
  return ToStatus(sqlite3_bind_blob64(stmt_.get(), index + 1, data, value.size(), SQLITE_TRANSIENT),
                  db_, "bind");
}

absl::StatusOr<bool> Statement::Step() {
  const int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return ToStatus(rc, db_, sqlite3_sql(stmt_.get()));
}

absl::Status Statement::Run() {
  while (true) {
    absl::StatusOr<bool> row = Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
  }
}

int64_t Statement::ColumnInt64(int index) const { return sqlite3_column_int64(stmt_.get(), index); }

double Statement::ColumnDouble(int index) const {
  return sqlite3_column_double(stmt_.get(), index);
}

std::string Statement::ColumnText(int index) const {
  const unsigned char* text = sqlite3_column_text(stmt_.get(), index);
  const int size = sqlite3_column_bytes(stmt_.get(), index);
  return text == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(text), size);
}

std::string Statement::ColumnBlob(int index) const {
  const void* blob = sqlite3_column_blob(stmt_.get(), index);
  const int size = sqlite3_column_bytes(stmt_.get(), index);
  return blob == nullptr ? std::string() : std::string(static_cast<const char*>(blob), size);
}

void Statement::Reset() {
  sqlite3_reset(stmt_.get());
  sqlite3_clear_bindings(stmt_.get());
}

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const std::string& path) {
  sqlite3* raw = nullptr;
  // FULLMUTEX is not needed: the owner serialises every use of the connection.
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  std::unique_ptr<sqlite3, DatabaseDeleter> db(raw);  // sqlite3_open may allocate on failure too
  if (rc != SQLITE_OK) return ToStatus(rc, raw, absl::StrCat("open ", path));
  sqlite3_extended_result_codes(raw, 1);
  return std::unique_ptr<Database>(new Database(std::move(db)));
}

absl::Status Database::Exec(absl::string_view sql) {
  const std::string text(sql);
  char* error = nullptr;
  const int rc = sqlite3_exec(db_.get(), text.c_str(), nullptr, nullptr, &error);
  sqlite3_free(error);  // the same text is available from sqlite3_errmsg in ToStatus
  return ToStatus(rc, db_.get(), text);
}

absl::StatusOr<StatementLease> Database::Prepare(absl::string_view sql) {
  std::string key(sql);
  auto it = statements_.find(key);
  if (it == statements_.end()) {
    sqlite3_stmt* raw = nullptr;
    const int rc = sqlite3_prepare_v3(db_.get(), key.data(), static_cast<int>(key.size()),
                                      SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
    std::unique_ptr<sqlite3_stmt, StatementDeleter> stmt(raw);
    if (rc != SQLITE_OK) return ToStatus(rc, db_.get(), absl::StrCat("prepare ", key));
    it =
        statements_.emplace(std::move(key), std::make_unique<Statement>(db_.get(), std::move(stmt)))
            .first;
  }
  return StatementLease(it->second.get());
}

absl::StatusOr<int64_t> Database::QueryInt64(absl::string_view sql) {
  absl::StatusOr<StatementLease> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = (*stmt)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError(absl::StrCat("sqlite: no row from ", std::string(sql)));
  return (*stmt)->ColumnInt64(0);
}

absl::StatusOr<std::string> Database::QueryText(absl::string_view sql) {
  absl::StatusOr<StatementLease> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = (*stmt)->Step();
  if (!row.ok()) return row.status();
  if (!*row) return absl::InternalError(absl::StrCat("sqlite: no row from ", std::string(sql)));
  return (*stmt)->ColumnText(0);
}

absl::StatusOr<Transaction> Transaction::Begin(Database& db) {
  absl::Status status = db.Exec("BEGIN IMMEDIATE");
  if (!status.ok()) return status;
  return Transaction(&db);
}

Transaction::~Transaction() {
  if (db_ != nullptr) (void)db_->Exec("ROLLBACK");
}

absl::Status Transaction::Commit() {
  Database* db = db_;
  db_ = nullptr;
  absl::Status status = db->Exec("COMMIT");
  // A failed COMMIT leaves the transaction open; roll it back so the connection stays usable.
  if (!status.ok()) (void)db->Exec("ROLLBACK");
  return status;
}

}  // namespace memplan::sqlite
