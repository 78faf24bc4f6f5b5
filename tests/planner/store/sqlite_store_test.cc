// SqliteStore-specific properties: durability across reopen and kill -9, pragmas, schema
// migrations, refusal of newer schemas, corrupt, empty and foreign files, row checksums, disk
// full, retention at open, and 100 000 measurements within the memory budget.
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/store/store.h"

namespace memplan {
namespace {

namespace v1 = memplan::v1;
using ::testing::HasSubstr;

// Direct access to the file, to inspect what the store wrote or to fake an old/new binary.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
  }
  ~RawDb() { sqlite3_close(db_); }
  std::string Text(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::string out;
    if (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      const unsigned char* text = sqlite3_column_text(stmt, 0);
      if (text != nullptr) out = reinterpret_cast<const char*>(text);
    }
    sqlite3_finalize(stmt);
    return out;
  }
  std::set<std::string> Column(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
    std::set<std::string> out;
    while (stmt != nullptr && sqlite3_step(stmt) == SQLITE_ROW) {
      out.insert(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)));
    }
    sqlite3_finalize(stmt);
    return out;
  }
  int ExecRc(const std::string& sql) {
    return sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  }
  void Exec(const std::string& sql) {
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  }

 private:
  sqlite3* db_ = nullptr;
};

class SqliteStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "sqlite_store_test.XXXXXX").string();
    dir_ = mkdtemp(pattern.data());
    path_ = dir_ + "/planner.db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  SqliteStoreOptions Options() const {
    SqliteStoreOptions options;
    options.path = path_;
    return options;
  }
  std::unique_ptr<Store> Open(SqliteStoreOptions options) {
    absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  std::unique_ptr<Store> Open() { return Open(Options()); }

  static std::string AddPlan(Store& store) {
    absl::StatusOr<std::string> id = store.PutPlan(v1::StoredPlan());
    EXPECT_TRUE(id.ok()) << id.status();
    return id.ok() ? *id : "";
  }
  static v1::Measurement MeasurementFor(const std::string& plan_id, int64_t reserved_bytes) {
    v1::Measurement m;
    m.set_plan_id(plan_id);
    m.set_peak_reserved_bytes(reserved_bytes);
    m.set_step_seconds(0.5);
    return m;
  }

  // Calibration sample rows as binaries before schema version 4 wrote them (this binary's
  // store writes the newer columns); `values` is an SQL VALUES list.
  void InsertSamplesAsBefore(const std::string& values) {
    RawDb raw(path_);
    raw.Exec("INSERT INTO calibration_samples (hardware_name, param_dtype, model_family, "
             "raw_model_bytes, fixed_bytes, measured_bytes, measured_at_unix_ms, oom) VALUES " +
             values);
  }

  std::string dir_;
  std::string path_;
};

TEST_F(SqliteStoreTest, OpensWithDurablePragmasAndLatestSchema) {
  { ASSERT_NE(Open(), nullptr); }
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("PRAGMA journal_mode"), "wal");  // persistent in the file
  EXPECT_EQ(raw.Text("PRAGMA user_version"), std::to_string(SqliteStoreSchemaVersion()));
  EXPECT_EQ(raw.Column("SELECT name FROM sqlite_master WHERE type = 'table'"),
            (std::set<std::string>{"calibration", "calibration_samples", "hardware_profiles",
                                   "measurements", "plans", "traces"}));
}

TEST_F(SqliteStoreTest, DataSurvivesReopen) {
  std::string plan;
  std::string trace_id;
  {
    std::unique_ptr<Store> store = Open();
    ASSERT_NE(store, nullptr);
    plan = AddPlan(*store);
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(plan, 7)).ok());
    v1::Trace trace;
    trace.set_hardware_name("H200");
    absl::StatusOr<std::string> id = store->PutTrace(trace);
    ASSERT_TRUE(id.ok());
    trace_id = *id;
    ASSERT_TRUE(
        store->PutCalibrationSample({"H200", DType::kBFloat16, "llama"}, {1, 2, 3, 4, false}).ok());
  }
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<v1::StoredPlan> got = store->GetPlan(plan);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->measurements_size(), 1);
  EXPECT_EQ(got->measurements(0).peak_reserved_bytes(), 7);
  EXPECT_TRUE(store->GetTrace(trace_id).ok());
  absl::StatusOr<std::vector<CalibrationSample>> samples =
      store->RecentCalibrationSamples({"H200", DType::kBFloat16, "llama"}, 5);
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 1u);
  EXPECT_EQ((*samples)[0].measured_bytes, 3);
}

