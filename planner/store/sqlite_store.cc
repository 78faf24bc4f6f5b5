// SqliteStore: the Store on one SQLite connection in WAL mode.
//
// [Durability] Every write is one IMMEDIATE transaction; with journal_mode=WAL and
// synchronous=FULL, COMMIT returns only after the WAL is fsynced, so a write acknowledged to the
// caller survives kill -9 and power loss. Reads never hold a transaction open between calls
// (StatementLease resets statements), so WAL checkpoints are never starved.
//
// [Row checksums] Calibration and sample rows are what every later prediction is scaled by, and
// a page garbled on disk can still parse. Each such row stores row_crc = memplan_row_crc(every
// other column) (sqlite_handle.h), written by the INSERT itself and compared by the SELECT
// (`row_crc IS memplan_row_crc(...)`); a row that does not match is skipped, logged and counted.

#include <algorithm>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <atomic>
#include <filesystem>
#include <system_error>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/status.h"
#include "planner/store/sqlite_handle.h"
#include "planner/store/store.h"
#include "planner/store/store_keys.h"

namespace memplan {
namespace {

using sqlite::Database;
using sqlite::StatementLease;
using sqlite::Transaction;
namespace v1 = memplan::v1;

struct Migration {
  int version;
  const char* sql;
};

// Ordered; each runs once in its own transaction and bumps PRAGMA user_version to `version`.
// Never edit a released entry: append a new one.
constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE traces (
  seq INTEGER PRIMARY KEY,
  trace_id TEXT NOT NULL UNIQUE,
  match_key BLOB NOT NULL,
  analytic INTEGER NOT NULL,
  created_at_unix_ms INTEGER NOT NULL,
  body BLOB NOT NULL);
CREATE INDEX traces_by_match ON traces (match_key, analytic, seq);
CREATE TABLE hardware_profiles (
  seq INTEGER PRIMARY KEY,
  profile_id TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL,
  measured INTEGER NOT NULL,
  created_at_unix_ms INTEGER NOT NULL,
  body BLOB NOT NULL);
CREATE INDEX hardware_profiles_by_name ON hardware_profiles (name, measured, seq);
CREATE TABLE plans (
  seq INTEGER PRIMARY KEY,
  plan_id TEXT NOT NULL UNIQUE,
  created_at_unix_ms INTEGER NOT NULL,
  body BLOB NOT NULL);
CREATE TABLE measurements (
  seq INTEGER PRIMARY KEY,
  measurement_id TEXT NOT NULL UNIQUE,
  plan_id TEXT NOT NULL REFERENCES plans (plan_id),
  measured_at_unix_ms INTEGER NOT NULL,
  body BLOB NOT NULL);
CREATE INDEX measurements_by_plan ON measurements (plan_id, seq);
CREATE TABLE calibration (
  hardware_name TEXT NOT NULL,
  param_dtype INTEGER NOT NULL,
  model_family TEXT NOT NULL,
  updated_at_unix_ms INTEGER NOT NULL,
  body BLOB NOT NULL,
  PRIMARY KEY (hardware_name, param_dtype, model_family)) WITHOUT ROWID;
)sql"},
    {2, R"sql(
CREATE TABLE calibration_samples (
  seq INTEGER PRIMARY KEY,
  hardware_name TEXT NOT NULL,
  param_dtype INTEGER NOT NULL,
  model_family TEXT NOT NULL,
  raw_model_bytes INTEGER NOT NULL,
  fixed_bytes INTEGER NOT NULL,
  measured_bytes INTEGER NOT NULL,
  measured_at_unix_ms INTEGER NOT NULL,
  oom INTEGER NOT NULL DEFAULT 0);
CREATE INDEX calibration_samples_by_key
  ON calibration_samples (hardware_name, param_dtype, model_family, measured_at_unix_ms, seq);
)sql"},
    // Samples now hold the device-level equivalent of a measurement (allocator reserved bytes
    // plus the CUDA context, the same quantity the prediction is); version 2 stored reserved
    // bytes alone. The next reported measurement of a key refits its calibration.
    {3, R"sql(
UPDATE calibration_samples SET measured_bytes = measured_bytes + fixed_bytes;
)sql"},
    // Step times for the step-time calibration (0 = unknown, as for every older sample).
    {4, R"sql(
ALTER TABLE calibration_samples ADD COLUMN predicted_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE calibration_samples ADD COLUMN measured_seconds REAL NOT NULL DEFAULT 0;
)sql"},
    // The exactly sized part of raw_model_bytes, which the factor does not scale (0 = unknown,
    // as for every older sample: the factor scaled all of it).
    {5, R"sql(
ALTER TABLE calibration_samples ADD COLUMN exact_bytes INTEGER NOT NULL DEFAULT 0;
)sql"},
    // [Row checksums] for the rows written before, and the index plan retention by age walks.
    {6, R"sql(
ALTER TABLE calibration ADD COLUMN row_crc INTEGER;
UPDATE calibration SET row_crc = memplan_row_crc(hardware_name, param_dtype, model_family,
  updated_at_unix_ms, body);
ALTER TABLE calibration_samples ADD COLUMN row_crc INTEGER;
UPDATE calibration_samples SET row_crc = memplan_row_crc(hardware_name, param_dtype,
  model_family, raw_model_bytes, fixed_bytes, measured_bytes, measured_at_unix_ms, oom,
  predicted_seconds, measured_seconds, exact_bytes);
CREATE INDEX plans_by_created ON plans (created_at_unix_ms);
)sql"},
    // [Calibration keys]: method and optimizer join the key. Rows written before keep both empty
    // (the legacy key); a checksum is carried over only where the old one still matched.
    {7, R"sql(
CREATE TABLE calibration_keyed (
  hardware_name TEXT NOT NULL,
  param_dtype INTEGER NOT NULL,
  model_family TEXT NOT NULL,
  method TEXT NOT NULL,
  optimizer TEXT NOT NULL,
  updated_at_unix_ms INTEGER NOT NULL,
  body BLOB NOT NULL,
  row_crc INTEGER,
  PRIMARY KEY (hardware_name, param_dtype, model_family, method, optimizer)) WITHOUT ROWID;
INSERT INTO calibration_keyed
  SELECT hardware_name, param_dtype, model_family, '', '', updated_at_unix_ms, body,
    CASE WHEN row_crc IS memplan_row_crc(hardware_name, param_dtype, model_family,
        updated_at_unix_ms, body)
      THEN memplan_row_crc(hardware_name, param_dtype, model_family, '', '', updated_at_unix_ms,
        body) END
  FROM calibration;
DROP TABLE calibration;
ALTER TABLE calibration_keyed RENAME TO calibration;
ALTER TABLE calibration_samples ADD COLUMN method TEXT NOT NULL DEFAULT '';
ALTER TABLE calibration_samples ADD COLUMN optimizer TEXT NOT NULL DEFAULT '';
UPDATE calibration_samples SET row_crc =
  CASE WHEN row_crc IS memplan_row_crc(hardware_name, param_dtype, model_family, raw_model_bytes,
      fixed_bytes, measured_bytes, measured_at_unix_ms, oom, predicted_seconds, measured_seconds,
      exact_bytes)
    THEN memplan_row_crc(hardware_name, param_dtype, model_family, raw_model_bytes, fixed_bytes,
      measured_bytes, measured_at_unix_ms, oom, predicted_seconds, measured_seconds, exact_bytes,
      method, optimizer) END;
DROP INDEX calibration_samples_by_key;
CREATE INDEX calibration_samples_by_key ON calibration_samples
  (hardware_name, param_dtype, model_family, method, optimizer, measured_at_unix_ms, seq);
)sql"},
};

