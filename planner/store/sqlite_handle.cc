#include "planner/store/sqlite_handle.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace memplan::sqlite {
namespace {

constexpr size_t kMaxWhatChars = 120;

absl::string_view Shortened(absl::string_view what, bool* cut) {
  const size_t start = what.find_first_not_of(" \n");
  if (start == absl::string_view::npos) {
    *cut = false;
    return absl::string_view();
  }
  const absl::string_view rest = what.substr(start);
  const absl::string_view shown = rest.substr(0, std::min(rest.find('\n'), kMaxWhatChars));
  *cut = shown.size() < rest.size();
  return shown;
}

// [Row checksums] CRC-32C (Castagnoli, reflected 0x82F63B78) over each argument's canonical
// bytes: one type byte, then the 8-byte little-endian value (integer, or the double's bits) or
// the 8-byte length and the bytes (text, blob). Type and length are part of the sum so that a
// garbled serial type or a shifted boundary changes it.
class Crc32c {
 public:
  Crc32c() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
      table_[i] = c;
    }
  }
  uint32_t Extend(uint32_t crc, const void* data, size_t size) const {
    const auto* bytes = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (size_t i = 0; i < size; ++i) crc = table_[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
  }

 private:
  uint32_t table_[256];
};

uint32_t ExtendUint64(const Crc32c& crc32c, uint32_t crc, uint64_t value) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(value >> (8 * i));
  return crc32c.Extend(crc, bytes, sizeof(bytes));
}

void RowChecksum(sqlite3_context* context, int argc, sqlite3_value** argv) {
  static const Crc32c* const crc32c = new Crc32c();
  uint32_t crc = 0;
  for (int i = 0; i < argc; ++i) {
    const unsigned char type = static_cast<unsigned char>(sqlite3_value_type(argv[i]));
    crc = crc32c->Extend(crc, &type, 1);
    switch (type) {
      case SQLITE_INTEGER:
        crc = ExtendUint64(*crc32c, crc, static_cast<uint64_t>(sqlite3_value_int64(argv[i])));
        break;
      case SQLITE_FLOAT: {
        const double value = sqlite3_value_double(argv[i]);
        uint64_t bits = 0;
        std::memcpy(&bits, &value, sizeof(bits));
        crc = ExtendUint64(*crc32c, crc, bits);
        break;
      }
      case SQLITE_TEXT:
      case SQLITE_BLOB: {
        const void* data = type == SQLITE_TEXT
                               ? static_cast<const void*>(sqlite3_value_text(argv[i]))
                               : sqlite3_value_blob(argv[i]);
        const int size = sqlite3_value_bytes(argv[i]);
        crc = ExtendUint64(*crc32c, crc, static_cast<uint64_t>(size));
        if (size > 0) crc = crc32c->Extend(crc, data, static_cast<size_t>(size));
        break;
      }
      default:  // NULL: the type byte alone
        break;
    }
  }
  sqlite3_result_int64(context, crc);
}

}  // namespace

absl::Status ToStatus(int rc, sqlite3* db, absl::string_view what) {
  if (rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE) return absl::OkStatus();
  // The connection's message is more specific than sqlite3_errstr when it belongs to this call.
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  bool cut = false;
  const absl::string_view shown = Shortened(what, &cut);
  const std::string message = absl::StrCat("sqlite: ", shown, cut ? "..." : "", ": ", detail,
                                           " (code ", rc, ")");
  // Disk full is not retryable the way a busy lock is: the caller must free space first.
  if ((rc & 0xff) == SQLITE_FULL ||
      ((rc & 0xff) == SQLITE_IOERR && db != nullptr && sqlite3_system_errno(db) == ENOSPC)) {
    return absl::ResourceExhaustedError(message);
  }
  switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_IOERR:
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

absl::StatusOr<std::unique_ptr<Database>> Database::Open(const std::string& path,
                                                         bool read_only) {
  sqlite3* raw = nullptr;
  // FULLMUTEX is not needed: the owner serialises every use of the connection.
  const int mode =
      read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, mode | SQLITE_OPEN_NOMUTEX, nullptr);
  std::unique_ptr<sqlite3, DatabaseDeleter> db(raw);  // sqlite3_open may allocate on failure too
  if (rc != SQLITE_OK) return ToStatus(rc, raw, absl::StrCat("open ", path));
  sqlite3_extended_result_codes(raw, 1);
  const int fn = sqlite3_create_function_v2(raw, kRowChecksumFunction, -1,
                                            SQLITE_UTF8 | SQLITE_DETERMINISTIC, nullptr,
                                            &RowChecksum, nullptr, nullptr, nullptr);
  if (fn != SQLITE_OK) return ToStatus(fn, raw, kRowChecksumFunction);
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