TEST_F(SqliteStoreTest, MigratesAnOldVersionFileKeepingItsData) {
  SqliteStoreOptions old_binary = Options();
  old_binary.migrate_to_version = 1;  // what the first release wrote
  std::string plan;
  {
    std::unique_ptr<Store> store = Open(old_binary);
    ASSERT_NE(store, nullptr);
    plan = AddPlan(*store);
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(plan, 11)).ok());
    // The old schema has no samples table: the call fails cleanly, it does not crash.
    EXPECT_FALSE(store->PutCalibrationSample({"H200", DType::kBFloat16, "llama"}, {}).ok());
  }
  {
    RawDb raw(path_);
    EXPECT_EQ(raw.Text("PRAGMA user_version"), "1");
    EXPECT_EQ(raw.Text("SELECT COUNT(*) FROM sqlite_master WHERE name = 'calibration_samples'"),
              "0");
  }
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<v1::StoredPlan> got = store->GetPlan(plan);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->measurements_size(), 1);
  EXPECT_EQ(got->measurements(0).peak_reserved_bytes(), 11);
  EXPECT_TRUE(
      store->PutCalibrationSample({"H200", DType::kBFloat16, "llama"}, {1, 1, 1, 1, false}).ok());
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("PRAGMA user_version"), std::to_string(SqliteStoreSchemaVersion()));
}

TEST_F(SqliteStoreTest, Version3MovesStoredSamplesToDeviceLevelBytes) {
  SqliteStoreOptions v2 = Options();
  v2.migrate_to_version = 2;  // samples held allocator-reserved bytes only
  // Rows written before keys named the method and optimizer ([Calibration keys]).
  const CalibrationKey key{"H200", DType::kBFloat16, "llama", "", ""};
  { ASSERT_NE(Open(v2), nullptr); }
  InsertSamplesAsBefore(
      "('H200', 2, 'llama', 100, 7, 120, 1, 0), ('H200', 2, 'llama', 100, 7, 90, 2, 1)");
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::vector<CalibrationSample>> samples = store->RecentCalibrationSamples(key, 5);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  std::set<int64_t> measured;
  for (const CalibrationSample& s : *samples) measured.insert(s.measured_bytes);
  EXPECT_EQ(measured, (std::set<int64_t>{127, 97}));
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("PRAGMA user_version"), std::to_string(SqliteStoreSchemaVersion()));
}

TEST_F(SqliteStoreTest, SampleStepTimesRoundTripAndOlderSamplesReadAsUnknown) {
  SqliteStoreOptions v3 = Options();
  v3.migrate_to_version = 3;  // before step times
  // Rows written before keys named the method and optimizer ([Calibration keys]).
  const CalibrationKey key{"H200", DType::kBFloat16, "llama", "", ""};
  { ASSERT_NE(Open(v3), nullptr); }
  InsertSamplesAsBefore("('H200', 2, 'llama', 100, 7, 120, 1, 0)");
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  CalibrationSample timed{100, 7, 130, 2, false};
  timed.predicted_seconds = 0.25;
  timed.measured_seconds = 0.3125;
  ASSERT_TRUE(store->PutCalibrationSample(key, timed).ok());
  absl::StatusOr<std::vector<CalibrationSample>> samples = store->RecentCalibrationSamples(key, 5);
  ASSERT_TRUE(samples.ok()) << samples.status();
  ASSERT_EQ(samples->size(), 2u);
  EXPECT_EQ((*samples)[0].predicted_seconds, 0.25);  // newest first
  EXPECT_EQ((*samples)[0].measured_seconds, 0.3125);
  EXPECT_EQ((*samples)[1].predicted_seconds, 0);
  EXPECT_EQ((*samples)[1].measured_seconds, 0);
}