// The checksummed columns of each table, in the order memplan_row_crc takes them.
constexpr char kCalibrationColumns[] =
    "hardware_name, param_dtype, model_family, method, optimizer, updated_at_unix_ms, body";
constexpr char kSampleColumns[] =
    "hardware_name, param_dtype, model_family, raw_model_bytes, fixed_bytes, measured_bytes, "
    "measured_at_unix_ms, oom, predicted_seconds, measured_seconds, exact_bytes, method, optimizer";

// Framing a plan adds in ListPlansResponse beyond its stored bytes: the repeated field's tag and
// length, and the plan_id the service copies into the response.
constexpr int64_t kListPlanOverheadBytes = 64;
// Plans deleted per retention transaction.
constexpr int kRetentionBatch = 5000;

constexpr int kLatestVersion = kMigrations[std::size(kMigrations) - 1].version;

std::string CorruptDatabaseMessage(const std::string& path, absl::string_view found) {
  return absl::StrCat("database ", path, " is corrupt (", found,
                      "). Stop every memplan-planner using it, move it aside with its -wal and "
                      "-shm files, and restore it from a backup (or start on a new file; "
                      "stored plans and calibration are then lost)");
}

// PRAGMA quick_check / integrity_check; DATA_LOSS with the first problems SQLite lists.
absl::Status RunIntegrityCheck(Database& db, const std::string& path, IntegrityCheck mode) {
  if (mode == IntegrityCheck::kOff) return absl::OkStatus();
  const char* pragma = mode == IntegrityCheck::kFull ? "integrity_check" : "quick_check";
  ASSIGN_OR_RETURN(StatementLease stmt, db.Prepare(absl::StrCat("PRAGMA ", pragma, "(5)")));
  std::vector<std::string> problems;
  while (true) {
    absl::StatusOr<bool> row = stmt->Step();
    if (!row.ok()) {
      // A page too damaged to walk makes the check itself fail with SQLITE_CORRUPT.
      if (!absl::IsDataLoss(row.status())) return row.status();
      problems.push_back(std::string(row.status().message().substr(0, 160)));
      break;
    }
    if (!*row) break;
    std::string line = stmt->ColumnText(0);
    if (line == "ok") return absl::OkStatus();
    std::replace(line.begin(), line.end(), '\n', ' ');
    problems.push_back(line.substr(0, 160));
  }
  return absl::DataLossError(CorruptDatabaseMessage(
      path, absl::StrCat("PRAGMA ", pragma, ": ", absl::StrJoin(problems, "; "))));
}

template <typename Message>
absl::StatusOr<Message> Parse(const std::string& bytes, absl::string_view what) {
  Message message;
  if (!message.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("stored ", std::string(what), " does not parse"));
  }
  return message;
}

class SqliteStore final : public Store {  // thread-safe: one connection behind mu_
 public:
  SqliteStore(std::unique_ptr<Database> db, const SqliteStoreOptions& options)
      : options_(options), env_(store_internal::WithDefaults(options.env)), db_(std::move(db)) {}