TEST_F(SqliteStoreTest, RefusesASchemaNewerThanItKnows) {
  { ASSERT_NE(Open(), nullptr); }
  {
    RawDb raw(path_);
    raw.Exec("PRAGMA user_version = 99");
  }
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  EXPECT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("99"));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("newer"));
}

TEST_F(SqliteStoreTest, ReportsAFileThatIsNotADatabase) {
  std::ofstream(path_) << std::string(8192, 'x');
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  EXPECT_TRUE(absl::IsDataLoss(store.status())) << store.status();
  SqliteStoreOptions no_path;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenSqliteStore(no_path).status()));
}

// Overwrites `bytes.size()` bytes at `offset` of the file with plain file I/O, as a failing disk
// or a stray writer would.
void OverwriteFile(const std::string& path, std::streamoff offset, const std::string& bytes) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.is_open()) << path;
  file.seekp(offset);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(file.good());
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// Flips one byte of the only occurrence of `needle` in the file (after the store closed it).
void GarbleUniqueBytes(const std::string& path, const std::string& needle) {
  const std::string content = ReadWholeFile(path);
  const size_t at = content.find(needle);
  ASSERT_NE(at, std::string::npos) << "needle not in the file";
  ASSERT_EQ(content.find(needle, at + 1), std::string::npos) << "needle not unique";
  OverwriteFile(path, static_cast<std::streamoff>(at + needle.size() / 2),
                std::string(1, static_cast<char>(content[at + needle.size() / 2] ^ 0x5a)));
}

// A populated file of about 300 pages: plans with 2 KB bodies and their measurements.
void Populate(Store& store) {
  std::vector<v1::Measurement> measurements;
  for (int i = 0; i < 150; ++i) {
    v1::StoredPlan plan;
    plan.mutable_request()->mutable_arch()->set_name(std::string(2000, 'a' + i % 26));
    absl::StatusOr<std::string> id = store.PutPlan(plan);
    ASSERT_TRUE(id.ok()) << id.status();
    measurements.emplace_back().set_plan_id(*id);
    measurements.back().set_peak_reserved_bytes(i);
  }
  ASSERT_TRUE(store.PutMeasurements(measurements).ok());
}

TEST_F(SqliteStoreTest, RefusesToStartOnAGarbledPageInTheMiddle) {
  {
    std::unique_ptr<Store> store = Open();
    ASSERT_NE(store, nullptr);
    Populate(*store);
  }  // closing checkpoints the WAL into the file
  const uintmax_t bytes = std::filesystem::file_size(path_);
  constexpr uintmax_t kPage = 4096;
  ASSERT_GT(bytes, 100 * kPage);
  std::mt19937 rng(27);
  std::string garbage(kPage, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  OverwriteFile(path_, static_cast<std::streamoff>(bytes / kPage / 2 * kPage), garbage);

  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  ASSERT_TRUE(absl::IsDataLoss(store.status())) << store.status();
  const std::string message(store.status().message());
  EXPECT_THAT(message, HasSubstr(path_));
  EXPECT_THAT(message, HasSubstr("corrupt"));
  EXPECT_THAT(message, HasSubstr("restore it from a backup"));
  EXPECT_LT(message.size(), 1200u);

  SqliteStoreOptions unchecked = Options();
  unchecked.integrity_check = IntegrityCheck::kOff;  // what opened it before
  EXPECT_TRUE(OpenSqliteStore(unchecked).ok());
}

TEST_F(SqliteStoreTest, CheckIntegrityFindsDamageWhileOpen) {
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  Populate(*store);
  EXPECT_TRUE(store->CheckIntegrity(IntegrityCheck::kQuick).ok());
  EXPECT_TRUE(store->CheckIntegrity(IntegrityCheck::kFull).ok());
  // Moves every page into the main file, so the damage below is what a reader sees.
  {
    RawDb raw(path_);
    raw.Exec("PRAGMA wal_checkpoint(TRUNCATE)");
  }
  const uintmax_t bytes = std::filesystem::file_size(path_);
  OverwriteFile(path_, static_cast<std::streamoff>(bytes / 4096 / 2 * 4096),
                std::string(4096, '\x7f'));
  const absl::Status status = store->CheckIntegrity(IntegrityCheck::kQuick);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(path_));
  EXPECT_TRUE(store->CheckIntegrity(IntegrityCheck::kOff).ok());
}

TEST_F(SqliteStoreTest, RefusesAnEmptyFileInsteadOfStartingANewDatabase) {
  std::ofstream(path_).close();
  ASSERT_EQ(std::filesystem::file_size(path_), 0u);
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  ASSERT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr(path_));
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("empty"));
  EXPECT_EQ(std::filesystem::file_size(path_), 0u) << "left as it was";
  std::filesystem::remove(path_);
  EXPECT_NE(Open(), nullptr) << "a missing file is still created";
}

TEST_F(SqliteStoreTest, RefusesAnotherApplicationsDatabaseNamingItsTables) {
  {
    RawDb raw(path_);
    raw.Exec("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
             "CREATE TABLE orders (id INTEGER PRIMARY KEY, user INTEGER, total REAL);");
  }
  absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(Options());
  ASSERT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  const std::string message(store.status().message());
  EXPECT_THAT(message, HasSubstr(path_));
  EXPECT_THAT(message, HasSubstr("not a memplan-planner database"));
  EXPECT_THAT(message, HasSubstr("tables: orders, users"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("CREATE")));
  RawDb raw(path_);
  EXPECT_EQ(raw.Text("SELECT COUNT(*) FROM sqlite_master WHERE name = 'plans'"), "0")
      << "nothing was migrated into it";

  // One that also sets user_version, and one with many tables: the list is cut.
  RawDb other(dir_ + "/other.db");
  other.Exec("PRAGMA user_version = 3");
  for (int i = 0; i < 20; ++i) other.Exec("CREATE TABLE t" + std::to_string(100 + i) + " (x)");
  SqliteStoreOptions options = Options();
  options.path = dir_ + "/other.db";
  store = OpenSqliteStore(options);
  ASSERT_TRUE(absl::IsFailedPrecondition(store.status())) << store.status();
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("and 12 more"));
}

TEST_F(SqliteStoreTest, GarbledCalibrationRowsAreSkippedNotServed) {
  const CalibrationKey h200{"H200", DType::kBFloat16, "llama"};
  const CalibrationKey h100{"H100", DType::kBFloat16, "llama"};
  constexpr double kGarbledFactor = 1.2345678912345;
  constexpr int64_t kGarbledMeasured = 0x0123456789abcdef;
  v1::Calibration kept;
  {
    std::unique_ptr<Store> store = Open();
    ASSERT_NE(store, nullptr);
    v1::Calibration c;
    c.set_hardware_name("H200");
    c.set_param_dtype(v1::DTYPE_BF16);
    c.set_model_family("llama");
    c.set_method("full");
    c.set_optimizer("adamw");
    c.set_fragmentation_factor(kGarbledFactor);
    ASSERT_TRUE(store->PutCalibration(c).ok());
    c.set_hardware_name("H100");
    c.set_fragmentation_factor(1.5);
    ASSERT_TRUE(store->PutCalibration(c).ok());
    kept = **store->GetCalibration(h100);
    ASSERT_TRUE(store->PutCalibrationSample(h200, {100, 7, kGarbledMeasured, 1, false}).ok());
    ASSERT_TRUE(store->PutCalibrationSample(h200, {100, 7, 130, 2, false}).ok());
  }
  // The factor as the Calibration body holds it (fixed64, little-endian) and the sample's
  // measured_bytes as SQLite stores an integer (big-endian).
  std::string factor_bytes(8, '\0');
  std::memcpy(factor_bytes.data(), &kGarbledFactor, 8);
  GarbleUniqueBytes(path_, factor_bytes);
  std::string measured_bytes;
  for (int i = 7; i >= 0; --i) measured_bytes.push_back(static_cast<char>(kGarbledMeasured >> (8 * i)));
  GarbleUniqueBytes(path_, measured_bytes);

  std::unique_ptr<Store> store = Open();  // the b-trees are intact: quick_check passes
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::optional<v1::Calibration>> garbled = store->GetCalibration(h200);
  ASSERT_TRUE(garbled.ok()) << garbled.status();
  EXPECT_FALSE(garbled->has_value()) << "served a changed factor: "
                                     << (*garbled)->fragmentation_factor();
  absl::StatusOr<std::optional<v1::Calibration>> other = store->GetCalibration(h100);
  ASSERT_TRUE(other.ok() && other->has_value());
  EXPECT_EQ((*other)->SerializeAsString(), kept.SerializeAsString());
  absl::StatusOr<std::vector<v1::Calibration>> all = store->ListCalibrations({});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].hardware_name(), "H100");
  absl::StatusOr<std::vector<CalibrationSample>> samples = store->RecentCalibrationSamples(h200, 5);
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 1u);
  EXPECT_EQ((*samples)[0].measured_bytes, 130);
  EXPECT_EQ(store->Counters().corrupt_rows_skipped, 3);  // Get, List, samples
}