  absl::Status EnforceRetentionAtOpen() {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const int64_t oldest,
                     db_->QueryInt64("SELECT IFNULL(MIN(seq), 1) FROM plans"));
    retention_scanned_seq_ = oldest - 1;
    while (true) {
      ASSIGN_OR_RETURN(const bool more, EnforceRetention());
      if (!more) return absl::OkStatus();
    }
  }

  absl::StatusOr<std::string> PutTrace(const v1::Trace& trace) override {
    v1::Trace stored = trace;
    stored.set_trace_id(store_internal::NewId("trace", env_));
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("INSERT INTO traces (trace_id, match_key, analytic, "
                                  "created_at_unix_ms, body) VALUES (?, ?, ?, ?, ?)"));
    RETURN_IF_ERROR(stmt->BindText(0, stored.trace_id()));
    RETURN_IF_ERROR(stmt->BindBlob(1, store_internal::TraceMatchKey(stored)));
    RETURN_IF_ERROR(stmt->BindInt64(2, stored.analytic() ? 1 : 0));
    RETURN_IF_ERROR(stmt->BindInt64(3, env_.now_unix_ms()));
    RETURN_IF_ERROR(stmt->BindBlob(4, stored.SerializeAsString()));
    RETURN_IF_ERROR(stmt->Run());
    return stored.trace_id();
  }

  absl::StatusOr<v1::Trace> GetTrace(absl::string_view trace_id) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("SELECT body FROM traces WHERE trace_id = ?"));
    RETURN_IF_ERROR(stmt->BindText(0, trace_id));
    ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) return absl::NotFoundError(absl::StrCat("trace_id '", trace_id, "' not found"));
    return Parse<v1::Trace>(stmt->ColumnBlob(0), "trace");
  }

  absl::StatusOr<std::optional<v1::Trace>> FindTrace(const v1::Trace& key) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("SELECT body FROM traces WHERE match_key = ? AND analytic = 0 "
                                  "ORDER BY seq DESC LIMIT 1"));
    RETURN_IF_ERROR(stmt->BindBlob(0, store_internal::TraceMatchKey(key)));
    ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) return std::optional<v1::Trace>();
    ASSIGN_OR_RETURN(v1::Trace trace, Parse<v1::Trace>(stmt->ColumnBlob(0), "trace"));
    return std::optional<v1::Trace>(std::move(trace));
  }

  absl::StatusOr<std::string> PutHardwareProfile(const v1::HardwareProfile& profile) override {
    const std::string id = store_internal::NewId("hw", env_);
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("INSERT INTO hardware_profiles (profile_id, name, measured, "
                                  "created_at_unix_ms, body) VALUES (?, ?, ?, ?, ?)"));
    RETURN_IF_ERROR(stmt->BindText(0, id));
    RETURN_IF_ERROR(stmt->BindText(1, profile.name()));
    RETURN_IF_ERROR(stmt->BindInt64(2, profile.measured() ? 1 : 0));
    RETURN_IF_ERROR(stmt->BindInt64(3, env_.now_unix_ms()));
    RETURN_IF_ERROR(stmt->BindBlob(4, profile.SerializeAsString()));
    RETURN_IF_ERROR(stmt->Run());
    return id;
  }

  absl::StatusOr<v1::HardwareProfile> GetHardwareProfile(absl::string_view profile_id) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("SELECT body FROM hardware_profiles WHERE profile_id = ?"));
    RETURN_IF_ERROR(stmt->BindText(0, profile_id));
    ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) {
      return absl::NotFoundError(absl::StrCat("hardware_profile_id '", profile_id, "' not found"));
    }
    return Parse<v1::HardwareProfile>(stmt->ColumnBlob(0), "hardware profile");
  }

  absl::StatusOr<std::optional<v1::HardwareProfile>> FindHardwareProfileByName(
      absl::string_view name) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("SELECT body FROM hardware_profiles WHERE name = ? AND "
                                  "measured = 1 ORDER BY seq DESC LIMIT 1"));
    RETURN_IF_ERROR(stmt->BindText(0, name));
    ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) return std::optional<v1::HardwareProfile>();
    ASSIGN_OR_RETURN(v1::HardwareProfile profile,
                     Parse<v1::HardwareProfile>(stmt->ColumnBlob(0), "hardware profile"));
    return std::optional<v1::HardwareProfile>(std::move(profile));
  }

  absl::StatusOr<std::string> PutPlan(const v1::StoredPlan& plan) override {
    v1::StoredPlan stored = plan;
    stored.clear_measurements();
    if (stored.plan_id().empty()) stored.set_plan_id(store_internal::NewId("plan", env_));
    if (stored.created_at_unix_ms() == 0) stored.set_created_at_unix_ms(env_.now_unix_ms());
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("INSERT INTO plans (plan_id, created_at_unix_ms, body) "
                                  "VALUES (?, ?, ?)"));
    RETURN_IF_ERROR(stmt->BindText(0, stored.plan_id()));
    RETURN_IF_ERROR(stmt->BindInt64(1, stored.created_at_unix_ms()));
    RETURN_IF_ERROR(stmt->BindBlob(2, stored.SerializeAsString()));
    absl::Status status = stmt->Run();
    if (absl::IsAlreadyExists(status)) {
      return absl::AlreadyExistsError(
          absl::StrCat("plan_id '", stored.plan_id(), "' already exists"));
    }
    RETURN_IF_ERROR(status);
    if (++puts_since_retention_ >= options_.plan_retention.check_every_puts) {
      puts_since_retention_ = 0;
      // The plan is stored either way; a failed clean-up is retried at the next check.
      absl::StatusOr<bool> more = EnforceRetention();
      if (!more.ok()) {
        MEMPLAN_LOG(kWarning, "plan retention failed; retried later")
            .Field("db", options_.path)
            .Field("error", more.status().ToString());
      }
    }
    return stored.plan_id();
  }

  absl::StatusOr<v1::StoredPlan> GetPlan(absl::string_view plan_id) override {
    absl::MutexLock lock(&mu_);
    v1::StoredPlan plan;
    {
      ASSIGN_OR_RETURN(StatementLease stmt,
                       db_->Prepare("SELECT body FROM plans WHERE plan_id = ?"));
      RETURN_IF_ERROR(stmt->BindText(0, plan_id));
      ASSIGN_OR_RETURN(bool row, stmt->Step());
      if (!row) return absl::NotFoundError(absl::StrCat("plan_id '", plan_id, "' not found"));
      ASSIGN_OR_RETURN(plan, Parse<v1::StoredPlan>(stmt->ColumnBlob(0), "plan"));
    }
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare("SELECT body FROM measurements WHERE plan_id = ? "
                                  "ORDER BY seq DESC LIMIT ?"));
    RETURN_IF_ERROR(stmt->BindText(0, plan_id));
    RETURN_IF_ERROR(stmt->BindInt64(1, options_.max_measurements_per_plan));
    while (true) {
      ASSIGN_OR_RETURN(bool row, stmt->Step());
      if (!row) break;
      ASSIGN_OR_RETURN(*plan.add_measurements(),
                       Parse<v1::Measurement>(stmt->ColumnBlob(0), "measurement"));
    }
    return plan;
  }

  absl::StatusOr<ListPlansPage> ListPlans(int page_size, absl::string_view page_token) override {
    ASSIGN_OR_RETURN(const store_internal::PlanPageRequest request,
                     store_internal::ParsePlanPageRequest(page_size, page_token));
    const int limit = request.limit;
    const int64_t before_seq = request.before_seq;
    absl::MutexLock lock(&mu_);
    // One row more than asked tells whether another page exists without a COUNT.
    ASSIGN_OR_RETURN(StatementLease stmt, db_->Prepare("SELECT seq, body FROM plans WHERE seq < ? "
                                                       "ORDER BY seq DESC LIMIT ?"));
    RETURN_IF_ERROR(stmt->BindInt64(0, before_seq));
    RETURN_IF_ERROR(stmt->BindInt64(1, limit + 1));
    ListPlansPage page;
    int64_t last_seq = 0;
    int64_t page_bytes = 0;
    while (true) {
      ASSIGN_OR_RETURN(bool row, stmt->Step());
      if (!row) break;
      const std::string body = stmt->ColumnBlob(1);
      const int64_t plan_bytes = static_cast<int64_t>(body.size()) + kListPlanOverheadBytes;
      if (static_cast<int>(page.plans.size()) == limit ||
          (!page.plans.empty() && page_bytes + plan_bytes > options_.max_list_page_bytes)) {
        page.next_page_token = store_internal::EncodePlanPageToken(last_seq);
        break;
      }
      last_seq = stmt->ColumnInt64(0);
      page_bytes += plan_bytes;
      ASSIGN_OR_RETURN(v1::StoredPlan plan, Parse<v1::StoredPlan>(body, "plan"));
      page.plans.push_back(std::move(plan));
    }
    return page;
  }

  absl::StatusOr<std::string> PutMeasurement(const v1::Measurement& m) override {
    ASSIGN_OR_RETURN(std::vector<std::string> ids, PutMeasurements({m}));
    return std::move(ids.front());
  }

  absl::StatusOr<std::vector<std::string>> PutMeasurements(
      absl::Span<const v1::Measurement> measurements) override {
    for (const v1::Measurement& m : measurements)
      RETURN_IF_ERROR(store_internal::CheckMeasurement(m));
    const int64_t now_ms = env_.now_unix_ms();
    std::vector<std::string> ids;
    ids.reserve(measurements.size());
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
    for (const v1::Measurement& m : measurements) {
      {
        // Checked here rather than through the foreign key so the error names the plan.
        ASSIGN_OR_RETURN(StatementLease exists,
                         db_->Prepare("SELECT 1 FROM plans WHERE plan_id = ?"));
        RETURN_IF_ERROR(exists->BindText(0, m.plan_id()));
        ASSIGN_OR_RETURN(bool row, exists->Step());
        if (!row) {
          return absl::NotFoundError(
              absl::StrCat("measurement.plan_id '", m.plan_id(), "' is not a stored plan"));
        }
      }
      v1::Measurement stored = m;
      if (stored.measured_at_unix_ms() == 0) stored.set_measured_at_unix_ms(now_ms);
      ids.push_back(store_internal::NewId("meas", env_));
      ASSIGN_OR_RETURN(StatementLease insert,
                       db_->Prepare("INSERT INTO measurements (measurement_id, plan_id, "
                                    "measured_at_unix_ms, body) VALUES (?, ?, ?, ?)"));
      RETURN_IF_ERROR(insert->BindText(0, ids.back()));
      RETURN_IF_ERROR(insert->BindText(1, stored.plan_id()));
      RETURN_IF_ERROR(insert->BindInt64(2, stored.measured_at_unix_ms()));
      RETURN_IF_ERROR(insert->BindBlob(3, stored.SerializeAsString()));
      RETURN_IF_ERROR(insert->Run());
    }
    RETURN_IF_ERROR(txn.Commit());  // see [Durability]
    return ids;
  }

  absl::StatusOr<int64_t> CountMeasurements() override {
    absl::MutexLock lock(&mu_);
    return db_->QueryInt64("SELECT COUNT(*) FROM measurements");
  }

  absl::StatusOr<std::vector<CalibrationSample>> RecentCalibrationSamples(const CalibrationKey& key,
                                                                          int limit) override {
    RETURN_IF_ERROR(store_internal::CheckSampleLimit(limit));
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(
        StatementLease stmt,
        db_->Prepare(absl::StrCat(
            "SELECT raw_model_bytes, fixed_bytes, measured_bytes, measured_at_unix_ms, oom, "
            "predicted_seconds, measured_seconds, exact_bytes, seq, row_crc IS ",
            sqlite::kRowChecksumFunction, "(", kSampleColumns,
            ") FROM calibration_samples "
            "WHERE hardware_name = ? AND param_dtype = ? AND model_family = ? AND method = ? "
            "AND optimizer = ? ORDER BY measured_at_unix_ms DESC, seq DESC LIMIT ?")));
    RETURN_IF_ERROR(stmt->BindText(0, key.hardware_name));
    RETURN_IF_ERROR(stmt->BindInt64(1, store_internal::ToProtoDType(key.param_dtype)));
    RETURN_IF_ERROR(stmt->BindText(2, key.model_family));
    RETURN_IF_ERROR(stmt->BindText(3, key.method));
    RETURN_IF_ERROR(stmt->BindText(4, key.optimizer));
    RETURN_IF_ERROR(stmt->BindInt64(5, limit));
    std::vector<CalibrationSample> samples;
    while (true) {
      ASSIGN_OR_RETURN(bool row, stmt->Step());
      if (!row) break;
      if (stmt->ColumnInt64(9) == 0) {
        SkipCorruptRow("calibration_samples", absl::StrCat("seq ", stmt->ColumnInt64(8)));
        continue;
      }
      CalibrationSample s;
      s.raw_model_bytes = stmt->ColumnInt64(0);
      s.fixed_bytes = stmt->ColumnInt64(1);
      s.measured_bytes = stmt->ColumnInt64(2);
      s.measured_at_unix_ms = stmt->ColumnInt64(3);
      s.oom = stmt->ColumnInt64(4) != 0;
      s.predicted_seconds = stmt->ColumnDouble(5);
      s.measured_seconds = stmt->ColumnDouble(6);
      s.exact_bytes = stmt->ColumnInt64(7);
      samples.push_back(s);
    }
    return samples;
  }

  absl::Status PutCalibrationSample(const CalibrationKey& key,
                                    const CalibrationSample& sample) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(
        StatementLease stmt,
        db_->Prepare(absl::StrCat(
            "INSERT INTO calibration_samples (", kSampleColumns,
            ", row_crc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ",
            sqlite::kRowChecksumFunction,
            "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13))")));
    RETURN_IF_ERROR(stmt->BindText(0, key.hardware_name));
    RETURN_IF_ERROR(stmt->BindInt64(1, store_internal::ToProtoDType(key.param_dtype)));
    RETURN_IF_ERROR(stmt->BindText(2, key.model_family));
    RETURN_IF_ERROR(stmt->BindInt64(3, sample.raw_model_bytes));
    RETURN_IF_ERROR(stmt->BindInt64(4, sample.fixed_bytes));
    RETURN_IF_ERROR(stmt->BindInt64(5, sample.measured_bytes));
    RETURN_IF_ERROR(stmt->BindInt64(
        6, sample.measured_at_unix_ms != 0 ? sample.measured_at_unix_ms : env_.now_unix_ms()));
    RETURN_IF_ERROR(stmt->BindInt64(7, sample.oom ? 1 : 0));
    RETURN_IF_ERROR(stmt->BindDouble(8, sample.predicted_seconds));
    RETURN_IF_ERROR(stmt->BindDouble(9, sample.measured_seconds));
    RETURN_IF_ERROR(stmt->BindInt64(10, sample.exact_bytes));
    RETURN_IF_ERROR(stmt->BindText(11, key.method));
    RETURN_IF_ERROR(stmt->BindText(12, key.optimizer));
    return stmt->Run();
  }

  absl::Status PutCalibration(const v1::Calibration& c) override {
    RETURN_IF_ERROR(store_internal::CheckCalibration(c));
    v1::Calibration stored = c;
    if (stored.updated_at_unix_ms() == 0) stored.set_updated_at_unix_ms(env_.now_unix_ms());
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare(absl::StrCat("INSERT OR REPLACE INTO calibration (",
                                               kCalibrationColumns,
                                               ", row_crc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ",
                                               sqlite::kRowChecksumFunction,
                                               "(?1, ?2, ?3, ?4, ?5, ?6, ?7))")));
    RETURN_IF_ERROR(stmt->BindText(0, stored.hardware_name()));
    RETURN_IF_ERROR(stmt->BindInt64(1, stored.param_dtype()));
    RETURN_IF_ERROR(stmt->BindText(2, stored.model_family()));
    RETURN_IF_ERROR(stmt->BindText(3, stored.method()));
    RETURN_IF_ERROR(stmt->BindText(4, stored.optimizer()));
    RETURN_IF_ERROR(stmt->BindInt64(5, stored.updated_at_unix_ms()));
    RETURN_IF_ERROR(stmt->BindBlob(6, stored.SerializeAsString()));
    return stmt->Run();
  }

  absl::StatusOr<std::optional<v1::Calibration>> GetCalibration(
      const CalibrationKey& key) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(StatementLease stmt,
                     db_->Prepare(absl::StrCat("SELECT body, row_crc IS ",
                                               sqlite::kRowChecksumFunction, "(",
                                               kCalibrationColumns,
                                               ") FROM calibration WHERE hardware_name = ? AND "
                                               "param_dtype = ? AND model_family = ? AND "
                                               "method = ? AND optimizer = ?")));
    RETURN_IF_ERROR(stmt->BindText(0, key.hardware_name));
    RETURN_IF_ERROR(stmt->BindInt64(1, store_internal::ToProtoDType(key.param_dtype)));
    RETURN_IF_ERROR(stmt->BindText(2, key.model_family));
    RETURN_IF_ERROR(stmt->BindText(3, key.method));
    RETURN_IF_ERROR(stmt->BindText(4, key.optimizer));
    ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) return std::optional<v1::Calibration>();
    if (stmt->ColumnInt64(1) == 0) {
      // Uncalibrated until the next measurement of this key refits it, rather than scaled by a
      // factor nobody wrote.
      SkipCorruptRow("calibration", CalibrationRowName(key.hardware_name, key.model_family));
      return std::optional<v1::Calibration>();
    }
    ASSIGN_OR_RETURN(v1::Calibration c, Parse<v1::Calibration>(stmt->ColumnBlob(0), "calibration"));
    return std::optional<v1::Calibration>(std::move(c));
  }

  absl::StatusOr<std::vector<v1::Calibration>> ListCalibrations(
      const CalibrationFilter& filter) override {
    absl::MutexLock lock(&mu_);
    // "? = ''" / "? = 0" make an unset field match every row with one cached statement.
    ASSIGN_OR_RETURN(
        StatementLease stmt,
        db_->Prepare(absl::StrCat(
            "SELECT body, row_crc IS ", sqlite::kRowChecksumFunction, "(", kCalibrationColumns,
            "), hardware_name, model_family FROM calibration WHERE (?1 = '' OR hardware_name = ?1) "
            "AND (?2 = 0 OR param_dtype = ?2) AND (?3 = '' OR model_family = ?3) "
            "ORDER BY hardware_name, param_dtype, model_family, method, optimizer")));
    RETURN_IF_ERROR(stmt->BindText(0, filter.hardware_name));
    RETURN_IF_ERROR(stmt->BindInt64(
        1, filter.param_dtype.has_value() ? store_internal::ToProtoDType(*filter.param_dtype) : 0));
    RETURN_IF_ERROR(stmt->BindText(2, filter.model_family));
    std::vector<v1::Calibration> out;
    while (true) {
      ASSIGN_OR_RETURN(bool row, stmt->Step());
      if (!row) break;
      if (stmt->ColumnInt64(1) == 0) {
        SkipCorruptRow("calibration", CalibrationRowName(stmt->ColumnText(2), stmt->ColumnText(3)));
        continue;
      }
      ASSIGN_OR_RETURN(v1::Calibration c,
                       Parse<v1::Calibration>(stmt->ColumnBlob(0), "calibration"));
      out.push_back(std::move(c));
    }
    return out;
  }

  absl::Status CheckIntegrity(IntegrityCheck mode) override {
    if (mode == IntegrityCheck::kOff) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::unique_ptr<Database> reader,
                     Database::Open(options_.path, /*read_only=*/true));
    RETURN_IF_ERROR(reader->Exec(absl::StrCat("PRAGMA busy_timeout=", options_.busy_timeout_ms)));
    return RunIntegrityCheck(*reader, options_.path, mode);
  }

  StoreCounters Counters() const override {
    StoreCounters counters;
    counters.corrupt_rows_skipped = corrupt_rows_skipped_.load();
    counters.plans_expired = plans_expired_.load();
    return counters;
  }

 private:
  // Bounded: a garbled key may be long or binary.
  static std::string CalibrationRowName(absl::string_view hardware, absl::string_view family) {
    return absl::StrCat(hardware.substr(0, 64), "/", family.substr(0, 64));
  }

  void SkipCorruptRow(absl::string_view table, absl::string_view row) {
    corrupt_rows_skipped_.fetch_add(1);
    MEMPLAN_LOG(kError, "stored row does not match its checksum; skipped")
        .Field("db", options_.path)
        .Field("table", std::string(table))
        .Field("row", std::string(row))
        .Field("fix", "the key's next measurement rewrites it; check the disk and run "
                      "PRAGMA integrity_check on a copy of the file");
  }

  // One transaction deleting plans beyond PlanRetention (never one with measurements), at most
  // about 2 x kRetentionBatch; true when more remain.
  absl::StatusOr<bool> EnforceRetention() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const PlanRetention& retention = options_.plan_retention;
    int64_t deleted = 0;
    bool more = false;
    int64_t scanned_to = retention_scanned_seq_;
    ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(*db_));
    if (retention.max_plans > 0) {
      // Rowids grow by one per insert and the newest plan is never deleted, so the newest
      // max_plans inserted are those above max(seq) - max_plans: an index seek, not a count.
      ASSIGN_OR_RETURN(const int64_t newest,
                       db_->QueryInt64("SELECT IFNULL(MAX(seq), 0) FROM plans"));
      const int64_t keep_above = newest - retention.max_plans;
      if (keep_above > retention_scanned_seq_) {
        // Plans below the cursor were kept for their measurements, which are never removed.
        const int64_t upto = std::min(keep_above, retention_scanned_seq_ + kRetentionBatch);
        ASSIGN_OR_RETURN(StatementLease stmt,
                         db_->Prepare("DELETE FROM plans WHERE seq > ? AND seq <= ? AND NOT "
                                      "EXISTS (SELECT 1 FROM measurements m "
                                      "WHERE m.plan_id = plans.plan_id)"));
        RETURN_IF_ERROR(stmt->BindInt64(0, retention_scanned_seq_));
        RETURN_IF_ERROR(stmt->BindInt64(1, upto));
        RETURN_IF_ERROR(stmt->Run());
        deleted += db_->Changes();
        scanned_to = upto;
        more = upto < keep_above;
      }
    }
    if (retention.max_age_seconds > 0) {
      const int64_t cutoff_ms = env_.now_unix_ms() - retention.max_age_seconds * 1000;
      ASSIGN_OR_RETURN(
          StatementLease stmt,
          db_->Prepare("DELETE FROM plans WHERE seq IN (SELECT seq FROM plans p WHERE "
                       "created_at_unix_ms < ? AND NOT EXISTS (SELECT 1 FROM measurements m "
                       "WHERE m.plan_id = p.plan_id) ORDER BY created_at_unix_ms LIMIT ?)"));
      RETURN_IF_ERROR(stmt->BindInt64(0, cutoff_ms));
      RETURN_IF_ERROR(stmt->BindInt64(1, kRetentionBatch));
      RETURN_IF_ERROR(stmt->Run());
      const int64_t expired = db_->Changes();
      deleted += expired;
      more = more || expired == kRetentionBatch;
    }
    RETURN_IF_ERROR(txn.Commit());
    retention_scanned_seq_ = scanned_to;
    if (deleted > 0) {
      plans_expired_.fetch_add(deleted);
      MEMPLAN_LOG(kDebug, "expired plans").Field("db", options_.path).Field("deleted", deleted);
    }
    return more;
  }

  const SqliteStoreOptions options_;
  const StoreEnv env_;
  absl::Mutex mu_;
  std::unique_ptr<Database> db_ ABSL_GUARDED_BY(mu_);
  int puts_since_retention_ ABSL_GUARDED_BY(mu_) = 0;
  // Plans at or below this seq were examined by the count cap (kept ones have measurements).
  int64_t retention_scanned_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> corrupt_rows_skipped_{0};
  std::atomic<int64_t> plans_expired_{0};
};