TEST_F(SqliteStoreTest, Version6ChecksumsTheRowsOlderVersionsWrote) {
  SqliteStoreOptions v5 = Options();
  v5.migrate_to_version = 5;
  // Rows written before keys named the method and optimizer ([Calibration keys]).
  const CalibrationKey key{"H200", DType::kBFloat16, "llama", "", ""};
  {
    std::unique_ptr<Store> store = Open(v5);
    ASSERT_NE(store, nullptr);
  }
  InsertSamplesAsBefore("('H200', 2, 'llama', 100, 7, 120, 1, 0)");
  {
    v1::Calibration c;
    c.set_hardware_name("H200");
    c.set_param_dtype(v1::DTYPE_BF16);
    c.set_model_family("llama");
    c.set_fragmentation_factor(1.25);
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt = nullptr;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "INSERT INTO calibration (hardware_name, param_dtype, "
                                 "model_family, updated_at_unix_ms, body) VALUES "
                                 "('H200', 2, 'llama', 1, ?)",
                                 -1, &stmt, nullptr),
              SQLITE_OK);
    const std::string body = c.SerializeAsString();
    sqlite3_bind_blob(stmt, 1, body.data(), static_cast<int>(body.size()), SQLITE_TRANSIENT);
    EXPECT_EQ(sqlite3_step(stmt), SQLITE_DONE);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  }
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  absl::StatusOr<std::optional<v1::Calibration>> c = store->GetCalibration(key);
  ASSERT_TRUE(c.ok() && c->has_value());
  EXPECT_EQ((*c)->fragmentation_factor(), 1.25);
  absl::StatusOr<std::vector<CalibrationSample>> samples = store->RecentCalibrationSamples(key, 5);
  ASSERT_TRUE(samples.ok());
  ASSERT_EQ(samples->size(), 1u);
  EXPECT_EQ((*samples)[0].measured_bytes, 120);
  EXPECT_EQ(store->Counters().corrupt_rows_skipped, 0);
}

// SQLite's max_page_count makes a real SQLITE_FULL without filling the disk.
TEST_F(SqliteStoreTest, AFullDatabaseIsResourceExhaustedNotRetryable) {
  SqliteStoreOptions options = Options();
  options.max_database_bytes = 256 << 10;
  std::unique_ptr<Store> store = Open(options);
  ASSERT_NE(store, nullptr);
  v1::StoredPlan plan;
  plan.mutable_request()->mutable_arch()->set_name(std::string(20000, 'x'));
  absl::Status failure;
  for (int i = 0; i < 100 && failure.ok(); ++i) failure = store->PutPlan(plan).status();
  ASSERT_FALSE(failure.ok()) << "256 KiB never filled";
  EXPECT_TRUE(absl::IsResourceExhausted(failure)) << failure;
  EXPECT_THAT(std::string(failure.message()), HasSubstr("full"));
  // The failed write rolled back; the store still reads.
  EXPECT_TRUE(store->ListPlans(0, "").ok());
}

TEST_F(SqliteStoreTest, RetentionRunsAtOpenOverAnExistingFile) {
  SqliteStoreOptions keep_all = Options();
  keep_all.plan_retention.max_plans = 0;
  keep_all.plan_retention.max_age_seconds = 0;
  std::vector<std::string> ids;
  {
    std::unique_ptr<Store> store = Open(keep_all);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 10; ++i) ids.push_back(AddPlan(*store));
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(ids[0], 1)).ok());
  }
  SqliteStoreOptions capped = Options();
  capped.plan_retention.max_plans = 3;
  std::unique_ptr<Store> store = Open(capped);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->Counters().plans_expired, 6);
  absl::StatusOr<ListPlansPage> page = store->ListPlans(0, "");
  ASSERT_TRUE(page.ok());
  std::vector<std::string> left;
  for (const v1::StoredPlan& p : page->plans) left.push_back(p.plan_id());
  EXPECT_EQ(left, (std::vector<std::string>{ids[9], ids[8], ids[7], ids[0]}))
      << "the newest three and the measured one";
}