absl::Status Configure(Database& db, const SqliteStoreOptions& options) {
  // busy_timeout first: switching to WAL can itself wait on another process's lock.
  RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA busy_timeout=", options.busy_timeout_ms)));
  ASSIGN_OR_RETURN(const std::string mode, db.QueryText("PRAGMA journal_mode=WAL"));
  if (mode != "wal") {
    return absl::FailedPreconditionError(
        absl::StrCat("sqlite: ", options.path, " cannot use WAL (journal_mode=", mode, ")"));
  }
  // Negative cache_size is in KiB; it bounds the page cache whatever the table sizes.
  const int64_t cache_kib = std::max<int64_t>(options.cache_size_bytes / 1024, 64);
  RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; ",
                                       "PRAGMA cache_size=-", cache_kib, ";")));
  ASSIGN_OR_RETURN(const int64_t fk, db.QueryInt64("PRAGMA foreign_keys"));
  if (fk != 1) return absl::InternalError("sqlite: foreign keys could not be enabled");
  ASSIGN_OR_RETURN(const int64_t sync, db.QueryInt64("PRAGMA synchronous"));
  if (sync != 2) return absl::InternalError("sqlite: synchronous=FULL could not be set");
  if (options.max_database_bytes > 0) {
    ASSIGN_OR_RETURN(const int64_t page_bytes, db.QueryInt64("PRAGMA page_size"));
    RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA max_page_count=",
                                         std::max<int64_t>(1, options.max_database_bytes /
                                                                  std::max<int64_t>(page_bytes, 1)))));
  }
  return absl::OkStatus();
}