// Issue 27: 150 plans of 3 MiB made one ListPlans(1000) answer 9.5 MB, over gRPC's 4 MiB.
TEST_F(SqliteStoreTest, ListPlansPagesStayUnderGrpcsDefaultMessageSize) {
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  v1::StoredPlan plan;
  plan.mutable_request()->mutable_arch()->set_name(std::string(600 << 10, 'n'));
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(store->PutPlan(plan).ok());
  std::string token;
  int seen = 0;
  int pages = 0;
  do {
    absl::StatusOr<ListPlansPage> page = store->ListPlans(kMaxListPlansPageSize, token);
    ASSERT_TRUE(page.ok()) << page.status();
    v1::ListPlansResponse response;
    for (v1::StoredPlan& p : page->plans) {
      p.mutable_response()->set_plan_id(p.plan_id());  // what PlannerCore adds
      *response.add_plans() = p;
    }
    response.set_next_page_token(page->next_page_token);
    EXPECT_LT(response.ByteSizeLong(), size_t{4} << 20);
    EXPECT_FALSE(page->plans.empty());
    seen += page->plans.size();
    token = page->next_page_token;
    ++pages;
  } while (!token.empty() && pages < 20);
  EXPECT_EQ(seen, 12);
  EXPECT_EQ(pages, 3);  // 5 + 5 + 2 under the 3 MiB default
}

TEST_F(SqliteStoreTest, ForeignKeyProtectsMeasurements) {
  { ASSERT_NE(Open(), nullptr); }
  // Even a writer that bypasses the store's own check cannot orphan a measurement.
  RawDb raw(path_);
  raw.Exec("PRAGMA foreign_keys = ON");
  const int rc = raw.ExecRc(
      "INSERT INTO measurements (measurement_id, plan_id, measured_at_unix_ms, body) "
      "VALUES ('m', 'no-such-plan', 1, x'')");
  EXPECT_EQ(rc & 0xff, SQLITE_CONSTRAINT);
}

// [Durability] in sqlite_store.cc: a child process acknowledges measurements one by one through
// a pipe and is SIGKILLed at a random point; every acknowledged id must be in the file.
TEST_F(SqliteStoreTest, AcknowledgedMeasurementsSurviveKill9) {
  std::string plan;
  {
    std::unique_ptr<Store> store = Open();
    ASSERT_NE(store, nullptr);
    plan = AddPlan(*store);
  }
  std::random_device device;
  const unsigned seed = device();
  std::mt19937 rng(seed);
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::set<std::string> acknowledged;
  for (int round = 0; round < 3; ++round) {
    const int kill_after = std::uniform_int_distribution<int>(1, 60)(rng);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(fds[0]);
      SqliteStoreOptions options;
      options.path = path_;
      absl::StatusOr<std::unique_ptr<Store>> store = OpenSqliteStore(options);
      if (!store.ok()) _exit(2);
      for (int i = 0; i < 100000; ++i) {
        absl::StatusOr<std::string> id = (*store)->PutMeasurement(MeasurementFor(plan, i));
        if (!id.ok()) _exit(3);
        const std::string line = *id + "\n";
        if (write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(4);
      }
      _exit(0);
    }
    close(fds[1]);
    std::string buffer;
    char chunk[256];
    int lines = 0;
    bool killed = false;
    while (true) {
      const ssize_t n = read(fds[0], chunk, sizeof(chunk));
      if (n <= 0) break;  // EOF once the child is dead and the pipe drained
      buffer.append(chunk, n);
      size_t newline;
      while ((newline = buffer.find('\n')) != std::string::npos) {
        acknowledged.insert(buffer.substr(0, newline));
        buffer.erase(0, newline + 1);
        ++lines;
      }
      if (!killed && lines >= kill_after) {
        ASSERT_EQ(kill(child, SIGKILL), 0);
        killed = true;
      }
    }
    close(fds[0]);
    int wstatus = 0;
    ASSERT_EQ(waitpid(child, &wstatus, 0), child);
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
        << "child exited on its own with " << wstatus;
  }
  ASSERT_FALSE(acknowledged.empty());

  std::unique_ptr<Store> store = Open();  // recovers the WAL left by the killed writer
  ASSERT_NE(store, nullptr);
  RawDb raw(path_);
  const std::set<std::string> stored = raw.Column("SELECT measurement_id FROM measurements");
  for (const std::string& id : acknowledged) EXPECT_TRUE(stored.contains(id)) << id;
  absl::StatusOr<int64_t> count = store->CountMeasurements();
  ASSERT_TRUE(count.ok());
  // At most one put per round was committed but not yet acknowledged when the kill landed.
  EXPECT_GE(*count, static_cast<int64_t>(acknowledged.size()));
  EXPECT_LE(*count, static_cast<int64_t>(acknowledged.size()) + 3);
}