// A 0-byte file is what a failed copy or a truncated volume leaves; SQLite would take it as a
// new database and the planner would start with no calibration and no plans, silently.
absl::Status CheckNotEmpty(const std::string& path) {
  std::error_code error;
  const uintmax_t bytes = std::filesystem::file_size(path, error);
  if (error || bytes != 0) return absl::OkStatus();  // missing: created; unreadable: Open says
  // Until the first checkpoint a new database's pages may all be in the WAL.
  const uintmax_t wal_bytes = std::filesystem::file_size(path + "-wal", error);
  if (!error && wal_bytes != 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "database ", path,
      " exists but is empty (0 bytes); a lost or truncated database looks like this. Restore it "
      "from a backup, or delete the file to start a new database (a missing file is created)"));
}

// A SQLite file of another application: refused before any migration writes to it.
absl::Status CheckIsMemplanDatabase(Database& db, const std::string& path) {
  ASSIGN_OR_RETURN(const int64_t version, db.QueryInt64("PRAGMA user_version"));
  if (version > kLatestVersion) return absl::OkStatus();  // Migrate explains
  ASSIGN_OR_RETURN(StatementLease stmt,
                   db.Prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND "
                              "name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"));
  std::vector<std::string> tables;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt->Step());
    if (!row) break;
    tables.push_back(stmt->ColumnText(0));
  }
  bool ours = version == 0 ? tables.empty() : true;
  if (version > 0) {
    for (const char* required : {"traces", "hardware_profiles", "plans", "measurements"}) {
      if (std::find(tables.begin(), tables.end(), required) == tables.end()) ours = false;
    }
  }
  if (ours) return absl::OkStatus();
  constexpr size_t kShownTables = 8;
  std::vector<std::string> shown;
  for (size_t i = 0; i < tables.size() && i < kShownTables; ++i) {
    shown.push_back(tables[i].substr(0, 40));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "database ", path, " is not a memplan-planner database (schema version ", version,
      ", tables: ", shown.empty() ? "none" : absl::StrJoin(shown, ", "),
      tables.size() > kShownTables ? absl::StrCat(" and ", tables.size() - kShownTables, " more")
                                   : "",
      "); give --db the planner's own file or a new path"));
}

absl::Status Migrate(Database& db, const SqliteStoreOptions& options) {
  const int target = options.migrate_to_version == 0 ? kLatestVersion : options.migrate_to_version;
  if (target < 0 || target > kLatestVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("migrate_to_version must be in [0, ", kLatestVersion, "], got ", target));
  }
  ASSIGN_OR_RETURN(const int64_t current, db.QueryInt64("PRAGMA user_version"));
  if (current > kLatestVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("database ", options.path, " has schema version ", current,
                     ", newer than the latest this memplan-planner knows (", kLatestVersion,
                     "); run a newer memplan-planner or restore a matching backup"));
  }
  for (const Migration& migration : kMigrations) {
    if (migration.version > target) break;
    ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
    // Re-read inside the write lock: another process may have migrated since the check above.
    ASSIGN_OR_RETURN(const int64_t version, db.QueryInt64("PRAGMA user_version"));
    if (version >= migration.version) continue;
    if (absl::Status status = db.Exec(migration.sql); !status.ok()) {
      return absl::Status(status.code(), absl::StrCat("migrating ", options.path,
                                                      " to schema version ", migration.version,
                                                      ": ", status.message()));
    }
    RETURN_IF_ERROR(db.Exec(absl::StrCat("PRAGMA user_version=", migration.version)));
    RETURN_IF_ERROR(txn.Commit());
  }
  return absl::OkStatus();
}

}  // namespace