// ASan's shadow memory and quarantine inflate RSS several times; the budget is checked in
// normal builds only.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kUnderSanitizer = true;
#else
constexpr bool kUnderSanitizer = false;
#endif
#else
constexpr bool kUnderSanitizer = false;
#endif

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// Issue 2: the planner stays under 200 MB RSS with 100 000 stored measurements. Inserts them in
// big transactions, then runs the queries the daemon serves; prints timings (not asserted).
TEST_F(SqliteStoreTest, HundredThousandMeasurementsStayWithinMemory) {
  std::unique_ptr<Store> store = Open();
  ASSERT_NE(store, nullptr);
  std::vector<std::string> plans;
  for (int i = 0; i < 100; ++i) plans.push_back(AddPlan(*store));

  constexpr int kTotal = 100000;
  constexpr int kBatch = 10000;
  const auto start = std::chrono::steady_clock::now();
  for (int done = 0; done < kTotal; done += kBatch) {
    std::vector<v1::Measurement> batch;
    batch.reserve(kBatch);
    for (int i = done; i < done + kBatch; ++i) {
      batch.push_back(MeasurementFor(plans[i % plans.size()], int64_t{40} << 30 | i));
    }
    absl::StatusOr<std::vector<std::string>> ids = store->PutMeasurements(batch);
    ASSERT_TRUE(ids.ok()) << ids.status();
    ASSERT_EQ(ids->size(), static_cast<size_t>(kBatch));
  }
  const double batch_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  constexpr int kSingles = 100;
  const auto single_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSingles; ++i) {
    ASSERT_TRUE(store->PutMeasurement(MeasurementFor(plans[0], i)).ok());
  }
  const double single_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - single_start).count();

  absl::StatusOr<int64_t> count = store->CountMeasurements();
  ASSERT_TRUE(count.ok());
  EXPECT_EQ(*count, kTotal + kSingles);
  absl::StatusOr<v1::StoredPlan> plan = store->GetPlan(plans[1]);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->measurements_size(), kTotal / 100);
  // Newest first: the last batch's measurement for plan 1 was number kTotal - 99.
  EXPECT_EQ(plan->measurements(0).peak_reserved_bytes(), int64_t{40} << 30 | (kTotal - 99));
  plan = store->GetPlan(plans[0]);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->measurements_size(), 1000);  // capped at max_measurements_per_plan
  absl::StatusOr<ListPlansPage> page = store->ListPlans(kMaxListPlansPageSize, "");
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->plans.size(), plans.size());

  const int64_t peak_rss_bytes = PeakRssBytes();
  EXPECT_GT(peak_rss_bytes, 0);
  if (!kUnderSanitizer) {
    EXPECT_LT(peak_rss_bytes, int64_t{200} << 20);
  }
  std::cout << "[figures] 100000 measurements in 10 transactions: " << batch_seconds << " s ("
            << kTotal / batch_seconds
            << "/s); PutMeasurement one at a time (fsync each): " << kSingles / single_seconds
            << "/s; file " << std::filesystem::file_size(path_) / (1 << 20) << " MiB; peak RSS "
            << peak_rss_bytes / (1 << 20) << " MiB\n";
}

}  // namespace
}  // namespace memplan