int SqliteStoreSchemaVersion() { return kLatestVersion; }

std::string StoreVersionText() {
  std::string text = absl::StrCat(sqlite3_libversion(), " (store schema ", kLatestVersion, ")");
  if (absl::string_view(sqlite3_libversion()) != SQLITE_VERSION) {
    absl::StrAppend(&text, "; built against ", SQLITE_VERSION);
  }
  return text;
}

namespace {

// A reader must not change the file: it only checks that the schema is the one this binary reads
// (a planner migrates the file when it opens it).
absl::StatusOr<std::unique_ptr<Store>> OpenReadOnly(const SqliteStoreOptions& options) {
  std::error_code error;
  if (!std::filesystem::exists(options.path, error)) {
    return absl::NotFoundError(absl::StrCat("database ", options.path, " does not exist"));
  }
  RETURN_IF_ERROR(CheckNotEmpty(options.path));
  ASSIGN_OR_RETURN(std::unique_ptr<Database> db, Database::Open(options.path, /*read_only=*/true));
  RETURN_IF_ERROR(db->Exec(absl::StrCat("PRAGMA busy_timeout=", options.busy_timeout_ms)));
  RETURN_IF_ERROR(RunIntegrityCheck(*db, options.path, options.integrity_check));
  RETURN_IF_ERROR(CheckIsMemplanDatabase(*db, options.path));
  ASSIGN_OR_RETURN(const int64_t version, db->QueryInt64("PRAGMA user_version"));
  if (version != kLatestVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database ", options.path, " has schema version ", version, "; this binary reads version ",
        kLatestVersion, " only (start a memplan-planner of this version on it once to migrate)"));
  }
  return std::unique_ptr<Store>(std::make_unique<SqliteStore>(std::move(db), options));
}

absl::StatusOr<std::unique_ptr<Store>> Open(const SqliteStoreOptions& options) {
  if (options.read_only) return OpenReadOnly(options);
  RETURN_IF_ERROR(CheckNotEmpty(options.path));
  ASSIGN_OR_RETURN(std::unique_ptr<Database> db, Database::Open(options.path));
  // busy_timeout must be set before anything that could contend with another process.
  RETURN_IF_ERROR(Configure(*db, options));
  RETURN_IF_ERROR(RunIntegrityCheck(*db, options.path, options.integrity_check));
  RETURN_IF_ERROR(CheckIsMemplanDatabase(*db, options.path));
  RETURN_IF_ERROR(Migrate(*db, options));
  auto store = std::make_unique<SqliteStore>(std::move(db), options);
  RETURN_IF_ERROR(store->EnforceRetentionAtOpen());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const SqliteStoreOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("database path is required");
  RETURN_IF_ERROR(store_internal::CheckStoreLimits(options.max_measurements_per_plan,
                                                   options.plan_retention,
                                                   options.max_list_page_bytes));
  if (options.max_database_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_database_bytes must be >= 0 (0 = no limit), got ", options.max_database_bytes));
  }
  absl::StatusOr<std::unique_ptr<Store>> store = Open(options);
  // Damage found anywhere on the way (reading page 1, the schema, a migration) gets the same
  // instructions as a failed integrity check.
  if (absl::IsDataLoss(store.status()) &&
      !absl::StartsWith(store.status().message(), absl::StrCat("database ", options.path))) {
    return absl::DataLossError(CorruptDatabaseMessage(options.path, store.status().message()));
  }
  return store;
}

}  // namespace memplan
